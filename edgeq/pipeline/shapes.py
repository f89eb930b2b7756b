"""The optimization profile of a model with dynamic input dimensions: trtexec's ``--minShapes``/
``--optShapes``/``--maxShapes``, resolved once on the host before anything reaches a target.

TensorRT 8.6 builds nothing from a network with a symbolic or -1 input dimension and no profile ("Network
has dynamic or shape inputs, but no optimization profile has been defined"); many real exports are
dynamic (a batch of ``N``, a free height and width). The shapes come from the user's flags, else from
the calibration data (the shape quantize already ran the model at), and otherwise the deploy stops in one
line (exit 2) before any SSH. Where a shape gives only ``--optShapes``, min and max are the same shape (a
profile of one shape, as trtexec does); the engine is timed at ``--optShapes`` (``--shapes`` to the agent).
The syntax, and the rule for a profile with its messages, live in one place, ``edgeq.agent.shapes``
(``profile_shapes``), which the agent runs on the target too: this module only feeds it the model's inputs
and the calibration data's shape, and turns its errors into edgeq's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.agent.shapes import BUILD_FLAGS
from edgeq.errors import EdgeqError

if TYPE_CHECKING:
    from edgeq.quant.quantize import QuantizeOptions

FLAGS = tuple(f"--{f}" for f in BUILD_FLAGS)  # trtexec's, as the agent names them


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
    from edgeq.agent.shapes import ShapeError, format_shapes, profile_shapes
    from edgeq.graph.io import load_model

    onnx_model = load_model(model)
    filled: dict[str, tuple[int, ...]] = {}

    def from_data(names: list[str]) -> dict[str, tuple[int, ...]]:
        filled.update(_calibration_shapes(onnx_model, quantize, names))
        return filled

    try:
        profile = profile_shapes(_inputs(onnx_model), given.min, given.opt, given.max, Path(model).name,
                                 fill_opt=from_data, fill_hint="--calib data of that shape",
                                 one_shape=True)  # fmt: skip
    except ShapeError as e:
        raise EdgeqError(str(e), e.hint) from None
    except ValueError as e:
        raise EdgeqError(str(e), "trtexec's syntax: name:1x3x224x224,other:1x10") from None
    if not profile:
        return Shapes(resolved=True, source="static")
    sources = {"calibration data" if name in filled else "--optShapes" for name, *_ in profile}
    lo, opt, hi = (format_shapes([(name, shapes[i]) for name, *shapes in profile]) for i in range(3))
    return Shapes(lo, opt, hi, resolved=True, source=" and ".join(sorted(sources)))


def _inputs(model: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """The model's real inputs as ``profile_shapes`` reads them: a dimension's value, else the name the
    export gives it (``N``, ``H``: what the fix shows to fill in), else None."""
    from edgeq.quant.data.inputs import input_specs

    declared = {vi.name: vi.type.tensor_type for vi in model.graph.input}
    out = []
    for spec in input_specs(model):
        tt = declared[spec.name]
        dims = tt.shape.dim if tt.HasField("shape") else []
        out.append((spec.name, tuple(d.dim_value if d.dim_value > 0 else d.dim_param or None for d in dims)))
    return out


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
