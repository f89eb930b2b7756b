"""Where Q/DQ go so TensorRT 8.6 fuses: patterns and predicates that produce a ``Plan``.

The placement half of quantization (calibration is the other half): a read-only walk over a
graphsurgeon graph that decides which tensors get a Q/DQ pair, which weights get a per-channel
DequantizeLinear and on which axis, which tensors must share one scale, and, for every float tensor
left in float, the rule that left it (rule ids and sources in ``edgeq.quant.rules``).

``trt`` placement, in short: every weighted op asks for INT8 activation inputs; the ask travels back
across ops that commute with Q/DQ (MaxPool, Concat, Split, Resize-nearest, reshapes) and lands as one
Q/DQ pair on the first tensor that does not commute; everything reached through one commuting region
shares a scale. Residual Adds ask only for their skip input; Relu->MaxPool after a convolution and the
inside of a SiLU are never cut. Where TensorRT 8.6.0 engines showed otherwise, the engine wins: a
weighted op that reads a Concat also gets its own Q/DQ, a SiLU feeding a residual Add reads a quantized
convolution output, an averaging tail is quantized, and an INT8 region entered only through a Q on
float data movement runs float (``edgeq.quant.regions``, after the patterns). The graph facts behind
every decision come from ``edgeq.graph.fusion``, which lint reads too. ``all`` placement reproduces
onnxruntime's QDQ output for comparison.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from edgeq.errors import QuantError
from edgeq.graph import fusion, registry
from edgeq.graph.facts import Want
from edgeq.graph.patterns import is_constant, is_float, moves_data, producer, silu_input, var_inputs
from edgeq.quant import regions
from edgeq.quant.overrides import Overrides
from edgeq.quant.plan import FloatTensor, Plan, QdqSite, WeightSite
from edgeq.quant.rules import ORT_QUANTIZABLE_OPS, WEIGHTED_OPS, rule
from edgeq.unionfind import UnionFind

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

PLACEMENTS = ("trt", "all")


# --------------------------------------------------------------------------------------------------
# Graph helpers (read-only)
# --------------------------------------------------------------------------------------------------


def _attr(node: gs.Node, name: str, default: object = None) -> Any:  # whatever the ONNX attribute holds
    v = node.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _data_inputs(node: gs.Node) -> list[gs.Tensor]:
    """Activation inputs that carry data (not shapes, axes, scales or weights)."""
    if node.op == "Concat" or node.op in WEIGHTED_OPS or node.op in ("Add", "Mul", "Sub", "Div", "Where"):
        ins = var_inputs(node)
    else:
        ins = [node.inputs[0]] if node.inputs and not is_constant(node.inputs[0]) else []
    return [t for t in ins if is_float(t)]


def _weight_of(node: gs.Node) -> gs.Constant | None:
    import onnx_graphsurgeon as gs

    if node.op in WEIGHTED_OPS and len(node.inputs) > 1 and isinstance(node.inputs[1], gs.Constant):
        return node.inputs[1]
    return None


def weight_axis(node: gs.Node) -> int | None:
    """The output-channel axis of a weighted op's weight, or None where 8.6 allows only per-tensor.

    TensorRT 8.6 Developer Guide 'Per-Tensor and Per-Channel Quantization': per-channel on the output
    channel axis for convolution, deconvolution, fully connected and MatMul with a constant 2-D second
    input and 2-D inputs; 'ONNX Support' (Gemm: axis 0 with transB, 1 without).
    """
    w = _weight_of(node)
    if w is None:
        return None
    rank = len(w.shape)
    if node.op == "Conv":
        return 0
    if node.op == "ConvTranspose":
        # weight is (Cin, Cout/group, k...): axis 1 holds all output channels only when group == 1.
        return 1 if int(_attr(node, "group", 1)) == 1 else None
    if node.op == "Gemm":
        return 0 if int(_attr(node, "transB", 0)) else 1
    if node.op == "MatMul":
        a = node.inputs[0]
        a_rank = len(a.shape) if a.shape is not None else None
        return 1 if rank == 2 and a_rank == 2 else None
    return None


def _is_silu_mul(node: gs.Node) -> tuple[gs.Tensor, gs.Tensor] | None:
    """Mul(x, Sigmoid(x)) -> (x, the Sigmoid's output)."""
    x = silu_input(node)
    if x is None:
        return None
    s = node.inputs[1] if node.inputs[0] is x else node.inputs[0]
    return x, s


# --------------------------------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------------------------------


def plan_placement(graph: gs.Graph, placement: str = "trt", overrides: Overrides | None = None, *,
                   float_entry: bool = True) -> Plan:
    """Decide every Q/DQ of the graph (read-only). Node names must be unique and non-empty.
    ``float_entry=False`` keeps the INT8 regions ``edgeq.quant.regions`` would float (tune decides them)."""
    if placement not in PLACEMENTS:
        raise QuantError(f"unknown placement '{placement}'", hint="use --placement trt or --placement all")
    names = [n.name for n in graph.nodes]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise QuantError("graph nodes need unique, non-empty names before placement",
                         hint="this is a bug: quantize names nodes after cleaning")
    excluded, forced = (overrides or Overrides()).resolve(names)
    builder = _PlanBuilder(graph, excluded, forced)
    if placement != "trt":
        builder.place_all()
        return builder.finish(placement)
    builder.place_trt()
    plan = builder.finish(placement)
    return regions.float_entry(graph, plan, keep=forced)[0] if float_entry else plan


class _PlanBuilder:
    def __init__(self, graph: gs.Graph, excluded: frozenset[str], forced: frozenset[str]) -> None:
        self.graph = graph
        self.excluded = excluded
        self.forced = forced
        self.order = {n.name: i for i, n in enumerate(graph.nodes)}
        self.blocked: dict[tuple[str, str], str] = {}  # (tensor, consumer node) -> rule that keeps it float
        self.floated: dict[str, str] = {}  # node run float whole (a Myelin region) -> the pattern's id
        self.site_rule: dict[str, str] = {}  # site tensor -> rule
        self.site_tensor: dict[str, gs.Tensor] = {}
        self.site_consumers: dict[str, set[str]] = {}
        self.graph_output_sites: set[str] = set()
        self.resolved: dict[str, str] = {}  # needed tensor -> site tensor it resolved to
        self.commuted: dict[str, gs.Tensor] = {}
        self.uf = UnionFind[str]()
        self.weights: list[WeightSite] = []
        self.residuals: dict[str, tuple[gs.Tensor, gs.Tensor] | None] = {}
        self.outputs = {t.name for t in graph.outputs}
        inputs = {t.name for t in graph.inputs}
        self.activations = [
            t for name, t in graph.tensors().items()
            if name and not is_constant(t) and is_float(t) and (t.inputs or name in inputs)
        ]

    # -- shared ---------------------------------------------------------------------------------------
    def _place_weights(self) -> None:
        for node in self.graph.nodes:
            if node.op not in WEIGHTED_OPS or node.name in self.excluded:
                continue
            if node.name in self.floated and node.name not in self.forced:
                continue
            w = _weight_of(node)
            if w is not None and is_float(w):
                self.weights.append(WeightSite(w.name, node.name, weight_axis(node), "weighted-inputs"))

    def _residual(self, node: gs.Node) -> tuple[gs.Tensor, gs.Tensor] | None:
        if node.op != "Add":
            return None
        if node.name not in self.residuals:
            self.residuals[node.name] = fusion.residual_split(node)
        return self.residuals[node.name]

    def _site(self, t: gs.Tensor, rule_id: str) -> str:
        if t.name not in self.site_rule:
            self.site_rule[t.name] = rule_id
            self.site_tensor[t.name] = t
            self.site_consumers[t.name] = set()
            self.uf.add(t.name)
        return t.name

    def _edge_ok(self, t: gs.Tensor, node: gs.Node, *, forced: bool = False) -> bool:
        if node.name in self.excluded:
            return False
        return forced or (t.name, node.name) not in self.blocked

    # -- trt ------------------------------------------------------------------------------------------
    def place_trt(self) -> None:
        """Act on the registry's edge decisions: float edges block, INT8 edges are needs resolved across
        data movement, OWN edges get a Q/DQ of their own in the scale group behind them. A pattern
        anchored at an excluded node decides nothing."""
        matches = {pid: [m for m in ms if m.anchor not in self.excluded]
                   for pid, ms in registry.all_matches(self.graph).items()}
        decisions = registry.decide(matches)
        for (t, c), (want, rule_id) in decisions.by_edge.items():
            if want == Want.FLOAT:
                self.blocked[(t, c)] = rule_id
        for p in registry.REGISTRY:  # regions that run float whole: their weights stay float too
            if p.floats_nodes:
                self.floated.update((n, p.id) for m in matches.get(p.id, ()) for n in m.nodes)
        self._place_weights()
        tensors = self.graph.tensors()
        nodes = {n.name: n for n in self.graph.nodes}
        for p in registry.REGISTRY:  # needs in precedence order: the first to reach a site names it
            for m in matches.get(p.id, ()):
                for e in m.edges:
                    want, rule_id = decisions.by_edge[(e.tensor, e.consumer)]
                    if rule_id != (m.site_rule or p.id) or want == Want.FLOAT or e.consumer not in nodes:
                        continue
                    t, n = tensors[e.tensor], nodes[e.consumer]
                    if want == Want.OWN:
                        self._own(t, n, rule_id)
                    else:
                        self._need(t, n, rule_id)
        for node in self.graph.nodes:
            if node.name in self.forced:
                for t in _data_inputs(node) or [t for t in var_inputs(node) if is_float(t)]:
                    self._need(t, node, "place-override", forced=True)

    def _need(self, t: gs.Tensor, consumer: gs.Node, rule_id: str, *, forced: bool = False) -> str | None:
        """``consumer`` wants ``t`` in INT8: resolve to a site (through commuting ops); return its group."""
        if not self._edge_ok(t, consumer, forced=forced):
            return None
        if forced:
            site = self._site(t, rule_id)
            self.site_consumers[site].add(consumer.name)
            return self.uf.find(site)
        group = self._resolve(t, rule_id)
        if t.name in self.site_rule:
            self.site_consumers[t.name].add(consumer.name)
        return group

    def _resolve(self, t: gs.Tensor, rule_id: str) -> str:
        if t.name in self.resolved:
            return self.uf.find(self.resolved[t.name])
        p = producer(t)
        if (p is not None and moves_data(p) and p.name not in self.excluded and p.name not in self.forced
                and t.name not in self.outputs):
            ins = _data_inputs(p)
            if ins and all(self._edge_ok(x, p) for x in ins):
                self.commuted[t.name] = t
                self.uf.add(t.name)
                groups = [self._need(x, p, rule_id) for x in ins]
                root = self.uf.find(groups[0]) if groups[0] else self.uf.find(t.name)
                for g in groups[1:]:
                    if g:
                        root = self.uf.union(root, g)
                root = self.uf.union(root, t.name)
                self.resolved[t.name] = t.name
                if len(ins) > 1 and p.op == "Concat":
                    for x in ins:
                        self._concat_rule(x)
                return root
        site = self._site(t, rule_id)
        self.resolved[t.name] = site
        return self.uf.find(site)

    def _own(self, t: gs.Tensor, consumer: gs.Node, rule_id: str) -> str | None:
        """A Q/DQ of its own on ``t`` for ``consumer``, in the scale group of what is behind ``t`` (which is
        quantized as any INT8 need would be): concat-conv, where TensorRT 8.6 does not carry the DQ on a
        Concat's inputs forward to the convolution."""
        if not self._edge_ok(t, consumer):
            return None
        group = self._resolve(t, "weighted-inputs")
        self.commuted.pop(t.name, None)
        site = self._site(t, rule_id)
        self.site_rule[site] = rule_id
        self.site_consumers[site].add(consumer.name)
        return self.uf.union(group, site)

    def _concat_rule(self, x: gs.Tensor) -> None:
        # Site created only to feed a Concat: its reason is the shared concat scale.
        feeds_weighted = any(c.op in WEIGHTED_OPS for c in x.outputs)
        if self.site_rule.get(x.name) == "weighted-inputs" and not feeds_weighted:
            self.site_rule[x.name] = "concat-scale"

    # -- all ------------------------------------------------------------------------------------------
    def place_all(self) -> None:
        self._place_weights()
        for t in self.activations:
            wanted = [c for c in t.outputs if c.op in ORT_QUANTIZABLE_OPS and c.name not in self.excluded
                      and any(x is t for x in _data_inputs(c))]
            forced = [c for c in t.outputs if c.name in self.forced]
            p = producer(t)
            as_output = (t.name in self.outputs and p is not None and p.op in ORT_QUANTIZABLE_OPS
                         and p.name not in self.excluded)
            if not wanted and not forced and not as_output:
                continue
            site = self._site(t, "place-override" if forced and not wanted else "place-all")
            self.site_consumers[site].update(c.name for c in (*wanted, *forced))
            if as_output:
                self.graph_output_sites.add(site)
        # onnxruntime gives the outputs of its "same as input" ops (MaxPool, reshapes, Resize...) the
        # input's scale; Concat it does not (hence fuse-concat-scales on its output).
        for node in self.graph.nodes:
            if moves_data(node) and node.op != "Concat":
                ins = [x for x in _data_inputs(node) if x.name in self.site_rule]
                outs = [o for o in node.outputs if o.name in self.site_rule]
                for x in ins:
                    for o in outs:
                        self.uf.union(x.name, o.name)

    # -- result ---------------------------------------------------------------------------------------
    def _float_rule(self, t: gs.Tensor) -> str:
        consumers = list(t.outputs)
        p = producer(t)
        if any(c.name in self.excluded for c in consumers) or (p is not None and p.name in self.excluded):
            return "place-override"
        for c in consumers:
            r = self.blocked.get((t.name, c.name))
            if r is not None:
                return r
        if p is not None and p.op == "Sigmoid" and any(_is_silu_mul(c) for c in consumers):
            return "silu-whole"
        if fusion.fused_origin(t) is not None:
            return "conv-epilogue"
        q = fusion.residual_behind(t)
        if q is not None and self._residual(q) is not None:
            return "conv-epilogue"  # a residual Add fused into its convolution (with its Relu)
        return "place-not-int8-consumer"

    def finish(self, mode: str) -> Plan:
        pos: dict[str, int] = {}
        for i, n in enumerate(self.graph.nodes):
            for o in n.outputs:
                pos.setdefault(o.name, i)

        def key(name: str) -> tuple[int, str]:
            return (pos.get(name, -1), name)

        site_names = sorted(self.site_rule, key=key)
        members: dict[str, list[str]] = {}
        for s in site_names:
            members.setdefault(self.uf.find(s), []).append(s)
        gid_of_root = {root: ms[0] for root, ms in members.items()}  # group id: first member in order
        groups = {gid_of_root[root]: tuple(ms) for root, ms in members.items()}
        # A commuted tensor carries the scale of its group's sites; one in no site's group carries none.
        commuted = [t for t in sorted(self.commuted, key=key) if self.uf.find(t) in gid_of_root]
        group_ids = {t: gid_of_root[self.uf.find(t)] for t in (*site_names, *commuted)}

        sites = []
        for s in site_names:
            t = self.site_tensor[s]
            consumers = self.site_consumers[s]
            # A site serves every consumer except those the rules keep float.
            if mode == "trt":
                consumers = consumers | {c.name for c in t.outputs if self._edge_ok(t, c)}
            ordered = tuple(sorted(consumers, key=lambda n: self.order.get(n, 0)))
            sites.append(QdqSite(s, ordered, self.site_rule[s], group_ids[s],
                                 graph_output=s in self.graph_output_sites))
        floats = [FloatTensor(t.name, self._float_rule(t)) for t in self.activations
                  if t.name not in self.site_rule and t.name not in self.commuted]
        plan = Plan(
            mode=mode,
            sites=tuple(sites),
            weights=tuple(self.weights),
            commuted=tuple(commuted),
            floats=tuple(floats),
            groups=groups,
            activations=tuple(t.name for t in self.activations),
            excluded=tuple(sorted(self.excluded)),
            forced=tuple(sorted(self.forced)),
            group_ids=group_ids,
            float_nodes=tuple(n.name for n in self.graph.nodes if n.name in self.floated),
        )
        decisions: tuple[QdqSite | WeightSite | FloatTensor, ...] = (*plan.sites, *plan.weights, *plan.floats)
        for r in {d.rule for d in decisions}:
            rule(r)  # every decision carries a known rule id
        return plan


def ensure_node_names(model: onnx.ModelProto) -> int:
    """Give unnamed or duplicate-named nodes unique names (``<op>_<index>``); returns how many changed.

    Plans, override files and summaries refer to nodes by name, so every node needs one.
    """
    seen: set[str] = set()
    changed = 0
    for i, n in enumerate(model.graph.node):
        name = n.name
        if not name or name in seen:
            base = f"{n.op_type}_{i}"
            name = base
            k = 1
            while name in seen:
                name = f"{base}_{k}"
                k += 1
            n.name = name
            changed += 1
        seen.add(name)
    return changed


def describe(plan: Plan) -> Iterable[str]:
    """One line per decision, for logs and debugging."""
    for s in plan.sites:
        yield f"Q/DQ  {s.tensor}  [{s.rule}] group={s.group} -> {', '.join(s.consumers)}"
    for w in plan.weights:
        yield f"W-DQ  {w.tensor}  axis={w.axis}  ({w.node})"
    for t in plan.commuted:
        yield f"INT8  {t}  [data-movement]"
    for f in plan.floats:
        yield f"float {f.tensor}  [{f.rule}]"
