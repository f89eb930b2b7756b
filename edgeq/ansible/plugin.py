"""What the collection's action plugins call: the board's target from its inventory variables, the host
key policy checked, the module's paths resolved, then ``edgeq.ansible.tasks``; an ``EdgeqError`` is the
task's failure, said in one line (a bug keeps its traceback, as Ansible shows it).

Kept here, not in the plugins, so the plugin files stay a few lines each and this is tested as edgeq is.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgeq.errors import EdgeqError

# The options that name a file on the machine running Ansible: relative to the directory ansible-playbook
# runs in (not the playbook's: the collection's own playbook lives inside the installed package).
PATH_OPTIONS = ("model", "prepared", "calib_cache", "dest", "previous", "bundle", "allowed_signers")
_CONNECTION_OPTIONS = ("host", "port", "remote_user", "private_key_file")


def run_action(module: str, action: Any, args: Mapping[str, Any], task_vars: Mapping[str, Any]
               ) -> dict[str, Any]:  # fmt: skip
    """Run module ``module`` (facts, engine, release) for the task's host; its result."""
    from edgeq.ansible import tasks
    from edgeq.ansible.connection import check_host_key_policy
    from edgeq.ansible.control import RunControl

    host = str(task_vars.get("inventory_hostname") or "?")
    try:
        if getattr(action._connection, "transport", None) != "local":  # local: no host key to check
            check_host_key_policy(action._connection, host)
        target = _target(action, host, task_vars)
        params = _paths(action, args)
        control = RunControl.from_env()
        check = bool(getattr(action._task, "check_mode", False))
        if module == "facts":
            return tasks.facts(action._connection, target, control)
        if module == "engine":
            return tasks.engine(action._connection, target, params, control, check)
        return tasks.release(action._connection, target, params, control, check)
    except EdgeqError as e:
        return {"failed": True, "msg": f"{host}: {e}", "exit_code": e.exit_code}


def _target(action: Any, host: str, task_vars: Mapping[str, Any]) -> Any:
    """The host's target, from its templated inventory variables and what its connection uses."""
    from edgeq.ansible.hostvars import TARGET_VAR, target_from_vars
    from edgeq.remote.targets import TOP

    wanted = {k: v for k, v in task_vars.items()
              if k == TARGET_VAR or k.startswith("ansible_") or (k.startswith("edgeq_") and k[6:] in TOP)}
    hv = {k: action._templar.template(v) for k, v in wanted.items()}
    conn: dict[str, Any] = {}
    for option in _CONNECTION_OPTIONS:
        try:
            conn[option] = action._connection.get_option(option)
        except Exception:  # this connection plugin has no such option
            continue
    source = Path(str(task_vars.get("inventory_file") or "inventory"))
    return target_from_vars(host, hv, source, conn)


def _paths(action: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    """The module's options, relative paths taken from the directory Ansible runs in."""
    base = Path.cwd()
    out = dict(args)
    for key in PATH_OPTIONS:
        if out.get(key):
            p = Path(str(out[key])).expanduser()
            out[key] = str(p if p.is_absolute() else base / p)
    return out


def preload() -> None:
    """Import what a board's task imports (edgeq.fleet.preload calls this in ansible-playbook itself, so
    the workers it forks share these modules instead of each importing them)."""
    import importlib

    for name in ("edgeq.ansible.tasks", "edgeq.ansible.staging", "edgeq.ansible.kinds",
                 "edgeq.orchestration.fleet", "edgeq.orchestration.install", "edgeq.orchestration.deploy",
                 "edgeq.pipeline.stages", "edgeq.pipeline.shapes", "edgeq.report.fusion_build",
                 "edgeq.report.gate", "edgeq.report.parse", "edgeq.report.render", "edgeq.graph.io",
                 "edgeq.remote.zipapp", "edgeq.release.bundle"):
        importlib.import_module(name)
