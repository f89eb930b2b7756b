"""Engine out: parse TensorRT engine-inspector JSON and profiles, map layers to ONNX nodes, gate precision.

The data path, each step a value::

    layers = load_layers("engine.layers.json")          # or the Python inspector's JSON string
    report = build_report(layers, load_profile("engine.profile.json"), onnx_model="model.onnx")
    result = apply_gate(report, POLICIES["int8"])        # truthy when the engine passes
    report_to_dict(report, result); render_html(report, result)
"""

from __future__ import annotations

from edgeq.report.fusion import (
    FusionReport,
    LayerKind,
    OnnxMapping,
    ReportLayer,
    UnfusedResidual,
)
from edgeq.report.fusion_build import build_report
from edgeq.report.gate import GateResult, Violation, apply_gate
from edgeq.report.parse import EngineLayer, EngineLayers, Profile, TensorFormat, load_layers, load_profile
from edgeq.report.policy import POLICIES, RULES, Policy, policy_from_dict
from edgeq.report.render import render_html, report_to_dict

__all__ = [
    "POLICIES",
    "RULES",
    "EngineLayer",
    "EngineLayers",
    "FusionReport",
    "GateResult",
    "LayerKind",
    "OnnxMapping",
    "Policy",
    "Profile",
    "ReportLayer",
    "TensorFormat",
    "UnfusedResidual",
    "Violation",
    "apply_gate",
    "build_report",
    "load_layers",
    "load_profile",
    "policy_from_dict",
    "render_html",
    "report_to_dict",
]
