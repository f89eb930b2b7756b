"""Input shapes in trtexec 8.6's syntax (samples/common/sampleOptions.cpp, ``--minShapes``/``--optShapes``/
``--maxShapes`` when building, ``--shapes`` when running an engine): ``name:1x3x224x224,other:1x10``, a
name that holds ``:`` quoted (``'input:0':1x3x224x224``).

The one parser and printer of that syntax: the agent's two backends read it (trtexec gets the strings as
they are, the Python backend turns them into an optimization profile), and the host writes it. Standard
library only, like the rest of the agent.
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


def profile_shapes(inputs, min_text, opt_text, max_text):
    """The optimization profile of a network: ``[(name, min, opt, max)]`` for each input with a dynamic
    (-1) dimension. ``inputs``: ``[(name, dims)]`` as the parsed network has them. Every dynamic input
    needs all three shapes, of its rank, equal to it where it is static, min <= opt <= max; a name that is
    no dynamic input is an error (as trtexec's). ValueError says which."""
    given = [dict(parse_shapes(t, f)) for t, f in zip((min_text, opt_text, max_text), BUILD_FLAGS)]
    dims = dict((name, tuple(int(d) for d in shape)) for name, shape in inputs)
    dynamic = [name for name, shape in inputs if any(int(d) < 0 for d in shape)]
    for shapes, flag in zip(given, BUILD_FLAGS):
        for name in shapes:
            if name not in dims:
                raise ValueError("--%s names %r, which is not an input of the network (%s)"
                                 % (flag, name, ", ".join(dims) or "none"))
            if name not in dynamic:
                raise ValueError("--%s names %r, whose shape is static (%s)" % (flag, name, _x(dims[name])))
    out = []
    for name in dynamic:
        missing = [f for shapes, f in zip(given, BUILD_FLAGS) if name not in shapes]
        if missing:
            raise ValueError("input %r has dynamic dimensions (%s) and no --%s for it: the engine needs an "
                             "optimization profile" % (name, _x(dims[name]), "/--".join(missing)))
        lo, mid, hi = (shapes[name] for shapes in given)
        want = dims[name]
        for shape, flag in zip((lo, mid, hi), BUILD_FLAGS):
            if len(shape) != len(want) or any(w >= 0 and s != w for s, w in zip(shape, want)):
                raise ValueError("--%s %s:%s does not fit the input's shape %s"
                                 % (flag, name, _x(shape), _x(want)))
        if any(a > b for a, b in zip(lo, mid)) or any(a > b for a, b in zip(mid, hi)):
            raise ValueError("input %r: the shapes must grow from --minShapes %s to --optShapes %s to "
                             "--maxShapes %s" % (name, _x(lo), _x(mid), _x(hi)))
        out.append((name, lo, mid, hi))
    return out


def _x(dims):
    return "x".join("?" if int(d) < 0 else str(int(d)) for d in dims)


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
