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
        from edgeq.pipeline_run import load_spec

        return load_spec(path)
    from edgeq.fleet_file import load_fleet

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
    from edgeq.pipeline_run import load_spec

    path = tmp_path / "p.yaml"
    path.write_text("model: m.onnx\nprofile: {iterations: 0}\n")
    with pytest.raises(ConfigError, match=r"'profile.iterations' must be a positive integer \(got 0\)"):
        load_spec(path)
