"""The precision gate: check a ``FusionReport`` against a ``Policy``; the result is a value.

``GateResult`` is truthy when the engine passes and its ``str()`` names what failed (or the figures
that made it pass), like Polygraphy's comparison results, so callers write
``if not (res := apply_gate(report, policy)): print(res)``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Any, Optional

from edgeq.errors import ReportError
from edgeq.report.fusion import FusionReport, LayerKind, ReportLayer
from edgeq.report.policy import Policy
from edgeq.text import plural

MAX_LISTED = 12  # violations spelled out in str(); the rest are counted


@dataclass(frozen=True)
class Violation:
    rule: str
    layer: int  # engine layer index
    layer_name: str
    layer_type: str
    message: str
    nodes: tuple[str, ...] = ()
    allowed_by: Optional[str] = None  # the allowlist entry that excused it

    def __str__(self) -> str:
        return f"[{self.rule}] #{self.layer} {self.layer_type} {_quote(self.layer_name)}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "layer": self.layer,
            "layer_name": self.layer_name,
            "layer_type": self.layer_type,
            "message": self.message,
            "nodes": list(self.nodes),
            "allowed_by": self.allowed_by,
        }


@dataclass(frozen=True)
class GateResult:
    """The verdict: ``bool(result)`` is True when the engine passes."""

    policy: Policy
    violations: tuple[Violation, ...]
    allowed: tuple[Violation, ...] = ()  # would have failed, excused by the allowlist
    checked: int = 0  # layers the policy looked at (compute + reformat inside the region)
    boundary_reformats: int = 0
    int8_compute: int = 0
    copies: tuple[Violation, ...] = ()  # same-format interior copies the policy reports but passes
    copies_ms: Optional[float] = None  # their profiled time (None without a profile)

    def __bool__(self) -> bool:
        return not self.violations

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def offending_layers(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(v.layer for v in self.violations))

    def by_rule(self) -> dict[str, list[Violation]]:
        out: dict[str, list[Violation]] = {}
        for v in self.violations:
            out.setdefault(v.rule, []).append(v)
        return out

    def summary(self) -> str:
        """One line: the verdict and the figures behind it."""
        if not self.policy.checks_anything:
            return f"gate {self.policy.name}: not applied (report only)"
        by_source: dict[str, int] = {}
        for v in self.allowed:  # credit each allowance where it came from: --allow or a file's gate.allow
            src = self.policy.allow_source(v.allowed_by)
            by_source[src] = by_source.get(src, 0) + 1
        extra = "".join(f", {n} excused by {src}" for src, n in by_source.items())
        if self.copies:
            t = f", {self.copies_ms:.3f} ms" if self.copies_ms is not None else ""
            extra += f", {plural(len(self.copies), 'same-format copy', 'same-format copies')}{t} reported"
        if self.passed:
            checked = plural(self.checked, "layer")
            return (
                f"gate {self.policy.name}: passed ({checked} checked, {self.int8_compute} "
                f"INT8 compute, {plural(self.boundary_reformats, 'boundary reformat')} allowed{extra})"
            )
        counts = ", ".join(f"{len(v)} {rule}" for rule, v in self.by_rule().items())
        n = len(self.offending_layers)
        return (
            f"gate {self.policy.name}: FAILED on {plural(n, 'layer')} ({counts}) of "
            f"{self.checked} checked{extra}"
        )

    summary_line = summary  # the name other edgeq results use for their one-line verdict

    def __str__(self) -> str:
        lines = [self.summary()]
        for v in self.violations[:MAX_LISTED]:
            lines.append(f"  {v}")
        if len(self.violations) > MAX_LISTED:
            lines.append(f"  ... and {len(self.violations) - MAX_LISTED} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.to_dict(),
            "passed": self.passed,
            "summary": self.summary(),
            "checked": self.checked,
            "int8_compute": self.int8_compute,
            "boundary_reformats": self.boundary_reformats,
            "copies": [v.to_dict() for v in self.copies],
            "copies_ms": self.copies_ms,
            "violations": [v.to_dict() for v in self.violations],
            "allowed": [v.to_dict() for v in self.allowed],
        }


def _quote(name: str) -> str:
    """Names can hold control characters: show them escaped, never raw, in one-line messages; and whole,
    however long: it is the name a user copies into ``gate.allow``."""
    return repr(name)


def _allowed_by(rl: ReportLayer, allow: tuple[str, ...]) -> Optional[str]:
    names = (*rl.onnx_nodes, *rl.related_nodes, rl.name)
    for pattern in allow:
        for n in names:
            if n == pattern or fnmatchcase(n, pattern):
                return pattern
    return None


def _check_shaped(report: FusionReport, policy: Policy) -> None:
    """Layer information of an engine with dynamic inputs may name no format at all (TensorRT 8.6.0's
    inspector, with or without the context's input shapes set): one error saying so, not a precision
    violation on every layer."""
    from edgeq.report.parse import NO_SHAPES_FORMAT

    tensors = [t for rl in report.layers for t in (*rl.layer.inputs, *rl.layer.outputs)]
    unshaped = sum(1 for t in tensors if t.format is not None and t.format.raw == NO_SHAPES_FORMAT)
    if not unshaped or any(t.precision is not None for t in tensors):
        return
    raise ReportError(
        f"{report.source}: cannot apply gate '{policy.name}': the engine has dynamic input shapes and its "
        f"layer information names no precision: its {unshaped} tensor formats read '{NO_SHAPES_FORMAT}'",
        hint="inspect it at the shapes it is timed at with this edgeq's agent (either backend: it sets "
        "them and infers every tensor's shape first), or rebuild at one shape (--minShapes, --optShapes "
        "and --maxShapes the same), which TensorRT 8.6 makes static (edgeq rules unknown-precision)",
    )


def apply_gate(report: FusionReport, policy: Policy) -> GateResult:
    """Check every layer of ``report`` against ``policy``."""
    if not policy.checks_anything:
        return GateResult(policy, ())
    if not report.detailed:
        raise ReportError(
            f"{report.source}: cannot apply gate '{policy.name}': the engine was built with "
            "ProfilingVerbosity.LAYER_NAMES_ONLY, so its layer information has no precisions or formats",
            hint="rebuild with --profilingVerbosity=detailed (trtexec) or config.profiling_verbosity = "
            "trt.ProfilingVerbosity.DETAILED, or use --gate none",
        )
    _check_shaped(report, policy)
    found: list[tuple[ReportLayer, Violation]] = []
    copies: list[tuple[ReportLayer, Violation]] = []
    checked = boundary = int8 = 0
    for rl in report.layers:
        if rl.past_int8:  # float by the model's design: after the last INT8 layer (fusion_build)
            continue
        if rl.kind == LayerKind.COMPUTE and rl.region == "inside":
            checked += 1
            int8 += rl.precision == "INT8"
            if policy.precision and rl.precision is None:
                found.append((rl, _v("unknown-precision", rl, f"precision not printed ({rl.formats})")))
            elif policy.precision and rl.precision != policy.precision:
                found.append((rl, _v("int8-compute", rl, f"runs {rl.precision} ({rl.formats})")))
        elif rl.kind == LayerKind.REFORMAT:
            if rl.boundary:
                boundary += 1
            elif rl.region == "inside":
                checked += 1
                origin = f" (origin {rl.layer.origin})" if rl.layer.origin else ""
                if rl.same_format_copy:
                    copy = _v("interior-copy", rl, f"interior copy {rl.formats}{origin}")
                    if policy.forbid_interior_copies:
                        found.append((rl, copy))
                    else:
                        copies.append((rl, copy))
                elif policy.forbid_interior_reformats:
                    found.append((rl, _v("interior-reformat", rl, f"interior Reformat {rl.formats}{origin}")))
    if policy.require_fusion:
        by_index = {rl.index: rl for rl in report.layers}
        for u in report.unfused_residuals:
            add = by_index[u.add_layer]
            why = f"residual Add not fused into a convolution ({add.formats})"
            found.append((add, _v("unfused-residual", add, why)))
            if u.activation_layer is not None:
                act = by_index[u.activation_layer]
                why = f"activation after unfused residual Add #{add.index} runs as its own layer"
                found.append((act, _v("unfused-residual", act, why)))
    violations: list[Violation] = []
    allowed: list[Violation] = []
    for rl, v in found:
        pattern = _allowed_by(rl, policy.allow)
        if pattern:
            allowed.append(replace(v, allowed_by=pattern))
        else:
            violations.append(v)
    timed = [rl.time_ms for rl, _ in copies if rl.time_ms is not None]
    copies_ms = sum(timed) if copies and len(timed) == len(copies) else None
    return GateResult(
        policy,
        tuple(violations),
        tuple(allowed),
        checked,
        boundary,
        int8,
        copies=tuple(c for _, c in copies),
        copies_ms=copies_ms,
    )


def _v(rule: str, rl: ReportLayer, message: str) -> Violation:
    nodes = rl.onnx_nodes or rl.related_nodes
    return Violation(rule, rl.index, rl.name, rl.layer_type, message, tuple(nodes))
