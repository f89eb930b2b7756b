"""What keeping some INT8 nodes float costs on a target, priced from the full INT8 engine's profile there.

Why a model: a region kept float is only known exactly by building the engine with it float (a build of
tens of seconds to minutes on the target, for each set of regions), while ``--max-loss`` weighs dozens
of regions and their combinations. The full INT8 engine, built and profiled once on the target, says
which engine layers hold each region's nodes and what they take there in INT8; the measured table
(``data/trt86-float-cost.csv``, written by ``bench/float_cost_bench.py`` from the repository's recorded
TensorRT 8.6.0 engines) says what such a layer and the copies at the region's edges cost in float. The
chosen set is then built and timed beside full INT8 (``edgeq.orchestration.budget``): the model ranks,
the build measures, and the output shows both.

The price of a node set, on the engine graph (the layers' tensors link them):

- each INT8 compute layer holding one of the nodes runs FP16: ``(k - 1) x its INT8 time``, ``k`` the
  median FP16/INT8 time of its layer type (CaskConvolution, PointWiseV2, ...) over layers measured both
  ways in one lease; a layer already float in the engine costs nothing more;
- each INT8 tensor that then crosses between a float layer and an INT8 one needs a reformat (a
  DequantizeLinear into the float layer, a QuantizeLinear out of it): ``a + b x its elements``, fitted
  over the recorded engines' interior INT8<->FP16 reformats.

Measured on H100 and H200 (TensorRT 8.6.0, batch 1-64) only: on another GPU the figures are a guess until
the build there confirms them, and the output says the cost is modelled.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Collection
from dataclasses import dataclass
from functools import cache
from typing import Any, Optional

from edgeq.report.fusion import FusionReport, LayerKind, ReportLayer

_CSV = "trt86-float-cost.csv"
SOURCE = ("bench/float_cost_bench.py over the recorded TensorRT 8.6.0 engines of H100 and H200 "
          "(edgeq/graph/data/trt86-float-cost.csv)")
ANY = "*"  # the row of every layer type pooled: the ratio of a type measured too rarely


@dataclass(frozen=True)
class CostTable:
    """The measured figures: FP16/INT8 time per engine layer type, and one INT8<->FP16 reformat's cost."""

    ratio_by_type: dict[str, float]  # engine LayerType -> median FP16 time / INT8 time
    ratio_any: float  # every layer type pooled
    reformat_ms: float  # a reformat's fixed time
    reformat_ms_per_element: float

    def ratio(self, layer_type: str) -> float:
        return self.ratio_by_type.get(layer_type, self.ratio_any)

    def reformat(self, elements: int) -> float:
        return self.reformat_ms + self.reformat_ms_per_element * elements


@cache
def load_cost_table() -> CostTable:
    """The table in the package data (``fact,key,value,...`` rows), read once."""
    from importlib.resources import files

    text = (files("edgeq.graph") / "data" / _CSV).read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    ratios: dict[str, float] = {}
    reformat: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        fact, key, value = row["fact"].strip(), row["key"].strip(), float(row["value"])
        if fact == "fp16_over_int8":
            ratios[key] = value
        elif fact == "reformat":
            reformat[key] = value
    return CostTable({k: v for k, v in ratios.items() if k != ANY}, ratios[ANY], reformat["fixed_ms"],
                     reformat["ms_per_element"])


@dataclass(frozen=True)
class FloatCost:
    """A node set's modelled price on one engine: milliseconds per inference in the profile's units."""

    ms: float
    layers: int  # INT8 compute layers that would run float
    int8_ms: float  # what they take in INT8
    layer_ms: float  # what running them FP16 adds
    reformats: int  # INT8 tensors that would cross a float/INT8 edge
    reformat_ms: float
    nodes_found: int  # of the nodes, those the engine's layers name
    nodes: int

    def to_dict(self) -> dict[str, Any]:
        return {"ms": round(self.ms, 6), "layers": self.layers, "int8_ms": round(self.int8_ms, 6),
                "layer_ms": round(self.layer_ms, 6), "reformats": self.reformats,
                "reformat_ms": round(self.reformat_ms, 6), "nodes_found": self.nodes_found,
                "nodes": self.nodes}  # fmt: skip


def elements(dims: tuple[int, ...]) -> int:
    """A tensor's element count (a dynamic dimension the inspector printed as -1 counts as 1)."""
    return math.prod(max(1, d) for d in dims) if dims else 1


class CostModel:
    """Prices node sets on one engine: its report mapped onto the ONNX model, with a profile."""

    def __init__(self, report: FusionReport, table: Optional[CostTable] = None) -> None:
        self.report = report
        self.table = table or load_cost_table()
        self.total_ms = report.profile_total_ms
        self._by_node: dict[str, list[ReportLayer]] = {}
        for rl in report.layers:
            if rl.kind == LayerKind.COMPUTE:
                for n in rl.onnx_nodes:
                    self._by_node.setdefault(n, []).append(rl)
        self._producer: dict[str, ReportLayer] = {}
        self._consumers: dict[str, list[ReportLayer]] = {}
        for rl in report.layers:
            for t in rl.layer.outputs:
                self._producer.setdefault(t.name, rl)
            for t in rl.data_inputs:
                self._consumers.setdefault(t.name, []).append(rl)

    def layers_of(self, nodes: Collection[str]) -> list[ReportLayer]:
        """The INT8 compute layers holding any of ``nodes``, in engine order."""
        found = {rl.index: rl for n in nodes for rl in self._by_node.get(n, ()) if rl.precision == "INT8"}
        return [found[i] for i in sorted(found)]

    def price(self, nodes: Collection[str]) -> FloatCost:
        """What keeping ``nodes`` float adds to the engine (see the module doc)."""
        wanted = set(nodes)
        floating = self.layers_of(wanted)
        inside = {rl.index for rl in floating}
        layer_ms = int8_ms = 0.0
        for rl in floating:
            took = rl.time_ms or 0.0
            int8_ms += took
            layer_ms += (self.table.ratio(rl.layer_type) - 1.0) * took
        crossing: dict[str, int] = {}  # tensor -> elements, each INT8 tensor a float layer reads or writes
        for rl in floating:
            for t in rl.data_inputs:
                if t.precision == "INT8" and self._int8_reader_outside(t.name, inside):
                    crossing.setdefault(t.name, elements(t.dims))
            for t in rl.layer.outputs:
                if t.precision == "INT8" and self._int8_reader_outside(t.name, inside):
                    crossing.setdefault(t.name, elements(t.dims))
        reformat_ms = sum(self.table.reformat(n) for n in crossing.values())
        found = sum(1 for n in wanted if n in self._by_node)
        return FloatCost(layer_ms + reformat_ms, len(floating), int8_ms, layer_ms, len(crossing), reformat_ms,
                         found, len(wanted))  # fmt: skip

    def _int8_reader_outside(self, tensor: str, inside: set[int]) -> bool:
        """Whether a layer outside the float set still reads ``tensor`` in INT8 (or, for a layer's input,
        writes it): then the float side needs its own copy of it (a reformat); else the producer writes
        float directly and nothing is copied."""
        readers = [rl for rl in self._consumers.get(tensor, ()) if rl.index not in inside]
        producer = self._producer.get(tensor)
        if producer is not None and producer.index not in inside and producer.kind == LayerKind.COMPUTE \
                and producer.precision == "INT8" and readers:
            return True
        return any(rl.precision == "INT8" or rl.kind == LayerKind.REFORMAT for rl in readers)

    def qps(self, measured_qps: float, cost_ms: float) -> Optional[float]:
        """The throughput modelled for an engine ``cost_ms`` slower per inference than this one, which ran
        ``measured_qps``: the profile's total stands for the time per inference."""
        if not self.total_ms:
            return None
        return measured_qps * self.total_ms / (self.total_ms + max(0.0, cost_ms))

    def fp16_ms(self) -> Optional[float]:
        """The whole engine run FP16 (every INT8 compute layer at its type's ratio, no Q/DQ reformats):
        a modelled reference where no FP16 engine was built."""
        if not self.total_ms:
            return None
        total = 0.0
        for rl in self.report.layers:
            t = rl.time_ms or 0.0
            if rl.kind == LayerKind.COMPUTE and rl.precision == "INT8":
                total += self.table.ratio(rl.layer_type) * t
            elif not (rl.kind == LayerKind.REFORMAT and rl.layer.origin == "QDQ"):
                total += t
        return total
