"""``infer``: run an engine on the held-out inputs the host shipped and write its outputs back, so the
host can score TensorRT's own arithmetic (its INT8 kernels are not onnxruntime's) against FP32.

Both backends share this part: reading the inputs (one ``.npz``, samples stacked on axis 0), checking
each sample against the engine's input bindings, and the loop over samples; a backend supplies the
bindings and one ``execute(sample) -> {output: bytes}``. One sample is one engine execution: the host
stacks samples in the model's own input shape (its batch included).

Groups: an engine with dynamic inputs runs each sample at its own shape within its optimization profile
(an OCR recogniser's text lines each have their own width). Samples of different shapes cannot be
stacked, so the host groups them by shape: ``--shapes`` once per group (trtexec syntax, the group's
dynamic inputs), and in the ``.npz`` each group's arrays as ``<group number>/<input name>``; the outputs
come back the same way. One ``--shapes`` (or none, a static engine) is one group, its arrays named by
the inputs alone. The engine is loaded once; each group sets its shapes, then runs its samples.
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
    return _one_count(_read(path), path)


def load_groups(path, shapes=None):
    """``[(shapes text or None, {name: Array})]``: the host's inputs per group, one group per ``--shapes``
    (``shapes``: the list of them, in group order; none or one: the whole file is one group)."""
    shapes = list(shapes or [])
    if len(shapes) <= 1:
        return [(shapes[0] if shapes else None, load_inputs(path))]
    groups = [{} for _ in shapes]
    for key, arr in _read(path).items():
        k, sep, name = key.partition("/")
        if not sep or not k.isdigit() or int(k) >= len(shapes) or not name:
            raise AgentError("input", "%s: array %r is in none of the %d groups of --shapes (arrays of a "
                             "group are named <group>/<input>)" % (path, key, len(shapes)))
        groups[int(k)][name] = arr
    for k, group in enumerate(groups):
        if not group:
            raise AgentError("input", "%s holds no arrays for group %d (--shapes %s)" % (path, k, shapes[k]))
    return [(s, _one_count(g, "%s group %d" % (path, k))) for k, (s, g) in enumerate(zip(shapes, groups))]


def _read(path):
    try:
        inputs = read_npz(path)
    except ArrayError as e:
        raise AgentError("input", str(e)) from None
    if not inputs:
        raise AgentError("input", "%s holds no arrays" % path)
    return inputs


def _one_count(inputs, what):
    counts = {name: (a.shape[0] if a.shape else None) for name, a in inputs.items()}
    if len(set(counts.values())) != 1 or None in counts.values():
        raise AgentError("input", "%s: the inputs differ in sample count: %s" % (what, counts))
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


def run_samples(bindings, feeds, execute, log=None, done=0, total=None):
    """``execute(feed) -> {output name: bytes}`` once per sample, in order; the outputs stacked per
    binding as ``{name: Array}`` in the binding's type (``TRT_TYPES``). ``done``/``total``: the samples
    before these and in all groups, for the messages."""
    outputs = [b for b in bindings if not b.is_input]
    chunks = {b.name: [] for b in outputs}
    total = len(feeds) if total is None else total
    for i, feed in enumerate(feeds, start=done):
        got = execute(feed)
        for b in outputs:
            data = got.get(b.name)
            if data is None or len(data) != b.nbytes:
                raise AgentError("infer", "sample %d: output %r came back with %s bytes, expected %d"
                                 % (i, b.name, "no" if data is None else len(data), b.nbytes))
            chunks[b.name].append(data)
        if log is not None:
            log.write("[I] infer: sample %d/%d done" % (i + 1, total))
    return {b.name: stack(TRT_TYPES[b.trt_type][0], b.shape, chunks[b.name]) for b in outputs}


def plan_groups(groups, bindings_at):
    """``[(shapes, bindings, feeds)]`` per group: ``bindings_at(shapes)`` sets the engine to run at the
    group's shapes and returns its bindings there (outputs sized at them); the group's samples are
    checked against those (``samples_for``). All groups are checked before any sample runs."""
    plans = []
    for shapes, inputs in groups:
        bindings = bindings_at(shapes)
        plans.append((shapes, bindings, samples_for(bindings, inputs)))
    return plans


def largest(plans):
    """``{tensor name: bytes}``: the most any group needs, so one device buffer per tensor serves all."""
    out = {}
    for _, bindings, _ in plans:
        for b in bindings:
            out[b.name] = max(out.get(b.name, 0), b.nbytes)
    return out


def run_groups(plans, bindings_at, execute, log=None):
    """Each group's samples in order, the engine set to the group's shapes first (``bindings_at``);
    ``execute(bindings, feed) -> {output: bytes}``. Per group, its outputs ``{name: Array}``."""
    total = sum(len(feeds) for _, _, feeds in plans)
    out, done = [], 0
    for shapes, bindings, feeds in plans:
        if len(plans) > 1:
            bindings_at(shapes)
        out.append(run_samples(bindings, feeds, lambda feed, b=bindings: execute(b, feed), log, done, total))
        done += len(feeds)
    return out


def array_key(group, name, groups):
    """An array's name in the inputs or outputs file: the tensor's own for one group, else
    ``<group>/<tensor>`` (``load_groups`` reads it back; the host writes and reads the same)."""
    return name if groups == 1 else "%d/%s" % (group, name)


def grouped(outputs):
    """The outputs file's arrays from per-group outputs, named by ``array_key`` (as the inputs were)."""
    n = len(outputs)
    return {array_key(k, name, n): a for k, group in enumerate(outputs) for name, a in group.items()}


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
