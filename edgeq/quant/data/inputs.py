"""The model's inputs as calibration sees them: every reader checks its data against these specs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeq.errors import QuantError

if TYPE_CHECKING:
    import onnx

Feed = dict  # {input name: np.ndarray with the model's batch dimension}


@dataclass(frozen=True)
class InputSpec:
    """One model input as calibration sees it: ``None`` in ``shape`` is a dynamic dimension."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str  # numpy dtype name, e.g. "float32"

    @property
    def batch(self) -> int:
        """Rows per sample along dim 0: the fixed batch size, or 1 if the batch is dynamic."""
        if not self.shape or self.shape[0] is None:
            return 1
        return self.shape[0]

    def describe(self, shape: Sequence[int | None] | None = None) -> str:
        """``(?, 3, 224, 224)``: the agent's way (one format for a shape in host and agent messages)."""
        from edgeq.agent.shapes import describe_dims

        return str(describe_dims(self.shape if shape is None else shape))


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    """The model's real inputs (graph inputs that are not initializers), in graph order."""
    import onnx

    inits = {i.name for i in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        except (KeyError, TypeError, ValueError):
            raise QuantError(f"model input '{vi.name}' has a non-tensor or unknown element type") from None
        dims: list[int | None] = []
        if tt.HasField("shape"):
            for d in tt.shape.dim:
                dims.append(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None)
        specs.append(InputSpec(vi.name, tuple(dims), dtype))
    if not specs:
        raise QuantError("the model has no inputs to feed calibration data to")
    return specs


def dims_match(found: Sequence[int], expected: Sequence[int | None]) -> bool:
    """Whether a concrete shape fits a spec's shape: ``None`` (dynamic) matches any size."""
    return len(found) == len(expected) and all(e is None or f == e for f, e in zip(found, expected))
