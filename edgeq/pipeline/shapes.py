"""The optimization profile of a model with dynamic input dimensions: trtexec's ``--minShapes``/
``--optShapes``/``--maxShapes``, resolved once on the host before anything reaches a target.

TensorRT 8.6 builds nothing from a network with a symbolic or -1 input dimension and no profile ("Network
has dynamic or shape inputs, but no optimization profile has been defined"); many real exports are
dynamic (a batch of ``N``, a free height and width). The shapes come from the user's flags, else from
the calibration data (the shape quantize already ran the model at), and otherwise the deploy stops in one
line (exit 2) before any SSH. Where a shape gives only ``--optShapes``, min and max are the same shape (a
profile of one shape, as trtexec does); the engine is timed at ``--optShapes`` (``--shapes`` to the agent).
The syntax itself is parsed and printed in one place, ``edgeq.agent.shapes``, which the agent reads too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from edgeq.errors import EdgeqError

if TYPE_CHECKING:
    from edgeq.quant.quantize import QuantizeOptions

FLAGS = ("--minShapes", "--optShapes", "--maxShapes")


@dataclass(frozen=True)
class Shapes:
    """The three shape specs (trtexec syntax). As given: any of them, possibly none; ``resolved``: complete
    for every dynamic input of the model (all empty for a static model), ``source`` says where from."""

    min: str = ""
    opt: str = ""
    max: str = ""
    resolved: bool = False
    source: str = ""

    def __bool__(self) -> bool:
        return bool(self.min or self.opt or self.max)

    def build_args(self) -> list[str]:
        """The agent's build flags (trtexec's names); none for a static model."""
        return [f"{f}={t}" for f, t in zip(FLAGS, (self.min, self.opt, self.max)) if t]

    def run_args(self) -> list[str]:
        """The agent's profile flag: the engine runs at ``--optShapes``."""
        return [f"--shapes={self.opt}"] if self.opt else []

    def describe(self) -> str:
        if not self:
            return "static input shapes"
        same = self.min == self.opt == self.max
        shown = f"{self.opt}" if same else f"min {self.min}, opt {self.opt}, max {self.max}"
        return f"optimization profile {shown} ({self.source})"


def resolve_shapes(model: Path, given: Shapes, quantize: Optional[QuantizeOptions] = None) -> Shapes:
    """``given`` completed for ``model``'s dynamic inputs (see the module doc); ``given`` itself when it
    is resolved already. Raises ``EdgeqError`` (exit 2) on flags that do not fit the model, and on a
    dynamic input with no shape to use."""
    if given.resolved:
        return given
    from edgeq.agent.shapes import format_shapes, parse_shapes
    from edgeq.graph.io import load_model
    from edgeq.quant.data.inputs import input_specs

    onnx_model = load_model(model)
    specs = input_specs(onnx_model)
    dims = {s.name: s.shape for s in specs}
    try:
        lo, mid, hi = (dict(parse_shapes(t, f[2:])) for t, f in zip((given.min, given.opt, given.max), FLAGS))
    except ValueError as e:
        raise EdgeqError(str(e), "trtexec's syntax: name:1x3x224x224,other:1x10") from None
    for shapes, flag in zip((lo, mid, hi), FLAGS):
        for name in shapes:
            if name not in dims:
                raise EdgeqError(f"{flag} names '{name}', which is not an input of {Path(model).name}",
                                 f"its inputs: {', '.join(dims)}")  # fmt: skip
            if None not in dims[name] and dims[name]:
                raise EdgeqError(f"{flag} names '{name}', whose shape is static {_x(dims[name])}",
                                 "give shapes for dynamic inputs only")  # fmt: skip
    dynamic = [s for s in specs if None in s.shape or not s.shape]
    if not dynamic:
        return Shapes(resolved=True, source="static")
    sample = _calibration_shapes(onnx_model, quantize, [s.name for s in dynamic if s.name not in mid])
    sources = {"calibration data" if s.name not in mid else "--optShapes" for s in dynamic}
    opts: dict[str, tuple[int, ...]] = {}
    for s in dynamic:
        opt = mid.get(s.name) or sample.get(s.name)
        if opt is None:
            example = f"{s.name}:{_example(onnx_model, s.name)}"
            raise EdgeqError(
                f"{Path(model).name}: input '{s.name}' has dynamic dimensions {s.describe()} and no shape to "
                "build the engine for", f"give {FLAGS[1]} {example} (trtexec syntax; {FLAGS[0]}/{FLAGS[2]} "
                "for a range), or --calib data of that shape")  # fmt: skip
        opts[s.name] = tuple(opt)
    out = [{s.name: tuple(given_.get(s.name, opts[s.name])) for s in dynamic} for given_ in (lo, mid, hi)]
    for s in dynamic:
        for shape, flag in zip((x[s.name] for x in out), FLAGS):
            if s.shape and (len(shape) != len(s.shape) or any(w is not None and d != w
                                                              for d, w in zip(shape, s.shape))):
                raise EdgeqError(f"{flag} {s.name}:{_x(shape)} does not fit the input's shape {s.describe()}",
                                 "same rank, equal where the input is static")  # fmt: skip
        a, b, c = (x[s.name] for x in out)
        if len({len(a), len(b), len(c)}) > 1 or any(p > q for p, q in [*zip(a, b), *zip(b, c)]):
            raise EdgeqError(f"input '{s.name}': the shapes must grow from {FLAGS[0]} {_x(a)} to "
                             f"{FLAGS[1]} {_x(b)} to {FLAGS[2]} {_x(c)}")  # fmt: skip
    lo_text, opt_text, hi_text = (format_shapes(x) for x in out)
    return Shapes(lo_text, opt_text, hi_text, resolved=True, source=" and ".join(sorted(sources)))


def _calibration_shapes(model: object, quantize: Optional[QuantizeOptions], names: list[str]
                        ) -> dict[str, tuple[int, ...]]:  # fmt: skip
    """The shape of each named input in the first calibration sample (what quantize runs the model at);
    empty without calibration data or without names."""
    if not names or quantize is None or not quantize.has_data:
        return {}
    from edgeq.quant.data.dataset import calibration_set

    data = calibration_set(model, quantize.calib, synthetic=quantize.synthetic,  # type: ignore[arg-type]
                           preprocess=quantize.preprocess, limit=1)  # fmt: skip
    first = next(iter(data), {})
    return {name: tuple(int(d) for d in first[name].shape) for name in names if name in first}


def _x(dims: tuple[Optional[int], ...]) -> str:
    return "x".join("?" if d is None else str(d) for d in dims)


def _example(model: object, name: str) -> str:
    """The input's dimensions as the export names them (``Nx3xHxW``): what the user fills in."""
    for vi in model.graph.input:  # type: ignore[attr-defined]
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            return "x".join(str(d.dim_value) if d.dim_value > 0 else (d.dim_param or "N") for d in dims)
    return "1x3x224x224"
