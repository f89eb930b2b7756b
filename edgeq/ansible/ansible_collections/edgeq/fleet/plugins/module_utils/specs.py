"""The options of the edgeq.fleet modules, one table each, read by their action plugins (and checked
against each module's DOCUMENTATION by edgeq's tests)."""

from __future__ import annotations

FACTS: dict = {}

ENGINE: dict = {
    "model": {"type": "path"},
    "prepared": {"type": "path"},
    "calib_cache": {"type": "path"},
    "dest": {"type": "path", "default": "runs/ansible"},
    "previous": {"type": "path"},
    "gate": {"type": "str"},
    "gate_allow": {"type": "list", "elements": "str", "default": []},
    "gate_require_fusion": {"type": "bool"},
    "fp16": {"type": "bool"},
    "iterations": {"type": "int", "default": 10},
    "duration": {"type": "float", "default": 3.0},
    "min_shapes": {"type": "str", "default": ""},
    "opt_shapes": {"type": "str", "default": ""},
    "max_shapes": {"type": "str", "default": ""},
    "build_once_per_kind": {"type": "bool", "default": False},
}
ENGINE_RULES: dict = {"mutually_exclusive": [["model", "prepared"]],
                      "required_one_of": [["model", "prepared"]]}

RELEASE: dict = {
    "state": {"type": "str", "default": "installed", "choices": ["installed", "rolled_back", "status"]},
    "bundle": {"type": "path"},
    "allowed_signers": {"type": "path"},
    "gate": {"type": "str"},
    "min_ratio": {"type": "float", "default": 0.9},
    "iterations": {"type": "int", "default": 10},
    "duration": {"type": "float", "default": 3.0},
}
RELEASE_RULES: dict = {"required_if": [["state", "installed", ["bundle"]]]}
