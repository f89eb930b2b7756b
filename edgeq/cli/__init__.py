"""The edgeq command line: each command builds an options object, calls one library function, renders
the result and maps it to an exit code (0 ok, 1 a check failed, 2 usage or input error).

The only package that imports typer and rich. ``app`` holds the root and the error handling, ``options``
the options several commands share (each declared once), ``output`` the consoles and shared renderers;
one module per area of the library holds its commands, registered in the order ``edgeq --help`` lists them.
"""

# isort: off
from edgeq.cli import graph, quantize, sensitivity, report, deploy, tune, fleet, release, rules, demo  # noqa: F401  (registers)
from edgeq.cli.app import app, main, run

# isort: on

__all__ = ["app", "main", "run"]
