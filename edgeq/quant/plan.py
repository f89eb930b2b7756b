"""The placement's result, as data: which tensors get a Q/DQ pair, which weights a per-channel
DequantizeLinear, which tensors share one scale, and why each float tensor stayed float.

Placement (rules), the mirror (an implicit engine's INT8 edges), float-entry regions and tune's decisions
all produce or edit a ``Plan``; calibration and Q/DQ insertion read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgeq.errors import QuantError


@dataclass(frozen=True)
class QdqSite:
    """One activation Q/DQ pair: on ``tensor``, feeding ``consumers`` (node names).

    ``graph_output`` means the DequantizeLinear output takes over the graph output's name.
    """

    tensor: str
    consumers: tuple[str, ...]
    rule: str
    group: str
    graph_output: bool = False


@dataclass(frozen=True)
class WeightSite:
    """A weight stored as int8 behind a DequantizeLinear; ``axis`` None means per-tensor."""

    tensor: str
    node: str
    axis: int | None
    rule: str


@dataclass(frozen=True)
class FloatTensor:
    tensor: str
    rule: str


@dataclass(frozen=True)
class Plan:
    mode: str
    sites: tuple[QdqSite, ...]
    weights: tuple[WeightSite, ...]
    commuted: tuple[str, ...]  # float in the ONNX, INT8 in the engine: TensorRT moves Q/DQ across them
    floats: tuple[FloatTensor, ...]
    groups: dict[str, tuple[str, ...]]  # group id -> site tensors sharing one scale
    activations: tuple[str, ...]  # every float activation tensor of the graph (for the implicit cache)
    excluded: tuple[str, ...] = ()
    forced: tuple[str, ...] = ()
    group_ids: dict[str, str] = field(default_factory=dict)  # site or commuted tensor -> its group id
    float_nodes: tuple[str, ...] = ()  # nodes left float on purpose (float-entry regions): not a fallback

    @property
    def tensors(self) -> list[str]:
        """The tensors calibration must measure for the Q/DQ model."""
        return [s.tensor for s in self.sites]

    def group_of(self, tensor: str) -> str | None:
        return self.group_ids.get(tensor)

    def scale_amax(self, amax: dict[str, float]) -> dict[str, float]:
        """amax per site tensor after scale sharing: a group takes the largest amax of its members.

        Commuted tensors inside a group get the group's amax as well, so a calibration cache written
        from this map gives TensorRT's implicit path the same equal scales.
        """
        missing = [t for t in self.tensors if t not in amax]
        if missing:
            raise QuantError(f"no calibration range for tensor '{missing[0]}'"
                             + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        top = {gid: max(float(amax[t]) for t in members) for gid, members in self.groups.items()}
        return {t: top[gid] for t, gid in self.group_ids.items()}

    def commuted_in(self, gid: str) -> list[str]:
        return [t for t in self.commuted if self.group_ids.get(t) == gid]

    def weights_by_axis(self) -> dict[str, int]:
        """How the weights were quantized: ``{"per-channel": n, "per-tensor": m}`` (axis None: 8.6 allows
        only per-tensor there, e.g. a MatMul whose weight is not 2-D), zero counts left out."""
        per_channel = sum(w.axis is not None for w in self.weights)
        counts = {"per-channel": per_channel, "per-tensor": len(self.weights) - per_channel}
        return {k: n for k, n in counts.items() if n}

    def shared_groups_by_rule(self) -> dict[str, int]:
        """Scale groups of more than one tensor, by the rule that made them share: ``concat-scale`` (a
        Concat's inputs), ``concat-conv`` (a Concat input's own Q/DQ for its convolution), else
        ``data-movement`` (Q/DQ moved across a MaxPool, Reshape, ...: one scale on both sides)."""
        counts: dict[str, int] = {}
        for gid, members in self.groups.items():
            if len(members) < 2 and not self.commuted_in(gid):
                continue
            rules = {s.rule for s in self.sites if s.group == gid}
            why = next((r for r in ("concat-scale", "concat-conv") if r in rules), "data-movement")
            counts[why] = counts.get(why, 0) + 1
        return dict(sorted(counts.items()))

    def float_by_rule(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in self.floats:
            counts[f.rule] = counts.get(f.rule, 0) + 1
        return dict(sorted(counts.items()))
