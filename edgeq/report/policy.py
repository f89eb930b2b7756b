"""Gate policies as data: what an engine must look like to pass, and where each rule comes from.

A policy is a value (``Policy``), not code: the CLI picks one by name (``--gate int8``), a mapping can
describe one (``policy_from_dict``), and ``edgeq.report.gate.apply_gate`` checks a ``FusionReport``
against it. A target's or pipeline's ``gate:`` section is read by ``edgeq.remote.targets.gate_from_dict``
(its one schema: policy, allow as a list, require_fusion) and reaches ``policy_from_dict`` through
``edgeq.orchestration.deploy.policy_for``.

Mapping shape accepted by ``policy_from_dict``::

    gate:
      policy: int8            # a name from POLICIES (alias: "gate"); default int8
      require_fusion: true    # also fail on residual Adds left unfused (default: the policy's)
      forbid_copies: true     # also fail on same-format interior copies (default: reported only)
      allow:                  # ONNX node names (or engine layer names) excused from the gate;
        - /head/Softmax       # shell-style wildcards allowed: "/detect/*"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from edgeq.errors import ConfigError


@dataclass(frozen=True)
class Rule:
    id: str
    description: str
    source: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "int8-compute",
            "a compute layer inside the INT8 region runs in a wider precision (FP16/FP32)",
            "edgeq/docs/trt86-rules.md#int8-compute (INT8 everywhere between the first Q and the last DQ); "
            "measured: fixtures resnet50.implicit.layers.json (54 FP16 layers, only the stem ran INT8)",
        ),
        Rule(
            "interior-reformat",
            "a Reformat inside the network that changes precision or layout (not at an input/output "
            "binding, not the first Q or last DQ)",
            "edgeq/docs/trt86-rules.md#interior-reformat (interior Reformat layers are what the gate must "
            "catch); measured: fixtures resnet50_ortfb.explicit.layers.json, INT8 NC/32HW32 -> INT8 NCHW "
            "copy before the final squeeze",
        ),
        Rule(
            "interior-copy",
            "a Reformat inside the network that keeps precision and layout (INT8 NC/32HW32 -> INT8 "
            "NC/32HW32): TensorRT builds a Concat or Slice as copies, not a fallback; reported, and fails "
            "only with forbid_copies",
            "edgeq/docs/trt86-rules.md#interior-copy; measured: fixtures trt86-h200-edgeq/yolo_fix2.explicit."
            "layers.json and "
            "yolo_edgeq.implicit.layers.json, 19 INT8 -> INT8 same-format copies with Origin CONCAT in "
            "both (981 vs 980 qps)",
        ),
        Rule(
            "unknown-precision",
            "a compute layer whose tensor formats the inspector did not print: INT8 cannot be proven",
            "TensorRT C++ API, IEngineInspector::setExecutionContext (without a context, format "
            "information is not shown for shape-dependent tensors)",
        ),
        Rule(
            "unfused-residual",
            "a residual Add (and the Relu after it) left as its own point-wise layer instead of fused "
            "into the convolution that feeds it",
            "edgeq/docs/trt86-rules.md#unfused-residual (residual Add: quantize the skip "
            "branch only); measured: fixtures resnet50_ortfb.explicit.layers.json, 16 PWN(Add, Relu) "
            "PointWiseV2 layers, 0.73x implicit throughput",
        ),
    )
}

# What a policy lets through without a rule firing, with the reason (shown in reports).
EXEMPTIONS: dict[str, str] = {
    "boundary-reformat": "Reformat at a network input/output binding, or the first Q / last DQ of the INT8 "
    "region: expected (edgeq/docs/trt86-rules.md#reading-an-engine)",
    "weights": "Constant layers and copies of constants (MyelinReformat/Reformat 'Identity_N' into a conv "
    "bias) are weights, not compute (edgeq/docs/trt86-rules.md#reading-an-engine)",
    "outside-region": "layers before the first Q or after the last DQ of an explicit engine are outside the "
    "INT8 region (edgeq/docs/trt86-rules.md#gate)",
    "no-op": "NoOp layers move no data",
}


@dataclass(frozen=True)
class Policy:
    """What an engine must satisfy. ``allow`` holds ONNX node (or layer) names, wildcards allowed."""

    name: str
    description: str
    source: str
    precision: Optional[str] = "INT8"  # required compute precision inside the region; None: unchecked
    forbid_interior_reformats: bool = True  # precision- or layout-changing reformats
    forbid_interior_copies: bool = False  # same-precision, same-layout copies (Concat/Slice)
    require_fusion: bool = False
    allow: tuple[str, ...] = ()
    # where each allowed name came from ("--allow", "gate.allow in targets/x.yaml"): the verdict credits it
    allow_from: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules this policy enforces."""
        ids = []
        if self.precision:
            ids += ["int8-compute", "unknown-precision"]
        if self.forbid_interior_reformats:
            ids.append("interior-reformat")
        if self.forbid_interior_copies:
            ids.append("interior-copy")
        if self.require_fusion:
            ids.append("unfused-residual")
        return tuple(RULES[i] for i in ids)

    @property
    def checks_anything(self) -> bool:
        return bool(self.rules)

    def replace(self, **changes: Any) -> Policy:
        return dataclasses.replace(self, **changes)

    def with_allow(self, names: tuple[str, ...] | list[str], source: str = "--allow") -> Policy:
        """More allowed names, each remembered with where it came from (the first source of a name wins)."""
        sources = dict(self.allow_from)
        for n in names:
            sources.setdefault(n, source)
        allow = tuple(dict.fromkeys((*self.allow, *names)))
        return self.replace(allow=allow, allow_from=tuple(sources.items()))

    def allow_source(self, name: Optional[str]) -> str:
        """Where an allowed name came from; ``--allow`` when not recorded."""
        return dict(self.allow_from).get(name or "", "--allow")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "precision": self.precision,
            "forbid_interior_reformats": self.forbid_interior_reformats,
            "forbid_interior_copies": self.forbid_interior_copies,
            "require_fusion": self.require_fusion,
            "allow": list(self.allow),
            "rules": [dataclasses.asdict(r) for r in self.rules],
        }


POLICIES: dict[str, Policy] = {
    "int8": Policy(
        name="int8",
        description="INT8 everywhere between the network's first Q and last DQ: no FP16/FP32 compute and "
        "no precision- or layout-changing Reformat inside; same-format copies (Concat/Slice) reported; "
        "reformats at the inputs/outputs and weight layers allowed",
        source="edgeq/docs/trt86-rules.md#gate; measured: fixtures trt86-h200-edgeq/yolo_fix2.explicit",
    ),
    "fusion": Policy(
        name="fusion",
        description="every residual Add fused into its convolution (opt-in; --require-fusion adds it to "
        "another policy)",
        source=RULES["unfused-residual"].source,
        precision=None,
        forbid_interior_reformats=False,
        require_fusion=True,
    ),
    "none": Policy(
        name="none",
        description="report only, no gate",
        source="edgeq/docs/trt86-rules.md#gate (--gate none)",
        precision=None,
        forbid_interior_reformats=False,
    ),
}

_KEYS = ("policy", "gate", "require_fusion", "forbid_copies", "allow")


def policy_from_dict(d: Optional[Mapping[str, Any]], where: str = "gate", source: Optional[str] = None
                     ) -> Policy:
    """A policy from config (a target's or pipeline's ``gate:`` mapping); see the module docstring.
    ``source`` names the file its ``allow`` came from, for the verdict ("gate.allow in FILE")."""
    if d is None:
        return POLICIES["int8"]
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a mapping with keys {', '.join(_KEYS)}, got {type(d).__name__}")
    unknown = [k for k in d if k not in _KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}'", hint=f"valid keys: {', '.join(_KEYS)}")
    if "policy" in d and "gate" in d:
        raise ConfigError(f"{where}: give 'policy' or 'gate', not both")
    name = d.get("policy", d.get("gate", "int8"))
    if name is None or name is False:
        name = "none"
    if not isinstance(name, str) or name not in POLICIES:
        raise ConfigError(f"{where}.policy: unknown policy {name!r}", hint=f"one of: {', '.join(POLICIES)}")
    policy = POLICIES[name]
    if "require_fusion" in d:
        rf = d["require_fusion"]
        if not isinstance(rf, bool):
            raise ConfigError(f"{where}.require_fusion: expected true or false, got {rf!r}")
        policy = policy.replace(require_fusion=rf)
    if "forbid_copies" in d:
        fc = d["forbid_copies"]
        if not isinstance(fc, bool):
            raise ConfigError(f"{where}.forbid_copies: expected true or false, got {fc!r}")
        policy = policy.replace(forbid_interior_copies=fc)
    allow = d.get("allow") or []
    if isinstance(allow, str):
        allow = [allow]
    if not isinstance(allow, (list, tuple)) or not all(isinstance(a, str) and a for a in allow):
        raise ConfigError(f"{where}.allow: expected a list of ONNX node names")
    return policy.with_allow(list(allow), source=f"gate.allow in {source}" if source else "gate.allow")
