"""``infer``: run an engine on the held-out inputs the host shipped and write its outputs back, so the
host can score TensorRT's own arithmetic (its INT8 kernels are not onnxruntime's) against FP32.

Both backends share this part: reading the inputs (one ``.npz``, samples stacked on axis 0), checking
each sample against the engine's input bindings, and the loop over samples; a backend supplies the
bindings and one ``execute(sample) -> {output: bytes}``. One sample is one engine execution: the host
stacks samples in the model's own input shape (its batch included), which is the engine's static shape.
"""

from .arrays import TRT_TYPES, ArrayError, for_binding, read_npz, stack, write_npz
from .common import AgentError


class Binding:
    """One engine I/O tensor as ``infer`` needs it: name, shape, TensorRT type name, input or output."""

    __slots__ = ("is_input", "name", "shape", "trt_type")

    def __init__(self, name, shape, trt_type, is_input):
        self.name = name
        self.shape = tuple(int(d) for d in shape)
        self.trt_type = trt_type
        self.is_input = is_input

    @property
    def nbytes(self):
        n = TRT_TYPES[self.trt_type][1]
        for d in self.shape:
            n *= d
        return n


def load_inputs(path):
    """The host's stacked inputs, ``{name: Array}``, all with one sample count."""
    try:
        inputs = read_npz(path)
    except ArrayError as e:
        raise AgentError("input", str(e)) from None
    if not inputs:
        raise AgentError("input", "%s holds no arrays" % path)
    counts = {name: (a.shape[0] if a.shape else None) for name, a in inputs.items()}
    if len(set(counts.values())) != 1 or None in counts.values():
        raise AgentError("input", "%s: the inputs differ in sample count: %s" % (path, counts))
    return inputs


def samples_for(bindings, inputs):
    """Per sample, ``{input name: bytes}`` in each binding's type; every engine input must be there, in
    the engine's shape (``AgentError`` stage "input" naming the first mismatch)."""
    feeds = None
    for b in (b for b in bindings if b.is_input):
        if b.name not in inputs:
            raise AgentError("input", "the engine's input %r is not in the held-out data (it has %s)"
                             % (b.name, ", ".join(sorted(inputs))))
        arr = inputs[b.name]
        if tuple(arr.shape[1:]) != b.shape:
            raise AgentError("input", "input %r: held-out samples of shape %s, the engine takes %s"
                             % (b.name, list(arr.shape[1:]), list(b.shape)))
        try:
            arr = for_binding(arr, b.trt_type, b.name)
        except ArrayError as e:
            raise AgentError("input", str(e)) from None
        chunks = arr.samples()
        if feeds is None:
            feeds = [{} for _ in chunks]
        for feed, chunk in zip(feeds, chunks):
            feed[b.name] = chunk
    if feeds is None:
        raise AgentError("input", "the engine has no inputs to feed")
    return feeds


def run_samples(bindings, feeds, execute, log=None):
    """``execute(feed) -> {output name: bytes}`` once per sample, in order; the outputs stacked per
    binding as ``{name: Array}`` in the binding's type (``TRT_TYPES``)."""
    outputs = [b for b in bindings if not b.is_input]
    chunks = {b.name: [] for b in outputs}
    for i, feed in enumerate(feeds):
        got = execute(feed)
        for b in outputs:
            data = got.get(b.name)
            if data is None or len(data) != b.nbytes:
                raise AgentError("infer", "sample %d: output %r came back with %s bytes, expected %d"
                                 % (i, b.name, "no" if data is None else len(data), b.nbytes))
            chunks[b.name].append(data)
        if log is not None:
            log.write("[I] infer: sample %d/%d done" % (i + 1, len(feeds)))
    return {b.name: stack(TRT_TYPES[b.trt_type][0], b.shape, chunks[b.name]) for b in outputs}


def write_outputs(path, outputs):
    try:
        write_npz(path, outputs)
    except OSError as e:
        raise AgentError("output", "cannot write %s: %s" % (path, e.strerror or e)) from None


def result(path, outputs, samples, **extra):
    """The reply: where the outputs are, how many samples, each output's shape and type."""
    return dict(
        outputs_npz=path,
        samples=samples,
        outputs={name: {"shape": list(a.shape), "dtype": a.descr} for name, a in outputs.items()},
        **extra,
    )
