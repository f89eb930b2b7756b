"""Backend ``python``: the commands ``__main__`` calls (``probe`` here, the others from the ``trt_*``
modules), which are the only modules that import TensorRT (8.6) and a CUDA binding (cuda-python or
pycuda when installed, else libcudart through ctypes, which JetPack always has).

``trt_common``: importing TensorRT, logger, Builder, atomic writes; ``trt_build`` and
``trt_calibrator``: ``build``; ``trt_engine``: loading an engine, ``inspect``; ``trt_profile`` and
``trt_cuda``: ``profile`` on device buffers; ``trt_infer``: ``infer`` on them.

Every TensorRT call in them is checked against the TensorRT 8.5/8.6 Python bindings
(NVIDIA/TensorRT ``python/src/infer/pyCore.cpp``, ``pyInt8.cpp``, ``parsers/pyOnnx.cpp``) and the
8.6 Python API reference; the comment next to a call names what it relies on. Only the I/O tensor API
of 8.5+ is used (``num_io_tensors``, ``get_tensor_*``, ``set_tensor_address``,
``execute_async_v3``): the binding-index API (``get_binding_shape``, ``get_binding_dtype``, ...) is
deprecated since 8.5 (pyCore.cpp wraps it in ``utils::deprecateMember``), ``execute_async_v2`` is gone
in TensorRT 10, and a tensor bound by name cannot land in the wrong slot of a bindings list.

Imports are lazy: ``trt_common.load_tensorrt`` turns a missing or broken installation into a structured
``AgentError(stage="import")`` so ``probe`` reports it as data. numpy is never needed: buffer sizes
come from ``DataType.itemsize`` (8.6 Python API, ``tensorrt.DataType``).

Engines of models with dynamic input dimensions are built for one optimization profile (``--minShapes``/
``--optShapes``/``--maxShapes``, ``shapes``) and timed at ``--shapes``.
"""

from .common import AgentError
from .trt_build import build
from .trt_common import create_builder, load_tensorrt, make_logger
from .trt_engine import inspect
from .trt_infer import infer
from .trt_profile import profile

__all__ = ["build", "infer", "inspect", "probe", "profile"]


def probe(log):
    trt = load_tensorrt()
    facts = {"version": trt.__version__}
    logger = make_logger(trt, log)  # Builder keeps it alive (pyCore.cpp: py::keep_alive<1, 2>)
    try:
        builder = create_builder(trt, logger, log)
    except AgentError as e:
        e.details = dict(e.details, tensorrt=facts)
        raise
    facts["num_DLA_cores"] = builder.num_DLA_cores
    facts["platform_has_fast_int8"] = builder.platform_has_fast_int8
    facts["platform_has_fast_fp16"] = builder.platform_has_fast_fp16
    return facts
