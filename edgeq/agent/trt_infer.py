"""``infer`` for backend ``python``: the engine run on each held-out sample through TensorRT's I/O
tensor API (8.5+: ``set_tensor_address``, ``execute_async_v3``) on device buffers from ``trt_cuda``,
inputs copied in and outputs copied out with synchronous ``cudaMemcpy``.

The loop, the input checks, the groups of samples by shape and the output files are ``infer``'s, shared
with the trtexec backend; here are only the bindings TensorRT reports at a group's shapes
(``set_input_shape``, then ``get_tensor_shape`` for the outputs) and one execution. The engine is
deserialized once per ``infer``; each tensor gets one device buffer, the size its largest group needs.
"""

import time

from . import infer as shared
from .arrays import TRT_TYPES
from .common import AgentError
from .trt_common import first_error, load_tensorrt, make_logger
from .trt_cuda import open_cuda
from .trt_engine import create_context, load_engine
from .trt_profile import set_input_shapes, type_name


def engine_bindings(trt, engine, context):
    """The engine's I/O tensors as ``infer.Binding``s at the context's shapes (dynamic inputs set from
    ``--shapes`` first); ``AgentError`` for one it cannot feed or read as a plain array (a dynamic shape
    left unset, a vectorized format, FP8)."""
    bindings = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        shape = [int(d) for d in context.get_tensor_shape(name)]
        kind = "input" if is_input else "output"
        if any(d < 0 for d in shape):
            raise AgentError("infer", "%s %r has a dynamic shape %s: give its shape with --shapes"
                             % (kind, name, shape))
        trt_type = type_name(engine.get_tensor_dtype(name))
        if TRT_TYPES.get(trt_type, (None,))[0] is None:
            raise AgentError("infer", "%s %r is %s, which has no array type" % (kind, name, trt_type))
        vectorized = engine.get_tensor_vectorized_dim(name)
        if vectorized is not None and vectorized >= 0 and engine.get_tensor_components_per_element(name) > 1:
            raise AgentError("infer", "%s %r has a vectorized format; build the engine with linear I/O"
                             % (kind, name))
        bindings.append(shared.Binding(name, shape, trt_type, is_input))
    return bindings


def infer(args, log):
    groups = shared.load_groups(args.loadInputs, args.shapes)
    trt = load_tensorrt()
    logger = make_logger(trt, log, getattr(args, "verbose", False))
    cuda = open_cuda()  # before the Runtime: one CUDA context for the engine and the buffers
    _runtime, engine = load_engine(trt, logger, log, args.loadEngine, args.useDLACore, "infer")
    context = create_context(engine, log, "infer")

    def bindings_at(shapes):  # the context at this group's shapes; outputs sized by TensorRT at them
        set_input_shapes(trt, engine, context, shapes)
        return engine_bindings(trt, engine, context)

    plans = shared.plan_groups(groups, bindings_at)
    pointers = {}
    for name, nbytes in shared.largest(plans).items():  # one buffer per tensor, the largest group's size
        pointers[name] = cuda.alloc(max(1, nbytes))
        if not context.set_tensor_address(name, pointers[name]):
            raise AgentError("infer", "set_tensor_address(%r) failed" % name)

    def execute(bindings, feed):
        for b in bindings:
            if b.is_input:
                cuda.upload(pointers[b.name], feed[b.name])
        mark = log.mark()
        if not context.execute_async_v3(cuda.handle):  # stream handle as an int (pyCore.cpp: size_t)
            raise AgentError("infer", first_error(log, "execute_async_v3 failed", mark), log=log.tail())
        cuda.sync()
        return {b.name: cuda.download(pointers[b.name], b.nbytes) for b in bindings if not b.is_input}

    started = time.perf_counter()
    outputs = shared.grouped(shared.run_groups(plans, bindings_at, execute, log))
    shared.write_outputs(args.exportOutput, outputs)
    samples = sum(len(feeds) for _, _, feeds in plans)
    return shared.result(args.exportOutput, outputs, samples, cuda=cuda.name,
                         seconds=round(time.perf_counter() - started, 3), tensorrt=trt.__version__)
