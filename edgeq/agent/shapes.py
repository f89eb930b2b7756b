"""Input shapes in trtexec 8.6's syntax (samples/common/sampleOptions.cpp, ``--minShapes``/``--optShapes``/
``--maxShapes`` when building, ``--shapes`` when running an engine): ``name:1x3x224x224,other:1x10``, a
name that holds ``:`` quoted (``'input:0':1x3x224x224``).

The one parser and printer of that syntax: the agent's two backends read it (trtexec gets the strings as
they are, the Python backend turns them into an optimization profile), and the host writes it. Also the
one rule for an optimization profile and its messages (``profile_shapes``): the host checks the user's
shapes against the ONNX model with it before any SSH, the Python backend against the parsed network.
Standard library only, like the rest of the agent, so the host imports it and never the other way.
"""

BUILD_FLAGS = ("minShapes", "optShapes", "maxShapes")


def parse_shapes(text, flag="shapes"):
    """``"a:1x3x8x8,b:2"`` -> ``[("a", (1, 3, 8, 8)), ("b", (2,))]``; ValueError naming ``--flag``."""
    out = []
    for item in _split(text or ""):
        item = item.strip()
        if not item:
            continue
        name, sep, dims = item.rpartition(":")
        if not sep or not name:
            raise ValueError("--%s %r: expected name:DxDx..., e.g. input:1x3x224x224" % (flag, item))
        if len(name) >= 2 and name[0] == name[-1] == "'":
            name = name[1:-1]
        try:
            shape = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            why = "dimensions must be whole numbers separated by x"
            raise ValueError("--%s %r: %s" % (flag, item, why)) from None
        if any(d < 1 for d in shape):
            raise ValueError("--%s %r: every dimension must be at least 1" % (flag, item))
        if name in dict(out):
            raise ValueError("--%s names input %r twice" % (flag, name))
        out.append((name, shape))
    return out


def format_shapes(shapes):
    """``[(name, dims)]`` (or a dict) -> trtexec's syntax; names quoted when they hold ``:``."""
    items = shapes.items() if isinstance(shapes, dict) else shapes
    parts = []
    for name, dims in items:
        if "," in name or "'" in name:
            raise ValueError("input %r: trtexec's shape syntax cannot name a tensor with ',' or \"'\"" % name)
        shown = "'%s'" % name if ":" in name else name
        parts.append("%s:%s" % (shown, "x".join(str(int(d)) for d in dims)))
    return ",".join(parts)


class ShapeError(ValueError):
    """Shapes that do not fit the model or network: the message, and its fix (``hint``)."""

    def __init__(self, message, hint=""):
        ValueError.__init__(self, message)
        self.hint = hint


def is_dynamic(dims):
    """An input whose shape is not fixed: a dynamic dimension (-1 as TensorRT parses it; None or a symbolic
    name as an ONNX model has it) or an unknown rank (no dimensions)."""
    return not dims or not all(_fixed(d) for d in dims)


def profile_shapes(inputs, min_text, opt_text, max_text, where="the network", fill_opt=None, fill_hint="",
                   one_shape=False):  # fmt: skip
    """The optimization profile: ``[(name, min, opt, max)]`` for each input with a dynamic dimension. The
    one rule and its messages, run by the host before any SSH (``edgeq.pipeline.shapes``, over the ONNX
    model's inputs, ``where`` its file name) and by the agent's Python backend over the parsed network.

    ``inputs``: ``[(name, dims)]``, a dynamic dimension as ``is_dynamic`` reads it. Each flag names only
    dynamic inputs of ``where``. Every dynamic input needs ``--optShapes``, else ``fill_opt(names)``'s
    shape for it (the host: the calibration data's, ``fill_hint`` says so in the fix), and
    ``--minShapes``/``--maxShapes`` (``one_shape``: each defaults to its ``--optShapes``, a profile of one
    shape); each of the input's rank, equal to it where it is static, min <= opt <= max. A syntax error is a
    ValueError (``parse_shapes``); anything else a ShapeError naming the flag and the input, with its fix."""
    given = [dict(parse_shapes(t, f)) for t, f in zip((min_text, opt_text, max_text), BUILD_FLAGS)]
    dims = dict(inputs)
    dynamic = [name for name, shape in inputs if is_dynamic(shape)]
    for shapes, flag in zip(given, BUILD_FLAGS):
        for name in shapes:
            if name not in dims:
                raise ShapeError("--%s names %r, which is not an input of %s" % (flag, name, where),
                                 "its inputs: %s" % (", ".join(dims) or "none"))
            if name not in dynamic:
                raise ShapeError("--%s names %r, whose shape is static %s" % (flag, name,
                                 describe_dims(dims[name])), "give shapes for dynamic inputs only")
    lo, mid, hi = given
    unset = [name for name in dynamic if name not in mid]
    if unset and fill_opt is not None:
        filled = fill_opt(unset)
        mid = {**mid, **{name: tuple(filled[name]) for name in unset if name in filled}}
    out = []
    for name in dynamic:
        want = dims[name]
        default = mid.get(name) if one_shape else None  # one shape: min and max default to opt
        lo_, hi_ = lo.get(name, default), hi.get(name, default)
        missing = [f for shape, f in zip((lo_, mid.get(name), hi_), BUILD_FLAGS) if shape is None]
        if one_shape and name not in mid:
            missing = [BUILD_FLAGS[1]]  # min and max follow it
        if missing:
            flags = "/--".join(missing)
            raise ShapeError("input %r of %s has dynamic dimensions %s and no --%s for it: the engine needs "
                             "an optimization profile" % (name, where, describe_dims(want), flags),
                             _profile_fix(name, want, one_shape, fill_hint))
        shapes = (lo_, mid[name], hi_)
        for shape, flag in zip(shapes, BUILD_FLAGS):
            if want and (len(shape) != len(want) or any(_fixed(w) and d != w for d, w in zip(shape, want))):
                raise ShapeError("--%s %s:%s does not fit the input's shape %s"
                                 % (flag, name, _x(shape), describe_dims(want)),
                                 "same rank, equal where the input is static")
        a, b, c = shapes
        if any(p > q for p, q in zip(a, b)) or any(p > q for p, q in zip(b, c)):
            raise ShapeError("input %r: the shapes must grow from --minShapes %s to --optShapes %s to "
                             "--maxShapes %s" % (name, _x(a), _x(b), _x(c)),
                             "min <= opt <= max in every dimension")
        out.append((name, a, b, c))
    return out


def _profile_fix(name, dims, one_shape, fill_hint):
    """What to give for a dynamic input with no shape: the flag, with the input's dimensions as the model
    names them (``input:Nx3xHxW``) to fill in."""
    example = "x".join(str(d) if _fixed(d) else (d if isinstance(d, str) and d else "N") for d in dims)
    if one_shape:
        fix = "give --optShapes %s:%s (trtexec syntax; --minShapes/--maxShapes for a range)"
    else:
        fix = "give --minShapes/--optShapes/--maxShapes %s:%s (trtexec syntax)"
    return fix % (name, example or "N") + (", or %s" % fill_hint if fill_hint else "")


def describe_dims(dims):
    """An input's shape as messages show it: ``(?, 3, ?, ?)``, a dynamic dimension as ``?``."""
    return "(%s)" % ", ".join(str(d) if _fixed(d) else "?" for d in dims)


def _fixed(dim):
    return isinstance(dim, int) and dim >= 0


def _x(dims):
    return "x".join(str(int(d)) for d in dims)


def _split(text):
    """Split on commas outside single quotes (a quoted name may hold a ':')."""
    parts, cur, quoted = [], [], False
    for ch in text:
        if ch == "'":
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts
