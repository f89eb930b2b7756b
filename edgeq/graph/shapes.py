"""The shape of each dynamic input where no data decides it: the one resolver every command calls.

A real export leaves dimensions open (``[batch, 3, height, width]``); running it (``clean``'s
verification), judging it (``lint``) or building it (``deploy``, ``fleet``: through
``edgeq.pipeline.shapes``, which puts the calibration and held-out data first) needs numbers. In order:

1. ``--shapes`` (trtexec's syntax, ``images:1x3x320x320``): the user's word wins;
2. the exporter's (``edgeq.graph.exporter``): ultralytics' ``imgsz`` from the model's metadata, PaddleOCR's
   documented default for a paddle2onnx export of its detector, recogniser or classifier;
3. nothing: the input is ``missing``, and every message about it carries a shape with real numbers to give
   (``shapes_hint``), never the export's symbolic names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgeq.errors import EdgeqError

if TYPE_CHECKING:
    import onnx

Dims = tuple[Any, ...]  # a dimension: int where fixed, the export's name (str) or None where open


@dataclass(frozen=True)
class InputShapes:
    """``shapes``: one full shape for each dynamic input something resolved, ``sources`` where from;
    ``missing``: the dynamic inputs nothing gave a shape, with their dimensions as the model has them."""

    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    missing: dict[str, Dims] = field(default_factory=dict)

    def spec(self) -> str:
        """The resolved shapes in trtexec's syntax (``images:1x3x320x320``)."""
        from edgeq.agent.shapes import format_shapes

        return str(format_shapes(self.shapes))

    def describe(self) -> str:
        """``images:1x3x320x320 (from its metadata: ...)``, one per input."""
        return "; ".join(f"{name}:{_x(s)} ({self.sources[name]})" for name, s in self.shapes.items())


def dynamic_inputs(model: onnx.ModelProto) -> list[tuple[str, Dims]]:
    """The model's real inputs (not initializers) whose shape is open, with their dimensions."""
    from edgeq.agent.shapes import is_dynamic

    return [(name, dims) for name, dims in model_inputs(model) if is_dynamic(dims)]


def model_inputs(model: onnx.ModelProto) -> list[tuple[str, Dims]]:
    """Every real input (not an initializer) with its ``value_dims``."""
    inits = {i.name for i in model.graph.initializer}
    return [(vi.name, value_dims(vi)) for vi in model.graph.input if vi.name not in inits]


def value_dims(vi: Any) -> Dims:
    """A value's dimensions: an int where fixed, the name the export gives it, else None."""
    tt = vi.type.tensor_type
    dims = tt.shape.dim if tt.HasField("shape") else []
    return tuple(d.dim_value if d.dim_value > 0 else d.dim_param or None for d in dims)


def input_shapes(model: onnx.ModelProto, given: str = "") -> InputShapes:
    """Each dynamic input's shape: ``given`` (``--shapes``), else the exporter's (see the module doc).
    Raises ``EdgeqError`` (exit 2) when ``given`` does not fit the model."""
    from edgeq.graph.exporter import identify

    dynamic = dynamic_inputs(model)
    flagged = parse_given(model, given)
    export = identify(model) if len(flagged) < len(dynamic) else None
    shapes: dict[str, tuple[int, ...]] = {}
    sources: dict[str, str] = {}
    missing: dict[str, Dims] = {}
    for name, dims in dynamic:
        if name in flagged:
            shapes[name], sources[name] = flagged[name], "--shapes"
        elif export is not None and name in export.shapes:
            shapes[name], sources[name] = export.shapes[name], f"from {export.why}"
        else:
            missing[name] = dims
    return InputShapes(shapes, sources, missing)


def parse_given(model: onnx.ModelProto, given: str, flag: str = "shapes") -> dict[str, tuple[int, ...]]:
    """``--shapes`` checked against the model: each name a dynamic input, each shape of its rank and equal
    to it where it is fixed. One line (exit 2) naming the flag and the input otherwise."""
    from edgeq.agent.shapes import describe_dims, parse_shapes

    try:
        parsed = dict(parse_shapes(given, flag))
    except ValueError as e:
        raise EdgeqError(str(e), "trtexec's syntax: name:1x3x224x224,other:1x10") from None
    inputs = dict(model_inputs(model))
    dynamic = dict(dynamic_inputs(model))
    for name, shape in parsed.items():
        if name not in inputs:
            raise EdgeqError(f"--{flag} names '{name}', which is not an input of the model",
                             f"its inputs: {', '.join(inputs) or 'none'}")
        if name not in dynamic:
            raise EdgeqError(f"--{flag} names '{name}', whose shape is static {describe_dims(inputs[name])}",
                             "give shapes for dynamic inputs only")
        dims = dynamic[name]
        fixed_differ = any(isinstance(d, int) and d != s for d, s in zip(dims, shape))
        if dims and (len(shape) != len(dims) or fixed_differ):
            raise EdgeqError(f"--{flag} {name}:{_x(shape)} does not fit the input's shape "
                             f"{describe_dims(dims)}", "same rank, equal where the input is static")
    return parsed


def example(dims: Dims) -> tuple[int, ...]:
    """A shape with real numbers for an input the model leaves open, to show in a fix: fixed dimensions as
    they are, the batch 1, an image's height and width 224 (a 4-D input with 1 or 3 channels), others 1."""
    image = len(dims) == 4 and dims[1] in (1, 3)
    out = []
    for i, d in enumerate(dims):
        if isinstance(d, int) and d > 0:
            out.append(d)
        else:
            out.append(224 if image and i >= 2 else 1)
    return tuple(out)


def shapes_hint(missing: dict[str, Dims], flag: str = "--shapes") -> str:
    """How to give the missing inputs a shape: the flag with real numbers (the input's own size to put in)."""
    from edgeq.agent.shapes import format_shapes

    spec = format_shapes([(name, example(dims) if dims else (1,)) for name, dims in missing.items()])
    return f"give {flag} {spec} with the size the model runs at (trtexec syntax)"


def _x(dims: tuple[int, ...]) -> str:
    return "x".join(str(int(d)) for d in dims)
