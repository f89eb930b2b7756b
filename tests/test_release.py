"""``edgeq release``: a bundle from a fleet run on three loopback sshd targets (tests/fleet_helpers.py),
byte-identical when made twice, and ``verify`` naming each kind of damage distinctly."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest
from fleet_helpers import make_members, qdq_model, reformat_layer, write_fleet

from edgeq.release.bundle import MANIFEST


@pytest.fixture(scope="module")
def released(servers, tmp_path_factory):
    """``edgeq release MODEL --fleet`` once, then ``--from`` the same fleet directory: two bundles."""
    from edgeq.cli import run

    root = tmp_path_factory.mktemp("release")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
    mp.delenv("SOURCE_DATE_EPOCH", raising=False)
    try:
        fleet = write_fleet(root, make_members(root, servers), reformat_layer())
        model = qdq_model(root / "net.onnx")
        assert run(["release", str(model), "--fleet", str(fleet), "-o", str(root / "a.tar.gz")]) == 0
        (fleet_dir,) = (root / "runs").iterdir()
        assert run(["release", "--from", str(fleet_dir), "-o", str(root / "b.tar.gz")]) == 0
    finally:
        mp.undo()
    return root, fleet_dir


def _members(path):
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: (m, tar.extractfile(m).read()) for m in tar.getmembers()}


def _rewrite(src, dst, change):
    """A copy of bundle ``src`` with its {name: bytes} passed through ``change``."""
    files = {n: d for n, (_, d) in _members(src).items()}
    files = change(files)
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dst.write_bytes(raw.getvalue())
    return dst


@pytest.mark.sshd
def test_bundle_is_byte_identical_complete_and_verifies(released, cli):
    root, fleet_dir = released
    a, b = (root / "a.tar.gz").read_bytes(), (root / "b.tar.gz").read_bytes()
    assert a == b  # same fleet run -> same bytes (sorted entries, fixed mtimes and owners, gzip mtime 0)
    members = _members(root / "a.tar.gz")
    names = sorted(members)
    assert names == sorted(set(names)) and list(members) == sorted(members)  # sorted in the archive
    assert all(m.uid == 0 and m.gid == 0 and m.uname == "" for m, _ in members.values())
    manifest = json.loads(members[MANIFEST][1])
    assert manifest["format"] == "edgeq-release/1"
    # one engine per kind: three identical boards (same sm + TensorRT) -> one engine
    assert list(manifest["engines"]) == ["sm9.0-trt8.6.0"]
    engine_entry = manifest["engines"]["sm9.0-trt8.6.0"]
    assert (engine_entry["tensorrt"], engine_entry["compute_capability"]) == ("8.6.0", "9.0")
    assert {t["name"] for t in manifest["targets"]} == {"board1", "board2", "board3"}
    listed = {f["path"] for f in manifest["files"]}
    assert listed == set(names) - {MANIFEST}
    assert {"model/net.clean.onnx", "engines/sm9.0-trt8.6.0/engine.plan",
            "reports/board2/report.html"} <= listed  # fmt: skip
    src = (root / "net.onnx").read_bytes()
    import hashlib

    assert manifest["source_model"]["sha256"] == hashlib.sha256(src).hexdigest()
    engine = members["engines/sm9.0-trt8.6.0/engine.plan"][1]
    assert engine == (fleet_dir / "targets" / "board1" / "engine.plan").read_bytes()
    rows = json.loads((fleet_dir / "fleet.json").read_text())["targets"]
    assert engine_entry["built_on"] == next(r["target"] for r in rows if r["build"] == "ok")  # the builder

    code, out, _ = cli("release", "verify", root / "a.tar.gz")
    assert code == 0 and "OK, " in out
    code, out, _ = cli("release", "inspect", root / "a.tar.gz")
    assert code == 0 and f"{len(manifest['files'])} files" in out and "board1" in out
    code, out, _ = cli("release", "inspect", root / "a.tar.gz", "--json")
    assert code == 0 and json.loads(out) == manifest


@pytest.mark.sshd
def test_verify_names_each_kind_of_damage(released, cli, tmp_path):
    root, _ = released
    good = root / "a.tar.gz"
    engine = "engines/sm9.0-trt8.6.0/engine.plan"

    def flip(files):
        data = bytearray(files[engine])
        data[len(data) // 2] ^= 0x01
        return {**files, engine: bytes(data)}

    def edit_manifest(files):
        m = json.loads(files[MANIFEST])
        m["targets"][0]["gate"] = not m["targets"][0]["gate"]
        m["edgeq"] = "9.9.9"
        return {**files, MANIFEST: json.dumps(m).encode()}

    cases = {
        "modified": flip,
        "missing": lambda f: {k: v for k, v in f.items() if k != "reports/board3/report.json"},
        "extra": lambda f: {**f, "engines/sm9.0-trt8.6.0/backdoor.so": b"\x7fELF"},
        "manifest": edit_manifest,
    }
    lines = {}
    for kind, change in cases.items():
        bad = _rewrite(good, tmp_path / f"{kind}.tar.gz", change)
        code, out, err = cli("release", "verify", bad, "--json")
        assert code == 1, (kind, out, err)
        problems = json.loads(out)["problems"]
        assert {p["kind"] for p in problems} == {kind}, problems
        code, out, _ = cli("release", "verify", bad)
        assert code == 1 and f"[{kind}]" in out
        lines[kind] = out
    assert len(set(lines.values())) == 4

    # a byte flipped in the compressed archive itself: corrupt, one line, exit 1
    raw = bytearray(good.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "corrupt.tar.gz").write_bytes(bytes(raw))
    code, out, err = cli("release", "verify", tmp_path / "corrupt.tar.gz")
    assert code == 1 and "corrupt bundle" in err and "Traceback" not in out + err
    code, _, err = cli("release", "verify", tmp_path / "nope.tar.gz")
    assert code == 2 and "no such bundle" in err


def test_release_needs_a_source_and_refuses_a_failed_fleet(tmp_path, cli):
    code, _, err = cli("release", "-o", tmp_path / "x.tar.gz")
    assert code == 2 and "--from" in err
    d = tmp_path / "fleet"
    d.mkdir()
    fleet = {"passed": False, "targets": [{"target": "orin", "status": "failed"}]}
    (d / "fleet.json").write_text(json.dumps(fleet))
    code, _, err = cli("release", "--from", d, "-o", tmp_path / "x.tar.gz")
    assert code == 1 and "orin did not pass" in err
    assert not (tmp_path / "x.tar.gz").exists()


def test_one_engine_per_kind_across_kinds(tmp_path, cli, monkeypatch):
    """A fleet of two Orins, a Xavier and a board whose GPU is unknown: three engines, each kind's from
    the first of its targets; SOURCE_DATE_EPOCH fixes the creation time (reproducible-builds.org)."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    fleet = tmp_path / "fleet"
    (fleet / "host").mkdir(parents=True)
    (fleet / "host" / "m.int8.onnx").write_bytes(b"onnx")
    (fleet / "host" / "m.int8.cache").write_text("TRT-8600-EntropyCalibration2\n")
    (fleet / "host" / "m.int8.fp32.onnx").write_bytes(b"fp32")
    src = tmp_path / "m.onnx"
    src.write_bytes(b"source")
    # /etc/nv_tegra_release's first line, as the probe reports it
    boards = {"orin-a": ("8.7", "Orin", "# R36 (release), REVISION: 3.0"), "orin-b": ("8.7", "Orin", None),
              "xavier": ("7.2", "Xavier", "# R35 (release), REVISION: 4.1"),
              "mystery": (None, None, None)}  # fmt: skip
    rows = []
    for name, (cc, gpu, l4t) in boards.items():
        d = fleet / "targets" / name
        d.mkdir(parents=True)
        (d / "engine.plan").write_bytes(f"engine built on {name}".encode())
        gpus = [{"name": gpu, "compute_capability": cc}] if cc else []
        facts = {"tensorrt": {"version": "8.6.2"}, "gpus": gpus}
        if l4t:
            facts["platform"] = {"jetson": {"l4t": l4t}}
        (d / "probe.json").write_text(json.dumps(facts))
        (d / "report.json").write_text("{}")
        kind = f"sm{cc}-trt8.6.2" if cc else None
        rows.append({"target": name, "status": "passed", "kind": kind, "gate": True, "gpu": gpu,
                     "compute_capability": cc, "latency_p50_ms": 1.0, "latency_p99_ms": 2.0,
                     "throughput_qps": 900.0})  # fmt: skip
    (fleet / "fleet.json").write_text(json.dumps({
        "passed": True, "created": "2026-01-01T00:00:00Z", "edgeq": "0.1.0", "model": str(src),
        "source_sha256": "ab" * 32, "model_file": "host/m.int8.onnx", "cache_file": "host/m.int8.cache",
        "targets": rows,
    }))  # fmt: skip
    code, out, err = cli("release", "--from", fleet, "-o", tmp_path / "b.tar.gz", "--json")
    assert code == 0, err
    m = json.loads(out)
    assert m["created"] == "2023-11-14T22:13:20Z"  # SOURCE_DATE_EPOCH, not the fleet's time
    assert sorted(m["engines"]) == ["sm7.2-trt8.6.2", "sm8.7-trt8.6.2", "target-mystery"]
    orin = m["engines"]["sm8.7-trt8.6.2"]
    assert (orin["built_on"], orin["gpu"]) == ("orin-a", "Orin")
    assert (orin["l4t"], orin["jetpack"]) == ("36.3.0", "6.0")
    assert m["engines"]["sm7.2-trt8.6.2"]["jetpack"] == "5.1.2"  # L4T 35.4.1
    assert {t["name"]: t["engine"] for t in m["targets"]}["orin-b"] == "engines/sm8.7-trt8.6.2/engine.plan"
    members = _members(tmp_path / "b.tar.gz")
    assert members["engines/sm8.7-trt8.6.2/engine.plan"][1] == b"engine built on orin-a"
    assert {"model/m.int8.onnx", "model/m.int8.cache", "model/m.int8.fp32.onnx"} <= set(members)
    assert all(info.mtime == 1700000000 for info, _ in members.values())
    assert cli("release", "verify", tmp_path / "b.tar.gz")[0] == 0


def hand_fleet(root, boards, build=None):
    """A passed fleet directory as 'edgeq fleet validate' writes it (fleet.json, host/, targets/NAME/),
    written by hand: ``boards`` is {name: (compute capability, GPU, first line of nv_tegra_release)};
    ``build`` the row's build cell (ok | reused) per board, each board's engine.plan naming its builder."""
    fleet = root / "fleet"
    (fleet / "host").mkdir(parents=True)
    (fleet / "host" / "m.int8.onnx").write_bytes(b"onnx")
    (fleet / "host" / "m.int8.cache").write_text("TRT-8600-EntropyCalibration2\n")
    src = root / "m.onnx"
    src.write_bytes(b"source")
    build = build or {}
    builder = {cc: name for name, (cc, _, _) in boards.items() if build.get(name, "ok") == "ok"}
    rows = []
    for name, (cc, gpu, l4t) in boards.items():
        d = fleet / "targets" / name
        d.mkdir(parents=True)
        (d / "engine.plan").write_bytes(f"engine built on {builder.get(cc, name)}".encode())
        gpus = [{"name": gpu, "compute_capability": cc}] if cc else []
        facts = {"tensorrt": {"version": "8.6.2"}, "gpus": gpus}
        if l4t:
            facts["platform"] = {"jetson": {"l4t": l4t}}
        (d / "probe.json").write_text(json.dumps(facts))
        rows.append({"target": name, "status": "passed", "kind": f"sm{cc}-trt8.6.2" if cc else None,
                     "build": build.get(name, "ok"), "gate": True, "gpu": gpu, "compute_capability": cc,
                     "latency_p50_ms": 1.0, "latency_p99_ms": 2.0, "throughput_qps": 900.0})  # fmt: skip
    (fleet / "fleet.json").write_text(json.dumps({
        "passed": True, "created": "2026-01-01T00:00:00Z", "edgeq": "0.1.0", "model": str(src),
        "source_sha256": "ab" * 32, "model_file": "host/m.int8.onnx", "cache_file": "host/m.int8.cache",
        "targets": rows,
    }))  # fmt: skip
    return fleet


def test_release_refuses_an_output_inside_or_equal_to_its_input(tmp_path, cli):
    """Issue 20.4: `release create --from RUN -o RUN/fleet.json` made fleet.json a gzip file (exit 0)."""
    fleet = hand_fleet(tmp_path, {"orin": ("8.7", "Orin", None)})
    before = {p: p.read_bytes() for p in fleet.rglob("*") if p.is_file()}
    for output in (fleet / "fleet.json", fleet / "host" / "m.int8.onnx", fleet / "bundle.tar.gz", fleet):
        code, out, err = cli("release", "--from", fleet, "-o", output)
        assert code == 2 and "Traceback" not in err, (output, out, err)
        assert len([x for x in err.splitlines() if x.startswith("error:")]) == 1, err
        assert {p: p.read_bytes() for p in fleet.rglob("*") if p.is_file()} == before, output
    assert cli("release", "--from", fleet, "-o", tmp_path / "b.tar.gz")[0] == 0


def test_manifest_names_the_board_that_built_the_engine(tmp_path, cli):
    """Issue 20.6: with three boards of one kind, built_on named the first row of the kind, not the board
    that built the engine (its stages.json: "built on jetson3, reused")."""
    boards = {f"jetson{i}": ("8.7", "Orin", "# R36 (release), REVISION: 3.0" if i == 3 else None)
              for i in (1, 2, 3)}
    fleet = hand_fleet(tmp_path, boards, build={"jetson1": "reused", "jetson2": "reused", "jetson3": "ok"})
    code, out, err = cli("release", "--from", fleet, "-o", tmp_path / "b.tar.gz", "--json")
    assert code == 0, err
    engine = json.loads(out)["engines"]["sm8.7-trt8.6.2"]
    assert engine["built_on"] == "jetson3"
    assert engine["jetpack"] == "6.0"  # the versions are the builder's probe's
    plan = _members(tmp_path / "b.tar.gz")["engines/sm8.7-trt8.6.2/engine.plan"][1]
    assert plan == b"engine built on jetson3"


def test_verify_and_inspect_of_a_directory_say_it_is_a_directory(tmp_path, cli):
    """Issue 20.14: `release verify DIR` on an existing directory said "no such bundle"."""
    fleet = hand_fleet(tmp_path, {"orin": ("8.7", "Orin", None)})
    for verb in ("verify", "inspect"):
        code, _, err = cli("release", verb, fleet)
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and "is a directory, not a bundle" in line and "no such" not in line, line
        assert f"edgeq release --from {fleet}" in line  # how to make the bundle it may be the source of
        code, _, err = cli("release", verb, tmp_path / "missing.tar.gz")
        assert code == 2 and "no such bundle" in err


def test_inspect_of_a_truncated_bundle_is_bad_input(tmp_path, cli):
    """Issue 43.10: ``release inspect`` of a truncated bundle exited 1, as if a check had failed: inspect
    checks nothing (``verify`` does, and there a damaged archive is its finding, exit 1), so a file it
    cannot read a manifest from is bad input, exit 2."""
    from fleet_helpers import make_bundle

    bundle, _ = make_bundle(tmp_path, "v1", created="2026-01-01T00:00:00Z", engine_mib=1)
    truncated = tmp_path / "t.tar.gz"
    truncated.write_bytes(bundle.read_bytes()[:40000])
    code, out, err = cli("release", "inspect", truncated)
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and out == "" and "corrupt bundle" in line and "Traceback" not in err, err
    assert cli("release", "verify", truncated)[0] == 1  # verify's own finding
    assert cli("release", "inspect", bundle)[0] == 0


def test_release_create_takes_limit_as_every_fleet_command_does(tmp_path, cli, monkeypatch, no_backoff):
    """Issue 43.10: the docs say every fleet command takes --limit; ``release create`` refused it. With
    MODEL --fleet it validates the boards the pattern picks; with --from (a run already made) it is
    refused, naming why. The boards are 127.0.0.1 ports nothing listens on."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    for i in (1, 2):
        (tmp_path / "targets" / f"b{i}.yaml").write_text(
            f"host: 127.0.0.1\nport: 1\nuser: me\nuse_agent: true\nknown_hosts: {tmp_path / 'kh'}\n")
    (tmp_path / "fleet.yaml").write_text("targets: ['targets/b*.yaml']\n")
    model = qdq_model(tmp_path / "m.onnx")
    code, out, err = cli("release", model, "--fleet", "fleet.yaml", "--limit", "b2", "-o", "r.tar.gz")
    rows = [ln for ln in out.splitlines() if ln.startswith("│ b")]
    assert code == 1 and "Traceback" not in out + err, (out, err)
    assert [r.split()[1] for r in rows] == ["b2"] and "b2 did not pass" in err, (out, err)
    assert not (tmp_path / "r.tar.gz").exists()
    code, _, err = cli("release", "--from", tmp_path, "--limit", "b2", "-o", "r.tar.gz")
    assert code == 2 and "--limit picks the boards MODEL --fleet validates" in err, err
