"""``edgeq lint``: TensorRT 8.6 rules that can be seen in an ONNX graph: what will not parse or build,
and what builds but will not fuse.

One table ``RULES``, each row with its id, level, one-line fix and source. The parser rows (operators,
types, opset, IR, shapes, INT64) are checked here against the 8.6 operator table (``optable``); the Q/DQ
forms the parser refuses and the fusion patterns are the registry's (``edgeq.graph.registry``): their
rows come from the pattern entries and ``registry.lint`` checks them, so lint reads the same matchers and
edge decisions placement acts on. Row shapes by ``needs``:

- ``graph``: ``(graph: gs.Graph) -> list[Finding]`` on an onnx-graphsurgeon graph;
- ``model``: ``(model: onnx.ModelProto) -> list[Finding]``, for what graphsurgeon does not keep
  faithfully (the opset imports and the IR version);
- ``registry``: a pattern's lint half.

``lint_model`` runs shape inference on a copy first so graph rules see tensor types. Levels: ERROR means
TensorRT 8.6 will not parse or build the model; WARNING means it builds but fuses less, runs layers in a
wider precision or copies data; INFO is worth knowing and costs little.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, Callable, Literal

from edgeq.docs import cite
from edgeq.errors import EdgeqError
from edgeq.findings import Finding, Level
from edgeq.graph import optable, registry
from edgeq.graph.patterns import (
    constant_dtype,
    constant_value,
    consumers,
    dtype_name,
    input_indices,
    is_constant,
    is_standard,
    iter_nodes,
    node_label,
)
from edgeq.text import noun, plural

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from edgeq.graph.shapes import InputShapes

SUPPORTED_TRT = ("8.6",)

# https://docs.nvidia.com/deeplearning/tensorrt/archives/tensorrt-861/developer-guide/index.html: chapter 7
# "Working with Quantized Types" (7.4 Explicit Quantization; 7.4.4 is anchored #qdq-placement-recs),
# chapter 8 "Working with Dynamic Shapes".
DEV_GUIDE = "TensorRT 8.6 Developer Guide"
FIXTURES = "tests/fixtures/trt86-h200"


@dataclass(frozen=True)
class Rule:
    """One TensorRT 8.6 rule: ``check`` finds its hits; the rest says what it means and why we believe it."""

    id: str
    level: Level
    summary: str
    fix: str
    source: str
    check: Callable[..., list[Finding]]
    needs: Literal["graph", "model", "inputs", "registry"] = "graph"


# --------------------------------------------------------------------------------------------------
# Parsing: operators, types, versions
# --------------------------------------------------------------------------------------------------


def check_op_unsupported(graph: gs.Graph) -> list[Finding]:
    """Operators the 8.6 parser has no importer for. Custom-domain ops need a plugin of that name."""
    missing: dict[str, list[str]] = {}
    custom: dict[str, list[str]] = {}
    for n in iter_nodes(graph):
        if is_standard(n):
            if not optable.is_supported(n.op) and not n.op.endswith("_TRT"):
                missing.setdefault(n.op, []).append(node_label(n))
        else:
            custom.setdefault(f"{n.domain}::{n.op}", []).append(node_label(n))
    out = [
        _finding(
            "op-unsupported",
            f"{op} is not in the TensorRT 8.6 ONNX parser's operator table ({plural(len(nodes), 'node')})",
            nodes,
        )
        for op, nodes in missing.items()
    ]
    out += [
        _finding(
            "op-unsupported",
            f"custom operator {op} ({plural(len(nodes), 'node')}): TensorRT 8.6 parses it only through a "
            "plugin "
            f"registered as '{op.split('::')[1]}'",
            nodes,
            level=Level.WARNING,
            fix="load the plugin at build time (trtexec --plugins=lib.so), or replace the operator",
        )
        for op, nodes in custom.items()
    ]
    return out


# Operators whose first input's type says nothing about what the layer computes in.
_TYPE_CHECK_SKIP = frozenset({"Cast", "Shape", "Size", "QuantizeLinear", "DequantizeLinear", "Constant"})


def check_op_type_unsupported(graph: gs.Graph) -> list[Finding]:
    """Operators whose data input has a type the 8.6 table does not list for them.

    INT64 tensors are left alone: the parser casts them to INT32 (see ``int64-weights``) and shape
    arithmetic is where they live. Types TensorRT 8.6 cannot hold at all (bfloat16, float8, int16, ...)
    are errors.
    """
    bad_type: dict[tuple[str, str], list[str]] = {}
    unlisted: dict[tuple[str, str], list[str]] = {}
    listed_types: dict[str, frozenset[str]] = {}  # op -> the 8.6 table's types, for the unlisted message
    for n in iter_nodes(graph):
        if not is_standard(n) or n.op in _TYPE_CHECK_SKIP:
            continue
        row = optable.op_support(n.op)
        if row is None or not row.types:
            continue
        if n.op == "ConstantOfShape":
            t = n.outputs[0] if n.outputs else None
        elif n.op == "Where":
            t = n.inputs[1] if len(n.inputs) > 1 else None
        else:
            t = n.inputs[0] if n.inputs else None
        if t is None or not t.name:
            continue
        name = dtype_name(constant_dtype(t))
        if name is None or name == "int64":
            continue
        trt_type = optable.TRT_TYPE_OF_ONNX.get(name)
        if trt_type is None:
            bad_type.setdefault((n.op, name), []).append(node_label(n))
        elif trt_type not in row.types:
            unlisted.setdefault((n.op, name), []).append(node_label(n))
            listed_types[n.op] = row.types
    out = [
        _finding(
            "op-type-unsupported",
            f"{op} reads {name}, a type TensorRT 8.6 does not support ({plural(len(nodes), 'node')})",
            nodes,
            level=Level.ERROR,
        )
        for (op, name), nodes in bad_type.items()
    ]
    out += [
        _finding(
            "op-type-unsupported",
            f"{op} reads {name}; the 8.6 table lists {', '.join(sorted(listed_types[op]))} "
            f"for {op} ({plural(len(nodes), 'node')})",
            nodes,
        )
        for (op, name), nodes in unlisted.items()
    ]
    return out


def check_opset_too_high(model: onnx.ModelProto) -> list[Finding]:
    """Opset above 17: name the nodes whose operator changed after opset 17 (those the 8.6 importers
    would read with the old semantics)."""
    import onnx

    from edgeq.graph.io import opset_of

    opset = opset_of(model)
    if opset <= optable.MAX_OPSET:
        return []
    changed: list[str] = []
    ops: set[str] = set()
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            since = onnx.defs.get_schema(n.op_type, opset, "").since_version
        except onnx.defs.SchemaError:
            continue
        if since > optable.MAX_OPSET:
            changed.append(n.name or n.op_type)
            ops.add(n.op_type)
    detail = f"; operators changed after 17: {', '.join(sorted(ops))}" if ops else ""
    return [
        _finding(
            "opset-too-high",
            f"opset {opset} > {optable.MAX_OPSET}, the newest the TensorRT 8.6 parser implements{detail}",
            changed,
        )
    ]


def check_ir_too_high(model: onnx.ModelProto) -> list[Finding]:
    if model.ir_version <= optable.MAX_IR_VERSION:
        return []
    return [
        _finding(
            "ir-too-high",
            f"IR version {model.ir_version} > {optable.MAX_IR_VERSION}: the 8.6 parser is built on onnx 1.13 "
            "(IR 8; an IR 9+ file is unmeasured on 8.6); older onnxruntime builds refuse IR 10+",
            [],
        )
    ]


def check_dynamic_shape(model: onnx.ModelProto, resolved: InputShapes) -> list[Finding]:
    """Inputs with symbolic or unknown dimensions: the engine needs an optimization profile. Info when
    edgeq resolves every such input's shape (``edgeq.graph.shapes``: ``--shapes``, or the exporter's:
    the build then has its profile, or the calibration data's), a warning naming a shape to give when not."""
    from edgeq.agent.shapes import describe_dims
    from edgeq.graph.shapes import dynamic_inputs, shapes_hint

    dyn = dynamic_inputs(model)
    if not dyn:
        return []
    listed = ", ".join(f"{name} {describe_dims(dims)}" for name, dims in dyn)
    names = [name for name, _ in dyn]
    if not resolved.missing:
        return [_finding("dynamic-shape", f"dynamic input dimensions: {listed}; edgeq builds and runs it at "
                         f"{resolved.describe()}, or at the --calib data's shapes", names, level=Level.INFO,
                         fix="nothing to do: --minShapes/--optShapes/--maxShapes (deploy) or --shapes "
                             "(clean, lint) to choose other shapes")]
    return [_finding("dynamic-shape", f"dynamic input dimensions: {listed}; nothing in the model says its "
                     "input size: the build needs --optShapes (deploy: else the --calib data's shapes)",
                     names,
                     fix=f"{shapes_hint(resolved.missing, '--optShapes')} (deploy; --shapes for clean and "
                         "lint), or export with fixed shapes")]


def placeholder_dims(graph: gs.Graph) -> dict[str, list[tuple[str, int]]]:
    """Dimension names that are not identifiers ('?', as paddle2onnx writes an unknown size) and name
    more than one input dimension: name -> [(input, axis)]. TensorRT 8.6 takes every dimension of one
    name as one size, so ``[-1, 3, '?', '?']`` cannot take a 48x192 input; no exporter means such a name
    as a tie (real ties are identifiers: ``batch``)."""
    uses: dict[str, list[tuple[str, int]]] = {}
    for t in graph.inputs:
        for axis, d in enumerate(getattr(t, "shape", None) or ()):
            if isinstance(d, str) and d and not d.isidentifier():
                uses.setdefault(d, []).append((t.name, axis))
    return {name: where for name, where in uses.items() if len(where) > 1}


def check_dim_name_shared(graph: gs.Graph) -> list[Finding]:
    """Input dimensions that share a placeholder name: TensorRT 8.6 refuses sizes that differ."""
    return [
        _finding(
            "dim-name-shared",
            f"{len(where)} input dimensions share the name {name!r} ("
            + ", ".join(f"{t} axis {a}" for t, a in where)
            + "): TensorRT 8.6 takes them as one size and fails the build when they differ ('Input "
            "dimensions with this name are inconsistent')",
            dict.fromkeys(t for t, _ in where),
        )
        for name, where in placeholder_dims(graph).items()
    ]


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def check_int64_weights(graph: gs.Graph) -> list[Finding]:
    """INT64 constants the parser casts to INT32: values that do not fit are clamped (WARNING); INT64
    constants fed to data inputs are shape arithmetic constant folding would remove (INFO).

    INT64 where the ONNX schema demands it (Reshape shape, Slice starts, Gather indices, ...) is normal
    and not reported. Slice's ``starts``/``ends`` of +-2**63-1 mean "to the end" and clamp harmlessly.
    """
    import numpy as np

    opset = graph.opset or 17
    clamped: list[str] = []
    foldable: list[str] = []
    seen: set[int] = set()
    for n in iter_nodes(graph):
        for t in n.inputs:
            if not t.name or id(t) in seen or not is_constant(t) or dtype_name(constant_dtype(t)) != "int64":
                continue
            seen.add(id(t))
            readers = [(c, j) for c in consumers(t) for j in input_indices(c, t)]
            v = constant_value(t)
            if v is not None and v.size:
                big = (v < _INT32_MIN) | (v > _INT32_MAX)
                sentinel = np.abs(v) >= 2**62
                if all(c.op == "Slice" and j in (1, 2) for c, j in readers):
                    big &= ~sentinel
                if bool(big.any()):
                    clamped.append(t.name)
                    continue
            if any(_input_accepts_float(c.op, c.domain, j, opset) for c, j in readers):
                foldable.append(t.name)
    out = []
    if clamped:
        out.append(
            _finding(
                "int64-weights",
                f"{plural(len(clamped), 'INT64 constant')} {noun(len(clamped), 'holds', 'hold')} values "
                "outside INT32: TensorRT 8.6 clamps "
                "them when it casts to INT32",
                clamped,
                level=Level.WARNING,
            )
        )
    if foldable:
        out.append(
            _finding(
                "int64-weights",
                f"{plural(len(foldable), 'INT64 constant')} {noun(len(foldable), 'feeds', 'feed')} "
                "computations (unfolded shape arithmetic): "
                "TensorRT 8.6 casts them to INT32 with a warning",
                foldable,
            )
        )
    return out


@cache
def _input_accepts_float(op: str, domain: str, index: int, opset: int) -> bool:
    """Is input ``index`` of ``op`` a generic data input (its type constraint admits float)?"""
    import onnx

    try:
        schema = onnx.defs.get_schema(op, opset, domain or "")
    except onnx.defs.SchemaError:
        return False
    if not schema.inputs:
        return False
    formal = schema.inputs[min(index, len(schema.inputs) - 1)]
    allowed = next(
        (c.allowed_type_strs for c in schema.type_constraints if c.type_param_str == formal.type_str), None
    )
    if allowed is None:
        return formal.type_str in ("tensor(float)", "tensor(float16)")
    return "tensor(float)" in allowed


def check_placement_unmeasured(graph: gs.Graph) -> list[Finding]:
    """Operators that read float activations and that no registry entry covers (``registry.uncovered``):
    what the rules would place there no engine of ours has shown."""
    found = registry.uncovered(graph)
    line = registry.unmeasured_line(found)
    if line is None:
        return []
    return [_finding("placement-unmeasured", line, [n for nodes in found.values() for n in nodes])]


# --------------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------------

_PARSE_RULES: tuple[Rule, ...] = (
    Rule(
        "op-unsupported",
        Level.ERROR,
        "operator not in the TensorRT 8.6 ONNX parser's table",
        "replace the operator, or build with a TensorRT plugin of that name",
        optable.SOURCE,
        check_op_unsupported,
    ),
    Rule(
        "op-type-unsupported",
        Level.WARNING,
        "operator fed a type the 8.6 table does not list for it",
        "cast to a listed type before the operator (FP32/FP16 for most float ops)",
        optable.SOURCE + ' ("Supported Types" column; INT64 cast to INT32, DOUBLE to FLOAT)',
        check_op_type_unsupported,
    ),
    Rule(
        "opset-too-high",
        Level.ERROR,
        "opset above 17",
        "run `edgeq clean` (converts the model down to opset 17)",
        "onnx-tensorrt release/8.6-GA docs/operators.md ('TensorRT 8.6 supports operators up to Opset 17')",
        check_opset_too_high,
        needs="model",
    ),
    Rule(  # info: no IR 9+ model was built on 8.6 here; which level it deserves is unmeasured
        "ir-too-high",
        Level.INFO,
        "IR version above 8",
        "run `edgeq clean` (sets IR version 8)",
        "onnx-tensorrt release/8.6-GA third_party/onnx at v1.13 (IR 8); "
        f"{FIXTURES}/*.build.log ('ONNX IR version: 0.0.7' for every model 8.6 built)",
        check_ir_too_high,
        needs="model",
    ),
    Rule(
        "dynamic-shape",
        Level.WARNING,
        "input with dynamic dimensions and no size to build it at",
        "build with --minShapes/--optShapes/--maxShapes (trtexec names), or export with fixed shapes",
        f"{DEV_GUIDE} §8 Working with Dynamic Shapes (optimization profiles)",
        check_dynamic_shape,
        needs="inputs",
    ),
    Rule(
        "dim-name-shared",
        Level.ERROR,
        "input dimensions sharing a placeholder name ('?')",
        "run `edgeq clean` (names each such dimension apart)",
        "measured: tests/fixtures/trt86-h100-dims/README.md (PP-OCR's direction classifier as paddle2onnx "
        "exports it, x [-1, 3, '?', '?'], H100: 'Error Code 4: Internal Error (?: Input dimensions with this "
        "name are inconsistent.)' for the implicit and the explicit build; named apart, the build went on)",
        check_dim_name_shared,
    ),
    Rule(
        "int64-weights",
        Level.INFO,
        "INT64 constants the parser casts to INT32",
        "run `edgeq clean` (folds constants and shape subgraphs)",
        f"measured: {FIXTURES}/yolo_ortfb.explicit.build.log (onnx2trt_utils.cpp:374 'INT64 weights ... "
        "Attempting to cast down to INT32'); onnx-tensorrt onnx2trt_utils.cpp convertINT64 ('One or more "
        "weights outside the range of INT32 was clamped')",
        check_int64_weights,
    ),
    Rule(
        "placement-unmeasured",
        Level.INFO,
        "operators no registry entry covers",
        "deploy with a target: its implicit engine decides the placement (--placement implicit)",
        "edgeq's pattern registry (edgeq/graph/trt86): the op types its entries are about",
        check_placement_unmeasured,
    ),
)



def _registry_rules() -> tuple[Rule, ...]:
    """The Q/DQ-form and fusion patterns' lint halves, as rows of the one table (checked together by
    ``registry.lint``, which needs every pattern's decisions at once)."""
    out = []
    for p in registry.REGISTRY:
        if p.lint is not None:
            out.append(Rule(p.id, p.lint.level, p.lint.summary, p.lint.fix, p.evidence, _by_registry,
                            needs="registry"))
    return tuple(out)


def _by_registry(graph: gs.Graph) -> list[Finding]:  # pragma: no cover - lint_model calls registry.lint
    raise AssertionError("registry rules are checked by registry.lint")


# Order: parsing (operators, versions), then what the parser accepts as Q/DQ, then what fuses.
_QDQ = tuple(r for r in _registry_rules() if registry.pattern(r.id).kind == "qdq")
_FUSE = tuple(r for r in _registry_rules() if registry.pattern(r.id).kind == "fusion")
RULES: tuple[Rule, ...] = (*_PARSE_RULES[:4], *_QDQ, *_PARSE_RULES[4:], *_FUSE)
RULES_BY_ID: dict[str, Rule] = {r.id: r for r in RULES}

# Rules whose findings mean "builds, but Q/DQ placement keeps layers from fusing": what the ``trt``
# placement must never produce.
FUSION_RULE_IDS: tuple[str, ...] = tuple(r.id for r in _FUSE)


def _finding(
    rule_id: str, message: str, nodes: Iterable[str], *, level: Level | None = None, fix: str | None = None
) -> Finding:
    rule = RULES_BY_ID[rule_id]
    return Finding(
        level=level or rule.level,
        rule=rule_id,
        message=message,
        fix=fix or rule.fix,
        source=cite(rule_id),  # the shipped section holds this rule's evidence (``Rule.source``)
        nodes=tuple(nodes),
        names="inputs" if rule.needs == "inputs" else "nodes",
    )


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------


def normalize_trt(version: str) -> str:
    """``8.6``, ``8.6.1``, ``8.6.2.3`` -> ``8.6``; anything else is a usage error naming what is supported."""
    v = str(version).strip()
    major_minor = ".".join(v.split(".")[:2])
    if major_minor in SUPPORTED_TRT:
        return major_minor
    raise EdgeqError(
        f"TensorRT {v!s} is not supported by edgeq lint",
        hint=f"supported: {', '.join(SUPPORTED_TRT)}",
        exit_code=2,
    )


def select_rules(rules: Iterable[str] | None = None) -> list[Rule]:
    """The rules to run; older ids of a pattern (``fuse-silu-residual``) select today's entry."""
    if rules is None:
        return list(RULES)
    wanted = list(dict.fromkeys(registry.canonical(r) for r in rules))
    unknown = [r for r in wanted if r not in RULES_BY_ID]
    if unknown:
        raise EdgeqError(f"unknown {noun(len(unknown), 'rule id')}: {', '.join(unknown)}",
                         hint=f"known: {', '.join(RULES_BY_ID)}")
    return [r for r in RULES if r.id in wanted]


def lint_model(
    model: onnx.ModelProto, *, trt: str = "8.6", rules: Iterable[str] | None = None, shapes: str = ""
) -> list[Finding]:
    """Every finding TensorRT ``trt`` would give this model, most severe first. The model is not changed.
    ``shapes``: ``--shapes`` (trtexec syntax), the dynamic inputs' shapes over the exporter's."""
    from edgeq.graph.io import typed_graph_from_model
    from edgeq.graph.shapes import input_shapes

    normalize_trt(trt)
    selected = select_rules(rules)
    resolved = input_shapes(model, shapes)  # a bad --shapes: said before any rule runs
    graph = typed_graph_from_model(model)
    found: list[Finding] = []
    for rule in selected:
        if rule.needs == "model":
            found.extend(rule.check(model))
        elif rule.needs == "inputs":
            found.extend(rule.check(model, resolved))
        elif rule.needs == "graph":
            found.extend(rule.check(graph))
    via_registry = [r.id for r in selected if r.needs == "registry"]
    if via_registry:
        found.extend(registry.lint(graph, via_registry))
    return sort_findings(found)


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    order = {r.id: i for i, r in enumerate(RULES)}
    return sorted(findings, key=lambda f: (f.level.rank, order.get(f.rule, len(order))))


def summarize(findings: Sequence[Finding]) -> dict[str, Any]:
    """Counts by level and by rule, for JSON output and reports."""
    by_level = {lv.value: sum(f.level == lv for f in findings) for lv in Level}
    by_rule: dict[str, int] = {}
    for f in findings:
        by_rule[f.rule] = by_rule.get(f.rule, 0) + 1
    return {"total": len(findings), "by_level": by_level, "by_rule": by_rule}
