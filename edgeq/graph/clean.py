"""``edgeq clean``: run the passes in order, name what still does not fit TensorRT 8.6, verify numerics.

Decision on what cannot be fixed: ``clean_model`` does not raise for it. Every exact fix is applied,
and what remains (an opset the converter cannot lower, uint8/asymmetric Q/DQ that is not an exact
shift, a Cast inside Q/DQ that changes the type, ...) comes back as ERROR findings naming the nodes.
The CLI writes the cleaned model and exits 1. ``GraphError`` is raised only for input that cannot be
processed at all (and by ``compare_models`` when onnxruntime cannot run a model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from edgeq.docs import cite
from edgeq.errors import ConfigError, GraphError
from edgeq.findings import Finding, Level, ProgressFn, no_progress
from edgeq.graph.passes import PASS_NAMES, PASSES
from edgeq.graph.passes.base import Change, CleanOptions, Unfit, quiet_graphsurgeon
from edgeq.graph.verify import Verification, compare_models

if TYPE_CHECKING:
    import onnx
    import onnx_graphsurgeon as gs

    from edgeq.graph.facts import Pattern
    from edgeq.graph.passes.base import GraphPass, ModelPass
    from edgeq.graph.shapes import InputShapes

__all__ = ["PASSES", "Change", "CleanOptions", "CleanResult", "clean_file", "clean_model", "fit_findings"]

PARSE_SOURCE = cite("parsing")


@dataclass(frozen=True)
class CleanResult:
    model: onnx.ModelProto
    changes: list[Change]
    findings: list[Finding]
    verification: Verification | None
    passes_run: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """No ERROR finding and verification (if run) within tolerance."""
        no_errors = not any(f.level == Level.ERROR for f in self.findings)
        return no_errors and (self.verification is None or bool(self.verification))

    def to_dict(self) -> dict[str, Any]:
        from edgeq.graph.io import opset_of

        return {
            "opset": opset_of(self.model),
            "ir_version": self.model.ir_version,
            "passes": list(self.passes_run),
            "changes": [c.to_dict() for c in self.changes],
            "findings": [f.to_dict() for f in self.findings],
            "verification": self.verification.to_dict() if self.verification is not None else None,
        }


def clean_model(
    model: onnx.ModelProto, options: CleanOptions = CleanOptions(), progress: ProgressFn = no_progress
) -> CleanResult:
    """Clean a copy of ``model`` for TensorRT 8.6; the argument is not modified."""
    import onnx

    unknown = [s for s in options.skip if s not in PASS_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown pass {', '.join(map(repr, unknown))}", hint=f"passes: {', '.join(PASS_NAMES)}"
        )
    # PyTorch's qint8 export pattern is recognized on the input: cleaning removes the Casts that mark it.
    torch_nodes = frozenset() if options.torch_qint8 else _torch_qint8_nodes(model)
    from edgeq.graph.shapes import input_shapes

    resolved = input_shapes(model, options.shapes)  # a bad --shapes is said before any work
    work = onnx.ModelProto()
    work.CopyFrom(model)
    passes = [p for p in PASSES if p.name not in options.skip]
    changes: list[Change] = []
    findings: list[Finding] = []
    graph: gs.Graph | None = None
    total = len(passes) + (1 if options.verify else 0)
    for i, p in enumerate(passes):
        progress("clean", i, total)
        if p.kind == "model":
            if graph is not None:
                work, graph = _export(graph, work), None
            try:
                # Pass.kind says which of the two signatures fn has (PASSES pairs them).
                work, done = cast("ModelPass", p.fn)(work, options)
            except Unfit as e:
                findings.append(
                    Finding(Level.ERROR, p.name, e.message, e.hint or "", PARSE_SOURCE, tuple(e.nodes))
                )
                done = []
        else:
            if graph is None:
                graph, dropped = _import(work)
                if dropped and "remove_unused" not in options.skip:
                    changes.append(
                        Change(
                            "remove_unused",
                            f"dropped {len(dropped)} initializers no node reads ({', '.join(dropped[:4])})",
                        )
                    )
            with quiet_graphsurgeon():
                done = cast("GraphPass", p.fn)(graph, options)
        changes.extend(done)
    if graph is not None:
        work = _export(graph, work)
    _check_result(work, model, options.skip)
    findings.extend(fit_findings(work, options, already={f.rule for f in findings}, torch_qint8=torch_nodes))
    verification = None
    if options.verify:
        progress("clean", len(passes), total)
        reference = _torch_repaired(model, options) if options.torch_qint8 else model
        if model.ir_version > work.ir_version:
            # The IR version is a file-format stamp; onnxruntime refuses ones newer than it knows
            # (onnx 1.23 writes IR 12+), so run the original graph under the cleaned model's stamp.
            stamped = onnx.ModelProto()
            stamped.CopyFrom(reference)  # the --torch-qint8 repair kept: it is what verify checks against
            stamped.ir_version = work.ir_version
            reference = stamped
        refolded = _refolded_qdq(changes, work)
        if refolded:
            from edgeq.graph.verify import without_qdq

            reference, checked = without_qdq(reference), without_qdq(work)
        else:
            checked = work
        verification = compare_models(
            reference, checked, atol=options.atol, rtol=options.rtol, seed=options.seed, widen_half=True,
            shapes=resolved.shapes, hint=_shapes_hint(resolved),
        )
        if resolved.shapes:
            note = f"dynamic inputs run at {resolved.describe()}"
            verification = dataclasses.replace(verification, notes=(*verification.notes, note))
        if refolded:
            verification = dataclasses.replace(verification, notes=(*verification.notes, refolded))
    if verification is not None and options.torch_qint8:
        if any(c.pass_name == "qdq_torch_qint8" for c in changes):
            note = ("reference: the input with only the --torch-qint8 repair applied (PyTorch's qint8 "
                    "arithmetic)")
        else:
            note = ("reference: the input itself: --torch-qint8 found no PyTorch qint8 tensor written as "
                    "uint8 (a quint8 export's Q/DQ are PyTorch's), nothing repaired")
        verification = dataclasses.replace(verification, notes=(*verification.notes, note))
    progress("clean", total, total)
    return CleanResult(work, changes, findings, verification, tuple(p.name for p in passes))


def _shapes_hint(resolved: InputShapes) -> str:
    """What to give when the input model does not run at the shapes verification tried."""
    from edgeq.graph.shapes import shapes_hint

    if resolved.missing:  # run at 1: nothing said the input's size
        return f"dynamic dimensions ran at 1 (nothing gives the input size): {shapes_hint(resolved.missing)}"
    if set(resolved.sources.values()) == {"--shapes"}:
        return "give --shapes the size the model runs at (trtexec syntax)"
    return f"other shapes: --shapes with the size the model runs at (trtexec syntax; tried {resolved.spec()})"


def clean_file(
    path: str | Path, options: CleanOptions = CleanOptions(), *, output: str | Path | None = None,
    progress: ProgressFn = no_progress,
) -> tuple[CleanResult, Path]:
    """``edgeq clean`` on files: (the result, where the model goes: ``<name>.clean.onnx`` unless
    ``output``). Written only when verification (if run) is within tolerance; the input and its external
    data are never written, and an unwritable destination fails before the work."""
    from edgeq.fs import check_writable
    from edgeq.graph.io import default_output, load_model, save_model

    dest = Path(output) if output is not None else default_output(Path(path), "clean")
    check_writable(dest, inputs=(Path(path),))
    read: list[Path] = []
    model = load_model(path, sources=read)
    check_writable(dest, inputs=tuple(read))  # -o onto the input's external data file
    result = clean_model(model, options, progress)
    if result.verification is None or bool(result.verification):
        save_model(result.model, dest)
    return result, dest


def _check_result(work: onnx.ModelProto, model: onnx.ModelProto, skip: tuple[str, ...]) -> None:
    """Never hand back a model the ONNX checker (with its strict type inference) rejects.

    A result is held to what its input meets: an input that fails the strict check too (a shape
    inference onnx cannot do, say) only needs a result that passes the plain checker; a failure
    there is one line, exit 2. So is a failure after a pass the user skipped. If the input passes and
    only the result fails, a pass broke a valid model: a bug in edgeq, which must look like one.
    """
    from edgeq.graph.io import check_model

    try:
        check_model(work, name="cleaned model", full=True)
    except GraphError as e:
        try:
            check_model(model, name="input model", full=True)
        except GraphError:
            check_model(work, name="cleaned model")
            return
        if skip:
            hint = f"nothing written; it may need the skipped {', '.join(skip)}"
            raise GraphError(e.message, hint=hint) from None
        raise RuntimeError(
            f"edgeq bug: {e.message}, though the input passes the checker; please report it with the model"
        ) from None


def _refolded_qdq(changes: list[Change], work: onnx.ModelProto) -> str:
    """Why verify compares float graphs, or '': fold_batchnorm changed a model with activation Q/DQ.

    Folding is exact in real arithmetic, but float32 rounds the product in another order; at an
    activation QuantizeLinear that can move a value across a rounding boundary, one int8 step, and the
    step travels through every later layer. The float graphs (``without_qdq``) show the fold itself."""
    if not any(c.pass_name == "fold_batchnorm" and c.message.startswith("folded") for c in changes):
        return ""
    if not any(n.op_type == "QuantizeLinear" for n in work.graph.node):
        return ""
    return ("compared as float graphs (activation Q/DQ as Identity, weights dequantized): fold_batchnorm "
            "reorders float32 arithmetic before activation QuantizeLinear nodes, where a value can round to "
            "the next int8 step")


def _torch_qint8_nodes(model: onnx.ModelProto) -> frozenset[str]:
    """Names of the Q/DQ nodes in PyTorch's qint8 export pattern (``passes.qdq.torch_qint8_pairs``)."""
    from edgeq.graph.io import graph_from_model
    from edgeq.graph.passes.qdq import torch_qint8_nodes

    if not any(n.op_type == "QuantizeLinear" for n in model.graph.node):
        return frozenset()
    with quiet_graphsurgeon():
        graph = graph_from_model(model)
    return frozenset(torch_qint8_nodes(graph))


def _torch_repaired(model: onnx.ModelProto, options: CleanOptions) -> onnx.ModelProto:
    """The input with only the --torch-qint8 repair applied: PyTorch's qint8 arithmetic, the reference
    that verification holds every other (exact) change to (the input itself where nothing was qint8)."""
    from edgeq.graph.passes.qdq import qdq_torch_qint8

    graph, _ = _import(model)
    with quiet_graphsurgeon():
        qdq_torch_qint8(graph, options)
    return _export(graph, model)


def _import(model: onnx.ModelProto) -> tuple[gs.Graph, list[str]]:
    from edgeq.graph.io import typed_graph_from_model

    with quiet_graphsurgeon():
        graph = typed_graph_from_model(model)  # dtypes and static shapes for no-op Casts and shape folding
    graph.ir_version = model.ir_version
    used = {t.name for t in graph.tensors().values()}
    dropped = [t.name for t in model.graph.initializer if t.name not in used]
    return graph, dropped


def _export(graph: gs.Graph, like: onnx.ModelProto) -> onnx.ModelProto:
    from edgeq.graph.io import model_from_graph

    with quiet_graphsurgeon():
        out = model_from_graph(graph, like=like)
    # Shapes are re-inferred where needed; stale value_info from before the passes would mislead.
    del out.graph.value_info[:]
    return out


def fit_findings(
    model: onnx.ModelProto,
    options: CleanOptions = CleanOptions(),
    already: set[str] | frozenset[str] = frozenset(),
    torch_qint8: frozenset[str] = frozenset(),
) -> list[Finding]:
    """What still keeps the model from TensorRT 8.6 after cleaning, with the nodes named (read-only).

    The Q/DQ forms are the registry's (``edgeq.graph.trt86.qdq``: the same checks lint runs), each said
    with what to do now that clean's passes could not repair it. ``torch_qint8`` names the Q/DQ nodes
    that were PyTorch's qint8 export pattern in the input (cleaning removed the Casts that mark it):
    all of them are reported as what they are, with the repair flag, rather than as uint8 Q/DQ to
    re-quantize (or not at all where an exact pass made a uint8 128 int8 0: still not PyTorch's values).
    """
    from edgeq.graph import registry
    from edgeq.graph.io import graph_from_model, opset_of
    from edgeq.graph.trt86.qdq import torch_qint8_message

    with quiet_graphsurgeon():
        graph = graph_from_model(model)
    out: list[Finding] = []
    named: set[str] = set(torch_qint8)
    if torch_qint8:  # all of them: a uint8 128 that cleaning made int8 0 is still not what PyTorch computed
        nodes = tuple(sorted(torch_qint8))
        out.append(_fit(registry.pattern("qdq-torch-qint8"), nodes, torch_qint8_message(len(nodes))))
    for f in registry.lint(graph, registry.ids("qdq")):
        if f.rule == "qdq-torch-qint8":
            continue  # the input's, above: cleaning removed the Casts that mark them
        rest = tuple(n for n in f.nodes if n not in named)
        if not rest:
            continue  # one problem per node (a uint8 zero-point 5 is not also 'asymmetric')
        named.update(rest)
        out.append(_fit(registry.pattern(f.rule), rest, f.message if rest == f.nodes else
                        f"{len(rest)} of: {f.message}"))
    opset = opset_of(model)
    if opset > options.opset and "convert_opset" not in already:
        out.append(Finding(Level.ERROR, "convert_opset",
                           f"opset {opset} > {options.opset}: the 8.6 parser follows opset <= 17",
                           "do not skip convert_opset, or re-export at opset 17", cite("opset-too-high")))
    if model.ir_version > options.ir_version and "set_ir_version" not in already:
        out.append(Finding(Level.ERROR, "set_ir_version", f"IR version {model.ir_version} > "
                           f"{options.ir_version}",
                           "do not skip set_ir_version", cite("ir-too-high")))
    return out


def _fit(p: Pattern, nodes: tuple[str, ...], message: str) -> Finding:
    assert p.lint is not None  # every Q/DQ-form pattern has a lint half
    return Finding(p.lint.level, p.id, message, p.clean_fix or p.lint.fix, cite(p.id), nodes)
