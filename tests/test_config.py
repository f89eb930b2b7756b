"""One config layer: every YAML file edgeq reads says an unknown key the same way, with a did-you-mean."""

from __future__ import annotations

import pytest

from edgeq.errors import ConfigError


def _load(kind: str, path):
    if kind == "target":
        from edgeq.remote.targets import load_target

        return load_target(path)
    if kind == "overrides":
        from edgeq.quant.overrides import load_overrides

        return load_overrides(path)
    if kind == "preprocess":
        from edgeq.quant.data import load_preprocess

        return load_preprocess(path)
    if kind == "pipeline":
        from edgeq.orchestration.run import load_spec

        return load_spec(path)
    from edgeq.orchestration.fleet_file import load_fleet

    return load_fleet(path)


@pytest.mark.parametrize(
    ("kind", "text", "key", "near"),
    [
        ("target", "host: h\nuser: u\nuse_agnet: true\n", "use_agnet", "use_agent"),
        ("overrides", "exlude: [/a/*]\n", "exlude", "exclude"),
        ("preprocess", "mena: [0.5]\n", "mena", "mean"),
        ("pipeline", "model: m.onnx\ncalbi: data\n", "calbi", "calib"),
        ("fleet", "targtes: [a]\n", "targtes", "targets"),
    ],
)
def test_unknown_keys_read_alike_everywhere(tmp_path, kind, text, key, near):
    path = tmp_path / f"{kind}.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as ei:
        _load(kind, path)
    assert str(ei.value) == f"{path}: unknown key '{key}' (did you mean '{near}'?)"


def test_a_wrong_value_names_the_file_the_dotted_key_and_what_was_expected(tmp_path):
    from edgeq.orchestration.run import load_spec

    path = tmp_path / "p.yaml"
    path.write_text("model: m.onnx\nprofile: {iterations: 0}\n")
    with pytest.raises(ConfigError, match=r"'profile.iterations' must be a positive integer \(got 0\)"):
        load_spec(path)


# A pipeline's gate section is read once, by the target file's gate schema, for both commands that read
# it: `deploy --pipeline` (load_pipeline) and `edgeq run` (load_spec).
GATES_READ = [
    ({"policy": "int8", "allow": ["/fc/Gemm", "/head/*"]}, ("int8", ("/fc/Gemm", "/head/*"), None)),
    ({"allow": ["/fc/Gemm"]}, (None, ("/fc/Gemm",), None)),  # no policy: the target's own
    ({"policy": "none"}, ("none", (), None)),
    ({"require_fusion": True}, (None, (), True)),
    ({}, (None, (), None)),
]
GATES_REFUSED = [
    ({"policy": "fp16"}, r"'gate.policy' must be one of"),
    ({"alow": ["/fc/Gemm"]}, r"unknown key 'gate.alow' \(did you mean 'allow'\?\)"),
    # what only the policy reader took (edgeq run), refused as deploy --pipeline refused it:
    ({"gate": "int8"}, r"unknown key 'gate.gate'"),  # an alias of 'policy'
    ({"forbid_copies": True}, r"unknown key 'gate.forbid_copies'"),  # was accepted, then never applied
    ({"allow": "/fc/Gemm"}, r"'gate.allow' must be a list of ONNX node names"),
    ({"allow": None}, r"'gate.allow' must be a list of ONNX node names"),
    ({"policy": None}, r"'gate.policy' must be a non-empty string"),
    ({"require_fusion": "yes"}, r"'gate.require_fusion' must be true or false"),
    ("int8", r"'gate' must be a mapping of keys"),
    (None, r"'gate' must be a mapping of keys"),
]


def _pipeline_with_gate(tmp_path, gate):
    import yaml

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"model": "m.onnx", "gate": gate}))
    return path


@pytest.mark.parametrize(("gate", "read"), GATES_READ)
def test_deploy_pipeline_and_run_read_a_gate_alike(tmp_path, gate, read):
    from edgeq.orchestration.run import load_pipeline, load_spec
    from edgeq.remote.targets import GateConfig

    path = _pipeline_with_gate(tmp_path, gate)
    assert load_pipeline(path).gate == load_spec(path).gate == GateConfig(*read)


@pytest.mark.parametrize(("gate", "message"), GATES_REFUSED)
def test_deploy_pipeline_and_run_refuse_a_gate_alike(tmp_path, gate, message):
    from edgeq.orchestration.run import load_pipeline, load_spec

    path = _pipeline_with_gate(tmp_path, gate)
    errors = []
    for load in (load_pipeline, load_spec):
        with pytest.raises(ConfigError, match=message) as ei:
            load(path)
        errors.append(str(ei.value))
    assert errors[0] == errors[1]
