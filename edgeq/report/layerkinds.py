"""Layer kinds: is an engine layer compute, a weight, a format copy or a no-op, and is it a Q/DQ's.

The classification rules are data (``KIND_RULES``), each citing the fixture or document it comes from.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

from edgeq.report.fusion import LayerKind
from edgeq.report.parse import FLOAT_DTYPES, EngineLayer, EngineLayers


@dataclass(frozen=True)
class KindRule:
    rule: str
    layer_types: frozenset[str]
    kind: LayerKind
    source: str


# LayerType (or ParameterType) -> kind, before graph context is looked at. Order of checks:
# no-op, weights, reformat, then everything else is compute.
KIND_RULES: tuple[KindRule, ...] = (
    KindRule(
        "noop-layer",
        frozenset({"NoOp", "signal", "wait"}),
        LayerKind.NOOP,
        "fixtures trt86-h200/*.layers.json: NoOp 'copied_squeeze_after_...', 'reshape_after_/fc/Gemm' "
        "(no tactic, zero time in *.profile.json); trex parser.py drops signal/wait layers",
    ),
    KindRule(
        "constant-layer",
        frozenset({"Constant"}),
        LayerKind.WEIGHTS,
        "edgeq/docs/trt86-rules.md#reading-an-engine: Constant weight layers are not compute",
    ),
    KindRule(
        "reformat-layer",
        frozenset({"Reformat", "MyelinReformat"}),
        LayerKind.REFORMAT,
        "edgeq/docs/trt86-rules.md#reading-an-engine: Reformat layers; fixtures: Origin QDQ/REFORMAT/CAST",
    ),
)
WEIGHT_CHAIN_SOURCE = (
    "fixtures resnet50*.layers.json: 'Identity_N' MyelinReformat/Reformat(CAST) layers copy a Constant "
    "into a convolution's bias input; edgeq/docs/trt86-rules.md#reading-an-engine: MyelinReformat weight "
    "layers are not compute"
)
SHUFFLE_NOOP_SOURCE = "TensorRT: a Shuffle without transposes only reinterprets dimensions (pure reshape)"


class LayerLinks:
    """Producer/consumer links between engine layers through tensor names."""

    def __init__(self, el: EngineLayers) -> None:
        self.layers = el.layers
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for lay in el.layers:
            for t in lay.outputs:
                self.producer.setdefault(t.name, lay.index)
            for t in lay.inputs:
                self.consumers.setdefault(t.name, []).append(lay.index)
        produced = set(self.producer)
        consumed = set(self.consumers)
        if el.has_bindings and el.bindings:
            self.inputs = tuple(b for b in el.bindings if b not in produced)
            self.outputs = tuple(b for b in el.bindings if b in produced)
        else:  # pre-8.6 JSON: infer from the graph
            self.inputs = tuple(sorted(consumed - produced))
            self.outputs = tuple(sorted(produced - consumed))

    def successors(self, i: int) -> set[int]:
        return {c for t in self.layers[i].outputs for c in self.consumers.get(t.name, ())}

    def descendants(self, starts: Iterable[int]) -> set[int]:
        seen: set[int] = set()
        stack = list(starts)
        while stack:
            for s in self.successors(stack.pop()):
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return seen


def _base_kind(lay: EngineLayer) -> tuple[LayerKind, str]:
    for r in KIND_RULES:
        if lay.layer_type in r.layer_types or lay.parameter_type in r.layer_types:
            return r.kind, r.rule
    if (lay.layer_type == "Shuffle" or lay.parameter_type == "Shuffle") and _pure_reshape(lay):
        return LayerKind.NOOP, "shuffle-reshape"
    return LayerKind.COMPUTE, "compute"


def _pure_reshape(lay: EngineLayer) -> bool:
    def identity(v: str) -> bool:
        nums = [int(x) for x in re.findall(r"-?\d+", v)]
        return nums == list(range(len(nums)))

    same_format = [t.format for t in lay.inputs[:1]] == [t.format for t in lay.outputs[:1]]
    return same_format and all(identity(lay.param(k)) for k in ("FirstTranspose", "SecondTranspose"))


def layer_kinds(el: EngineLayers, g: LayerLinks) -> list[tuple[LayerKind, str]]:
    kinds = [_base_kind(lay) for lay in el.layers]
    # A layer whose every input comes from weights works on weights only (Constant -> "Identity_N"
    # copy -> conv bias): not on the activation path, so the gate does not judge it. It may still run
    # on every inference (measured in the fixtures' profiles); the report shows that time.
    changed = True
    while changed:
        changed = False
        for lay in el.layers:
            k, _ = kinds[lay.index]
            if k == LayerKind.WEIGHTS or not lay.inputs:
                continue
            prods = [g.producer.get(t.name) for t in lay.inputs]
            if all(p is not None and kinds[p][0] == LayerKind.WEIGHTS for p in prods):
                kinds[lay.index] = (LayerKind.WEIGHTS, "weight-chain")
                changed = True
    return kinds


def from_qdq(lay: EngineLayer) -> bool:
    """A reformat TensorRT made from a Q/DQ node (8.6 says so in Origin; older JSON only in the name)."""
    return lay.origin == "QDQ" or lay.name.endswith(("QuantizeLinear", "DequantizeLinear"))


def is_q(rl_layer: EngineLayer, ins: Sequence[Optional[str]], outs: Sequence[Optional[str]]) -> bool:
    """A Q/DQ reformat that quantizes (float -> INT8)."""
    return from_qdq(rl_layer) and "INT8" in outs and any(p in FLOAT_DTYPES for p in ins)


def is_dq(rl_layer: EngineLayer, ins: Sequence[Optional[str]], outs: Sequence[Optional[str]]) -> bool:
    return from_qdq(rl_layer) and "INT8" in ins and any(p in FLOAT_DTYPES for p in outs)
