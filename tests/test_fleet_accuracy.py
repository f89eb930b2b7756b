"""Fleet rows carry the engine's accuracy on the held-out set, as deploy reports it: each board's engine
runs on the same held-out inputs, its figure (beside onnxruntime's prediction) is a matrix column and a
``--json`` field, and an accuracy gate fails only the board whose engine drifts.

Two real OpenSSH sshd on 127.0.0.1 whose trtexec is the stand-in of tests/trtexec_replay.py: its
``--exportOutput`` runs the built ONNX model in onnxruntime (shifted by 1 on the drifting board). This
proves the fleet's plumbing of the accuracy stage, not TensorRT.
"""

from __future__ import annotations

import numpy as np
import pytest
from fleet_helpers import FIXTURES, ORTFB, Member, qdq_model, write_fleet
from trtexec_replay import Recorded, replay_trtexec


@pytest.mark.sshd
def test_fleet_rows_carry_each_boards_engine_accuracy(boards, servers):
    from edgeq.orchestration.fleet import FleetOptions, matrix, validate
    from edgeq.orchestration.fleet_file import load_fleet
    from edgeq.quant.quantize import QuantizeOptions

    root = boards
    members = []
    for i, (server, shift) in enumerate(zip(servers[:2], (0.0, 1.0))):
        name = f"board{i + 1}"
        (root / f"bin-{name}").mkdir()
        trtexec = replay_trtexec(root / f"bin-{name}", build=Recorded(FIXTURES / f"{ORTFB}.build.log"),
                                 run=Recorded(FIXTURES / f"{ORTFB}.run.log"),
                                 layers=FIXTURES / f"{ORTFB}.layers.json",
                                 profile=FIXTURES / f"{ORTFB}.profile.json", outputs_shift=shift)  # fmt: skip
        members.append(Member(name, server, trtexec, root / f"remote-{name}"))
    fleet = load_fleet(write_fleet(root, members, allow="none"))
    model = qdq_model(root / "net.onnx")
    (root / "holdout").mkdir()
    np.save(root / "holdout" / "h.npy", np.random.default_rng(4).standard_normal((3, 3, 32, 32), np.float32))
    # --metric cosine: the net's (1, 10) logits would be judged by their labels, which a shift keeps
    options = FleetOptions(quantize=QuantizeOptions(holdout_data=root / "holdout", metric="cosine"),
                           gate="none", accuracy_gate=True, runs_dir=root / "runs")  # fmt: skip
    result = validate(model, fleet, options)

    rows = {r.target: r for r in result.rows}
    good, drifting = rows["board1"], rows["board2"]
    assert good.status == "passed" and good.accuracy_passed is True
    assert good.accuracy is not None and good.accuracy.startswith("cosine 1.000 (Q/DQ 1.000)")
    assert drifting.status == "failed" and drifting.accuracy_passed is False and drifting.gate is False
    assert "below onnxruntime's prediction" in (drifting.error or "")
    cells = {c["target"]: c for c in matrix(result)}
    assert cells["board1"]["accuracy"] == good.accuracy and cells["board2"]["accuracy"] == drifting.accuracy
    as_json = {r["target"]: r for r in result.to_dict()["targets"]}
    assert as_json["board2"]["accuracy"] == drifting.accuracy
    assert as_json["board2"]["accuracy_passed"] is False
    assert result.exit_code == 1
