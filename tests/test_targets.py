"""Target and pipeline files: the shipped examples validate; every bad field is one clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from edgeq.errors import ConfigError
from edgeq.orchestration.run import load_pipeline
from edgeq.remote.targets import (
    load_target,
    resolve_target,
    split_hostspec,
    target_from_dict,
    target_path,
    version_matches,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "targets").glob("*.yaml"))

GOOD = {
    "host": "10.0.0.5",
    "user": "nvidia",
    "identity_file": "~/.ssh/id_ed25519",
    "tensorrt": "8.6",
    "gpu": {"compute_capability": "8.7"},
    "build": {"workspace": 2048, "tactic_sources": ["-CUBLAS", "-cudnn"], "dla_core": 1},
    "gate": {"policy": "int8", "allow": ["/head/Conv"]},
}


def test_every_example_target_validates():
    names = {p.stem for p in EXAMPLES}
    assert {"orin-agx", "orin-nano", "xavier-nx", "desktop-gpu"} <= names
    for path in EXAMPLES:
        t = resolve_target(path.stem, cwd=ROOT)
        assert t.name == path.stem and t.host and t.user
        assert t.backend in ("python", "trtexec")
        assert t.is_local or t.identity_file is not None or t.use_agent  # host: local needs no SSH keys


def test_example_values_are_read_as_written():
    orin = resolve_target("orin-agx", cwd=ROOT)
    assert (orin.tensorrt, orin.compute_capability, orin.build.workspace) == ("8.6", "8.7", 4096)
    assert orin.gate is not None and orin.gate.policy == "int8"
    xavier = resolve_target("xavier-nx", cwd=ROOT)
    assert xavier.build.dla_core == 0 and xavier.use_agent and xavier.identity_file is None
    nano = resolve_target("orin-nano", cwd=ROOT)
    assert nano.backend == "trtexec" and nano.trtexec == "/usr/src/tensorrt/bin/trtexec"
    desk = resolve_target("desktop-gpu", cwd=ROOT)
    assert desk.build.tactic_sources == ("-CUBLAS", "-CUBLAS_LT", "-CUDNN")


def test_good_dict_normalises():
    t = target_from_dict(GOOD, Path("t.yaml"))
    assert t.build.tactic_sources == ("-CUBLAS", "-CUDNN")
    assert t.build.dla_core == 1 and t.gate.allow == ("/head/Conv",)
    assert t.identity_file == Path("~/.ssh/id_ed25519").expanduser()
    assert t.remote_path("cache") == "edgeq/cache"


def _with(path: str, value):
    d = yaml.safe_load(yaml.safe_dump(GOOD))
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return d


_DELETE = object()

BAD = [
    # (field, value, fragments the one-line message must contain)
    ("port", "22a", ["'port'", "integer port between 1 and 65535"]),
    ("port", 70000, ["'port'", "between 1 and 65535"]),
    ("prot", 22, ["unknown key 'prot'", "did you mean 'port'"]),
    ("build.dla_cor", 0, ["unknown key 'build.dla_cor'", "did you mean 'dla_core'"]),
    ("build.dla_core", -1, ["'build.dla_core'", "DLA core index"]),
    ("build.workspace", -5, ["'build.workspace'", "MiB"]),
    ("build.tactic_sources", ["-CUBLAS", "CUDNN"], ["'build.tactic_sources'", "+NAME or -NAME"]),
    ("build.tactic_sources", ["-CUBLASS"], ["'build.tactic_sources'", "CUBLAS_LT"]),
    ("build.fp16", "yes please", ["'build.fp16'", "true or false"]),
    ("backend", "tensorrt", ["'backend'", "one of python, trtexec"]),
    ("tensorrt", 8.6, ["'tensorrt'", "quoted version"]),
    ("tensorrt", "eight", ["'tensorrt'", "quoted version"]),
    ("gpu.compute_capability", "sm_87", ["'gpu.compute_capability'", '"8.7"']),
    ("gpu", "orin", ["'gpu' must be a mapping"]),
    ("work_dir", "~/edgeq", ["'work_dir'", "'~' is not expanded"]),
    ("user", "root;rm -rf /", ["'user'", "user name"]),
    ("host", "-oProxyCommand=x", ["'host'", "not starting with '-'"]),
    ("jump_host", "me@bastion host", ["'jump_host'", "[user@]host[:port]"]),
    ("timeouts", {"build": 0}, ["'timeouts.build'", "positive number of seconds"]),
    ("gate.policy", "fp8", ["'gate.policy'", "int8"]),
    ("gate.allow", "/fc/Gemm", ["'gate.allow'", "list of ONNX node names"]),
    ("host", _DELETE, ["missing required key 'host'"]),
    ("identity_file", _DELETE, ["no SSH credentials", "use_agent: true"]),
]


@pytest.mark.parametrize(("field", "value", "fragments"), BAD, ids=[f"{b[0]}={b[1]!r}"[:40] for b in BAD])
def test_each_bad_field_is_one_clear_message(tmp_path, field, value, fragments):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_with(field, value)))
    with pytest.raises(ConfigError) as ei:
        load_target(path)
    text = str(ei.value)
    assert "\n" not in text
    assert str(path) in text
    for frag in fragments:
        assert frag in text, text
    assert ei.value.exit_code == 2


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("host: a\nuser: [nvidia\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML \(line \d+\)"):
        load_target(path)


def test_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- host: a\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_target(path)


def test_resolve_by_name_path_and_did_you_mean(tmp_path):
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "orin.yaml").write_text(yaml.safe_dump(GOOD))
    assert resolve_target("orin", cwd=tmp_path).name == "orin"
    assert target_path("targets/orin.yaml", cwd=tmp_path) == tmp_path / "targets" / "orin.yaml"
    assert resolve_target(str(tmp_path / "targets" / "orin.yaml")).host == "10.0.0.5"
    with pytest.raises(ConfigError) as ei:
        resolve_target("oirn", cwd=tmp_path)
    assert "target 'oirn' not found" in str(ei.value) and "did you mean 'orin'" in str(ei.value)


def test_version_and_hostspec_helpers():
    assert version_matches("8.6", "8.6.2.3") and version_matches("8.6.2", "8.6.2.3")
    assert not version_matches("8.6", "8.5.2") and not version_matches("8.6", None)
    assert not version_matches("8.6", "8.60.1")
    assert split_hostspec("me@bastion:2222") == ("me", "bastion", 2222)
    assert split_hostspec("bastion") == (None, "bastion", 22)


def test_ssh_config_carries_keys_known_hosts_and_jump(tmp_path):
    key = tmp_path / "id_ed25519"
    with pytest.raises(ConfigError, match=r"t.yaml: 'identity_file' .*id_ed25519 does not exist"):
        target_from_dict(dict(GOOD, identity_file=str(key)), tmp_path / "t.yaml").ssh_config()
    key.write_text("not checked here: the transport reads it")
    t = target_from_dict(
        dict(GOOD, identity_file=str(key), jump_host="hop@bastion:2200", port=2022), tmp_path / "t.yaml"
    )
    cfg = t.ssh_config(accept_new_host_key=True)
    assert (cfg.host, cfg.port, cfg.user, cfg.accept_new_host_key) == ("10.0.0.5", 2022, "nvidia", True)
    assert cfg.identity_file.endswith("id_ed25519") and cfg.use_agent is False
    assert (cfg.jump.host, cfg.jump.port, cfg.jump.user) == ("bastion", 2200, "hop")


def test_example_pipeline_gate_is_read():
    p = load_pipeline(ROOT / "pipelines" / "example.yaml")
    assert p.gate is not None and p.gate.policy == "int8" and "/fc/Gemm" in p.gate.allow


def test_pipeline_unknown_key(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("modle: x.onnx\n")
    with pytest.raises(ConfigError, match=r"unknown key 'modle'.*did you mean 'model'"):
        load_pipeline(path)


def test_cli_targets_list(tmp_path, monkeypatch, cli):
    monkeypatch.chdir(ROOT)
    code, out, _ = cli("targets", "list")
    assert code == 0
    for name in ("orin-agx", "orin-nano", "xavier-nx", "desktop-gpu"):
        assert name in out
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "bad.yaml").write_text("host: a\nuser: b\nuse_agent: true\nprot: 22\n")
    code, out, _ = cli("targets", "list")
    assert code == 1 and "did you mean 'port'" in out


def test_cli_targets_list_skips_dirs_and_usage_errors_name_the_subcommand(tmp_path, monkeypatch, cli):
    # QA: a directory named x.yaml was listed as an invalid target; `edgeq targets check` without a name
    # pointed at 'edgeq --help' rather than the subcommand's help.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets" / "old.yaml").mkdir(parents=True)
    (tmp_path / "targets" / "t.yaml").write_text("host: a\nuser: b\nuse_agent: true\n")
    code, out, err = cli("targets", "list")
    assert code == 0 and "old" not in out + err and "t" in out
    code, _, err = cli("targets", "check")
    assert code == 2 and "'edgeq targets check --help'" in err and len(err.strip().splitlines()) == 1


def test_bare_edgeq_prints_help_without_an_empty_error_line(cli):
    # QA: `edgeq` alone printed its help, then "error:   (see 'edgeq --help')".
    code, out, err = cli()
    assert code == 2 and "Usage: edgeq" in out and "error" not in err


def test_a_local_target_whose_python_does_not_exist_is_one_line_exit_2(tmp_path, monkeypatch, cli):
    """Issue 20.7: `host: local` with a `python:` that is not there ended targets check, deploy and run in
    a FileNotFoundError traceback."""
    import onnx

    from edgeq import zoo

    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    missing = tmp_path / "no" / "python3"
    (tmp_path / "targets" / "here.yaml").write_text(yaml.safe_dump(
        {"host": "local", "work_dir": str(tmp_path / "work"), "python": str(missing), "tensorrt": "8.6"}))
    onnx.save(zoo.resnet_like(size=32), tmp_path / "m.onnx")
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(
        {"model": str(tmp_path / "m.onnx"), "synthetic": 2, "target": "here"}))
    said = f"local: cannot run {missing}: No such file or directory (set the target file's 'python'"
    for argv in (("targets", "check", "here"), ("deploy", "m.onnx", "--target", "here")):
        code, out, err = cli(*argv)
        errors = [ln for ln in (out + err).splitlines() if ln.startswith("error:")]
        assert code == 2 and "Traceback" not in err, (argv, out, err)
        assert len(errors) == 1 and said in errors[0], (argv, errors)
    # run: the target's row fails with the same words, and the run exits as deploy does
    code, out, err = cli("run", "p.yaml", "--json")
    assert code == 2 and "Traceback" not in err and json.loads(out)["exit_code"] == 2, (out, err)
    (row,) = json.loads((tmp_path / "runs" / "pipeline-p" / "fleet.json").read_text())["targets"]
    assert row["error"].startswith(said) and row["exit_code"] == 2


def test_targets_list_says_example_for_the_repositorys_templates_not_ok(tmp_path, monkeypatch, cli):
    """Issue 43.10: ``targets list`` in the repository marked its example targets "ok", as if they were
    boards (they name hosts no one has, and ship with no package). The column says what was checked,
    the file; a template (``example: true``) reads as one; nothing claims a board is fine."""
    monkeypatch.chdir(ROOT)
    code, out, err = cli("targets", "list")
    rows = {ln.split("│")[1].strip(): ln for ln in out.splitlines() if ln.startswith("│ ") and "│" in ln[1:]}
    assert code == 0 and "ok" not in out.split(), out
    for name in ("orin-agx", "orin-nano", "xavier-nx", "desktop-gpu"):
        assert rows[name].rstrip(" │").endswith("example"), rows[name]
        assert resolve_target(name, cwd=ROOT).example
    assert "no board contacted" in err and "4 examples: a template naming no real board" in err
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "mine.yaml").write_text("host: 10.0.0.5\nuser: me\nuse_agent: true\n")
    code, out, err = cli("targets", "list")
    assert code == 0 and "valid" in out and "example" not in out + err, out
