"""What every cleaning pass shares: the options, the Change a pass reports, Unfit, the Pass entry, and
the small graph edits several passes make (bypass a node, prune what a pass disconnected)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Union

from edgeq.errors import GraphError
from edgeq.graph.patterns import producer

if TYPE_CHECKING:
    import numpy as np
    import onnx
    import onnx_graphsurgeon as gs


@dataclass(frozen=True)
class CleanOptions:
    """What ``edgeq clean`` aims for. Defaults are TensorRT 8.6's limits (opset 17, IR 8).

    Tolerances are for ``--verify``; every Q/DQ rewrite here is exact, so they only absorb float
    reordering from constant folding (elementwise: a value fails when it is beyond both atol and rtol,
    as Polygraphy's comparator does).
    """

    opset: int = 17
    ir_version: int = 8
    verify: bool = True
    atol: float = 1e-4
    rtol: float = 1e-3
    seed: int = 0
    skip: tuple[str, ...] = ()
    # The file came from PyTorch's exporter with qint8 activations: its uint8 zero-point 0 Q/DQ become
    # int8 zero-point 0, restoring what PyTorch computed (a deliberate change; see qdq_torch_qint8).
    torch_qint8: bool = False
    # --shapes (trtexec's syntax): the dynamic inputs' shapes for --verify, over the exporter's
    # (edgeq.graph.shapes); "" takes the exporter's, and dimensions nothing gives are run at 1
    shapes: str = ""

    def __post_init__(self) -> None:
        # The 8.6 parser reads opsets back to 7; the version converter has no adapters below that.
        if not 7 <= self.opset <= 17:
            raise GraphError(f"--opset {self.opset}: TensorRT 8.6 parses opsets 7 to 17", "use --opset 17")
        if not (self.atol >= 0 and self.rtol >= 0):  # NaN too: every comparison with it passes
            raise GraphError(f"tolerances must be >= 0 (--atol {self.atol}, --rtol {self.rtol})")


@dataclass(frozen=True)
class Change:
    """One thing a pass changed: the pass name, what it did, and the nodes involved."""

    pass_name: str
    message: str
    nodes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_name, "message": self.message, "nodes": list(self.nodes)}


class Unfit(GraphError):
    """A whole-model pass cannot make the model fit; ``nodes`` names what blocks it."""

    def __init__(self, message: str, hint: str | None = None, *, nodes: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint, exit_code=1)
        self.nodes = nodes


GraphPass = Callable[["gs.Graph", CleanOptions], "list[Change]"]
ModelPass = Callable[["onnx.ModelProto", CleanOptions], "tuple[onnx.ModelProto, list[Change]]"]


@dataclass(frozen=True)
class Pass:
    name: str
    fn: Union[GraphPass, ModelPass]
    kind: Literal["model", "graph"]

    @property
    def summary(self) -> str:
        doc = (self.fn.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""



def node_name(node: gs.Node) -> str:
    if node.name:
        return node.name
    out = next((t.name for t in node.outputs if t.name), "?")
    return f"{node.op}->{out}"


@contextlib.contextmanager
def quiet_graphsurgeon() -> Iterator[None]:
    """graphsurgeon logs to stdout; library code never prints, so silence it for the duration."""
    from onnx_graphsurgeon.logger import G_LOGGER

    from edgeq.graph.io import quiet_onnxruntime

    quiet_onnxruntime()  # graphsurgeon folds constants in onnxruntime sessions of its own
    old = G_LOGGER.severity
    G_LOGGER.severity = G_LOGGER.CRITICAL
    try:
        yield
    finally:
        G_LOGGER.severity = old


def onnx_dtype(dtype: Any) -> int | None:
    """graphsurgeon stores numpy dtypes (or, for types numpy lacks, onnx enums)."""
    import numpy as np
    import onnx

    if dtype is None:
        return None
    if isinstance(dtype, int):
        return dtype
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    except (TypeError, KeyError, ValueError):
        return None


def const(t: gs.Tensor) -> np.ndarray | None:
    import onnx_graphsurgeon as gs

    return t.values if isinstance(t, gs.Constant) else None


def opt_input(node: gs.Node, i: int) -> gs.Tensor | None:
    if len(node.inputs) > i and not node.inputs[i].is_empty():
        return node.inputs[i]
    return None


def _replace_input(consumer: gs.Node, old: gs.Tensor, new: gs.Tensor) -> None:
    for i, t in enumerate(consumer.inputs):
        if t is old:
            consumer.inputs[i] = new


def bypass(graph: gs.Graph, node: gs.Node) -> bool:
    """Remove a one-in/one-out node, wiring its input straight to its consumers.

    Keeps graph output names: if the node wrote a graph output, its producer writes it instead.
    Returns False (and changes nothing) when that cannot be done without renaming a graph tensor.
    """
    import onnx_graphsurgeon as gs

    inp, out = node.inputs[0], node.outputs[0]
    if out in graph.outputs:
        prod = producer(inp)
        if (
            prod is None
            or isinstance(inp, gs.Constant)
            or inp in graph.inputs
            or inp in graph.outputs
            or len(prod.outputs) == 0
        ):
            return False
        for consumer in list(inp.outputs):
            if consumer is not node:
                _replace_input(consumer, inp, out)
        node.outputs.clear()
        node.inputs.clear()
        prod.outputs[prod.outputs.index(inp)] = out
        return True
    for consumer in list(out.outputs):
        _replace_input(consumer, out, inp)
    node.outputs.clear()
    node.inputs.clear()
    return True


def prune_disconnected(graph: gs.Graph) -> None:
    """Drop the nodes this pass disconnected, and only those: dead code is remove_unused's to report."""
    graph.nodes = [n for n in graph.nodes if len(n.outputs)]
