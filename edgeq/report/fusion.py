"""What the engine runs, as a value: the report's data model (``build_report`` in ``fusion_build`` makes it).

A TensorRT engine layer is one kernel; it may hold several ONNX nodes (a fused Conv+Add+Relu) or
none (a reformat copy TensorRT inserted). The report answers, for each layer: is it real compute,
a weight, a format copy or a no-op; what precision does it compute in; which ONNX nodes did it
absorb; is it at the edge of the network (where a copy is expected) or in its interior.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Optional

from edgeq.report.parse import EngineLayer, Tensor
from edgeq.text import plural


class LayerKind(str, Enum):
    COMPUTE = "compute"
    WEIGHTS = "weights"  # constants and copies/casts of constants: run once, not per inference
    REFORMAT = "reformat"  # a copy between formats/precisions on activations: a cost the gate sees
    NOOP = "no-op"  # reshape-only layers that move no data
    UNKNOWN = "unknown"  # names-only engine information: nothing to classify by


POINTWISE_TYPES = frozenset({"PointWise", "PointWiseV2", "ElementWise", "Activation", "Scale"})


@dataclass(frozen=True)
class ReportLayer:
    """One engine layer with what edgeq worked out about it."""

    layer: EngineLayer
    kind: LayerKind
    precision: Optional[str]  # compute precision: widest data-input precision (None: unknown)
    in_precisions: tuple[Optional[str], ...]  # data inputs only (weights excluded)
    out_precisions: tuple[Optional[str], ...]
    onnx_nodes: tuple[str, ...]  # ONNX nodes fused into this layer
    onnx_ops: tuple[str, ...]  # their op types (from the model with --onnx, else guessed from names)
    related_nodes: tuple[str, ...] = ()  # reformats: the nodes of the layer the copy is for
    boundary: Optional[str] = None  # "input" / "output": a reformat at the network's edge
    boundary_reason: str = ""
    region: str = "inside"  # "before" the first Q, "inside" the INT8 region, "after" the last DQ
    past_int8: bool = False  # inside, but after an INT8 layer's float epilogue with no INT8 after it
    time_ms: Optional[float] = None
    kind_rule: str = ""  # which rule decided ``kind``
    weight_inputs: tuple[int, ...] = ()  # input positions fed by weight layers (conv bias copies)

    @property
    def index(self) -> int:
        return self.layer.index

    @property
    def name(self) -> str:
        return self.layer.name

    @property
    def layer_type(self) -> str:
        return self.layer.layer_type

    @property
    def interior(self) -> bool:
        return self.region == "inside" and self.boundary is None

    @property
    def data_inputs(self) -> tuple[Tensor, ...]:
        """Activation inputs (a weight layer's inputs are all weights: then all of them)."""
        if self.kind == LayerKind.WEIGHTS:
            return self.layer.inputs
        return tuple(t for i, t in enumerate(self.layer.inputs) if i not in self.weight_inputs)

    @property
    def same_format_copy(self) -> bool:
        """A reformat whose every output has its input's precision and layout: a copy (TensorRT builds
        a Concat as copies into the output buffer), not a precision fallback or a layout change."""
        if self.kind != LayerKind.REFORMAT:
            return False
        fins = {t.format.short if t.format else None for t in self.data_inputs}
        fouts = {t.format.short if t.format else None for t in self.layer.outputs}
        return len(fins) == 1 and fins == fouts and None not in fins

    @property
    def formats(self) -> str:
        """'INT8 NC/32HW32 -> INT8 NCHW' (activations only) for display."""

        def fmt(ts: Sequence[Tensor]) -> str:
            return ", ".join(t.format.short if t.format else "?" for t in ts) or "-"

        return f"{fmt(self.data_inputs)} -> {fmt(self.layer.outputs)}"


@dataclass(frozen=True)
class EngineView:
    """A layer as the pattern registry's engine signatures read it (``edgeq.graph.facts.LayerView``)."""

    ops: frozenset[str]
    kind: str
    pointwise: bool
    inputs: int
    gated: bool
    upstream: frozenset[str] = frozenset()
    downstream: frozenset[str] = frozenset()
    formats: str = ""
    foreign: bool = False


def view_of(rl: ReportLayer, upstream: Iterable[str] = (), downstream: Iterable[str] = ()) -> EngineView:
    """``rl`` for the registry: its ops, whether it is a PointWise layer, its activation inputs and whether
    one of them is a per-channel gate (1x1 in space beside a full map)."""
    spatial = [t.dims[2:] for t in rl.data_inputs if len(t.dims) >= 3]
    gated = any(all(d == 1 for d in s) for s in spatial) and any(any(d != 1 for d in s) for s in spatial)
    pointwise = rl.layer.layer_type in POINTWISE_TYPES or rl.layer.parameter_type in POINTWISE_TYPES
    foreign = rl.layer.layer_type == "Myelin" or rl.layer.name.startswith("{ForeignNode[")
    return EngineView(frozenset(rl.onnx_ops), rl.kind.value, pointwise, len(rl.in_precisions), gated,
                      frozenset(upstream), frozenset(downstream), rl.formats, foreign)


@dataclass(frozen=True)
class UnfusedResidual:
    """A residual Add that TensorRT ran as its own point-wise layer instead of inside a convolution."""

    add_layer: int
    activation_layer: Optional[int]  # a separate point-wise layer for the Relu after it, if any
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class OnnxNodeRun:
    """Where one ONNX node ended up in the engine."""

    name: str
    op_type: str
    layers: tuple[int, ...]
    kind: str  # kind of the layer that runs it ("compute", "reformat", "no-op")
    precision: Optional[str]


@dataclass(frozen=True)
class OnnxMapping:
    """ONNX graph -> engine: which nodes ran in which precision, which vanished."""

    model: str
    nodes: tuple[OnnxNodeRun, ...]  # found in some layer, in graph order
    not_found: tuple[tuple[str, str], ...]  # (name, op_type): fused away (Q/DQ) or eliminated
    unknown: tuple[str, ...] = ()  # names the engine reports that the model does not have
    engine_names: tuple[str, ...] = ()  # ONNX node names the engine reports (layer metadata), ``unknown`` too

    def by_precision(self) -> dict[str, list[str]]:
        """Compute-layer nodes by precision ("INT8", "FP16", "FP32", "unknown")."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            if n.kind == LayerKind.COMPUTE.value:
                out.setdefault(n.precision or "unknown", []).append(n.name)
        return out

    def in_kind(self, kind: LayerKind) -> list[str]:
        return [n.name for n in self.nodes if n.kind == kind.value]


@dataclass(frozen=True)
class FusionReport:
    source: str
    detailed: bool
    mode: str  # "explicit" (Q/DQ reformats found) or "implicit"
    layers: tuple[ReportLayer, ...]
    bindings: tuple[str, ...]
    network_inputs: tuple[str, ...]
    network_outputs: tuple[str, ...]
    unfused_residuals: tuple[UnfusedResidual, ...] = ()
    onnx: Optional[OnnxMapping] = None
    profile_source: Optional[str] = None
    profile_total_ms: Optional[float] = None
    profile_iterations: Optional[int] = None
    unmatched_profile: tuple[str, ...] = ()  # profile names with no layer (a different engine?)
    notes: tuple[str, ...] = field(default_factory=tuple)

    def of_kind(self, kind: LayerKind) -> list[ReportLayer]:
        return [rl for rl in self.layers if rl.kind == kind]

    def compute_precisions(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rl in self.of_kind(LayerKind.COMPUTE):
            out[rl.precision or "unknown"] = out.get(rl.precision or "unknown", 0) + 1
        return out

    def kind_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rl in self.layers:
            out[rl.kind.value] = out.get(rl.kind.value, 0) + 1
        return out

    def interior_reformats(self) -> list[ReportLayer]:
        return [rl for rl in self.of_kind(LayerKind.REFORMAT) if rl.interior]

    def boundary_reformats(self) -> list[ReportLayer]:
        return [rl for rl in self.of_kind(LayerKind.REFORMAT) if rl.boundary]

    @property
    def timed(self) -> bool:
        return self.profile_total_ms is not None

    def summary_line(self) -> str:
        """One line for logs and the demo: layer kinds, compute precisions, copies, unfused Adds."""
        if not self.detailed:
            return f"{len(self.layers)} layers, names only (built without ProfilingVerbosity.DETAILED)"
        precisions = ", ".join(f"{n} {p}" for p, n in sorted(self.compute_precisions().items()))
        text = (
            f"{self.mode}, {plural(len(self.layers), 'layer')}, compute {precisions or 'none'}, "
            f"{len(self.boundary_reformats())} boundary + "
            f"{len(self.interior_reformats())} interior reformats, "
            f"{plural(len(self.unfused_residuals), 'unfused residual Add')}"
        )
        if self.profile_total_ms is not None:
            text += f", {self.profile_total_ms:.3f} ms"
        return text

    def time_by_kind(self) -> dict[str, float]:
        """Profiled milliseconds per layer kind (empty without a profile)."""
        out: dict[str, float] = {}
        for rl in self.layers:
            if rl.time_ms is not None:
                out[rl.kind.value] = out.get(rl.kind.value, 0.0) + rl.time_ms
        return out
