"""The golden placement: where ``--placement trt`` puts every Q/DQ on each test model, as plain data.

``python tests/placement_golden.py`` rewrites ``tests/fixtures/placement-golden.json`` from today's code.
Do that only when a placement change is meant, and say in the commit which models moved and why:
``test_golden_placement.py`` fails on any other change (the registry refactor must move nothing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "placement-golden.json"
SKELETONS = ROOT / "tests" / "fixtures" / "trt86-h100-zoo" / "skeletons"


def models() -> dict[str, Callable[[], Any]]:
    """Every zoo model the tests quantize, and the four torchvision graphs behind the H100 engines."""
    from edgeq import zoo

    out: dict[str, Callable[[], Any]] = {
        "resnet_like": lambda: zoo.resnet_like(),
        "resnet_like_bottleneck": lambda: zoo.resnet_like(bottleneck=True, layers=(2, 2)),
        "resnet_like_relu6_avgpool": lambda: zoo.resnet_like(stem_act="relu6", tail="avgpool"),
        "resnet_like_leakyrelu_mean": lambda: zoo.resnet_like(stem_act="leakyrelu", tail="mean"),
        "resnet50": lambda: zoo.resnet50(size=64, width=8),  # the graph the tests quantize
        "yolo_like": lambda: zoo.yolo_like(),
        "yolo_like_slice": lambda: zoo.yolo_like(split="slice"),
        "unet_like": lambda: zoo.unet_like(),
    }
    for path in sorted(SKELETONS.glob("*.skel.onnx")):
        out[path.name.split(".")[0]] = lambda p=path: zoo.skeleton(p)
    return out


def signature(model: Any) -> dict[str, Any]:
    """Sites with their consumers, weights with their axis, and the scale groups (commuted tensors in)."""
    from edgeq.graph.io import graph_from_model
    from edgeq.quant.placement import plan_placement
    from edgeq.quant.quantize import prepare_model

    prepared, _, _ = prepare_model(model)
    plan = plan_placement(graph_from_model(prepared), "trt")
    groups: dict[str, list[str]] = {}
    for t, gid in plan.group_ids.items():
        groups.setdefault(gid, []).append(t)
    return {
        "sites": {s.tensor: sorted(s.consumers) for s in plan.sites},
        "weights": {w.tensor: w.axis for w in plan.weights},
        "groups": sorted(sorted(m) for m in groups.values() if len(m) > 1),
    }


def main() -> None:
    data = {name: signature(build()) for name, build in models().items()}
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)}: {', '.join(data)}", file=sys.stderr)


if __name__ == "__main__":
    main()
