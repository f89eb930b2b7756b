"""The edgeq target agent: shipped to the target as one zipapp, run with the target's Python 3.8+.

It uses only the standard library plus TensorRT (imported lazily, in the ``trt_*`` modules of backend
``python`` only) and imports nothing from ``edgeq``: the host and the target may run different Python
versions and the target has no edgeq installed. All imports inside this package are relative so the
same sources run as ``python -m edgeq.agent`` on the host and as ``edgeq_agent`` inside the zipapp.
"""

PROTOCOL = 1  # bump when the JSON envelope or a result's keys change incompatibly
