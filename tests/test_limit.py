"""``--limit``: Ansible's host patterns (edgeq/orchestration/limit.py), case by case from Ansible's
"Patterns: targeting hosts and groups" page."""

from __future__ import annotations

import pytest

from edgeq.errors import EdgeqError
from edgeq.orchestration.limit import select, split_pattern

# the page's [webservers] cobweb webbing weber, plus a few more groups
HOSTS = {
    "cobweb": {"webservers", "atlanta"},
    "webbing": {"webservers", "staging"},
    "weber": {"webservers", "staging", "phoenix"},
    "db1": {"dbservers", "staging"},
    "jetson-nano": {"jetsons"},
    "jetson-orin": {"jetsons", "atlanta"},
    "spare": set(),
}


@pytest.mark.parametrize("pattern, expected", [
    ("all", list(HOSTS)),
    ("*", list(HOSTS)),
    ("weber", ["weber"]),
    ("cobweb:db1", ["cobweb", "db1"]),
    ("db1,cobweb", ["cobweb", "db1"]),  # hosts' order, not the pattern's
    ("webservers", ["cobweb", "webbing", "weber"]),
    ("webservers:dbservers", ["cobweb", "webbing", "weber", "db1"]),
    ("webservers:!atlanta", ["webbing", "weber"]),
    ("webservers:&staging", ["webbing", "weber"]),
    ("webservers:dbservers:&staging:!phoenix", ["webbing", "db1"]),
    # the processing order: unions, then &, then !, whatever the written order
    ("!phoenix:&staging:dbservers:webservers", ["webbing", "db1"]),
    ("jetson*", ["jetson-nano", "jetson-orin"]),
    ("jetson-o???", ["jetson-orin"]),
    ("jetson*:!atlanta", ["jetson-nano"]),
    ("*web*", ["cobweb", "webbing", "weber"]),  # glob over group names and host names
    ("~(web|db).*", ["cobweb", "webbing", "weber", "db1"]),
    ("ungrouped", ["spare"]),
    ("!webservers", ["db1", "jetson-nano", "jetson-orin", "spare"]),  # only exclusions: from all
    ("&jetsons", ["jetson-nano", "jetson-orin"]),
    ("webservers[0]", ["cobweb"]),
    ("webservers[-1]", ["weber"]),
    ("webservers[1:]", ["webbing", "weber"]),
    ("webservers[0:1]", ["cobweb", "webbing"]),  # inclusive end, as Ansible's
    ("webservers[0:1],db1", ["cobweb", "webbing", "db1"]),
    (" weber , db1 ", ["weber", "db1"]),
])
def test_select_follows_ansible_patterns(pattern, expected):
    assert select(HOSTS, pattern) == expected


def test_split_keeps_ranges_whole():
    assert split_pattern("a:b[0:2],!c:&d") == ["a", "b[0:2]", "!c", "&d"]


@pytest.mark.parametrize("pattern, named", [
    ("webservrs", "'webservrs' matches no target or group"),
    ("webservers:!phenix", "'!phenix' matches no target or group"),
    ("all:&nosuch", "'&nosuch' matches no target or group"),
    ("tx2*", "'tx2*' matches no target or group"),
    ("webservers:&jetsons", "leaves no target"),
    ("webservers[:]", "not a host range"),
    ("~(", "not a regular expression"),
    ("", "empty"),
    ("!", "names no host or group"),
])
def test_a_pattern_selecting_nothing_is_an_input_error_naming_it(pattern, named):
    with pytest.raises(EdgeqError) as e:
        select(HOSTS, pattern)
    assert e.value.exit_code == 2
    assert named in str(e.value)


def test_a_file_of_patterns_stands_where_it_is_named(tmp_path, monkeypatch):
    """``@FILE`` as Ansible reads its retry files: one pattern a line, in the term's place."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "failed.retry").write_text("weber\n# a comment\n\njetson-orin  # the spare is fine\n")
    assert select(HOSTS, "@failed.retry") == ["weber", "jetson-orin"]
    assert select(HOSTS, "@failed.retry:!atlanta,db1") == ["weber", "db1"]
    (tmp_path / "empty").write_text("# nothing\n")
    for pattern, said in (("@missing.retry", "cannot read missing.retry: No such file or directory"),
                          ("@empty", "empty names no host or group")):  # fmt: skip
        with pytest.raises(EdgeqError) as e:
            select(HOSTS, pattern)
        assert said in e.value.message and e.value.exit_code == 2


def test_an_empty_limit_is_refused_by_every_command_before_any_board(tmp_path, monkeypatch, cli):
    """``--limit "$BOARDS"`` with BOARDS unset: refused (exit 2), never the whole fleet. The boards are
    127.0.0.1 ports nothing listens on: a command that went on to contact them would exit 1."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    for i in (1, 2):
        (tmp_path / "targets" / f"b{i}.yaml").write_text(
            f"host: 127.0.0.1\nport: 1\nuser: me\nuse_agent: true\nknown_hosts: {tmp_path / 'kh'}\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("targets: ['targets/b*.yaml']\n")
    (tmp_path / "p.yaml").write_text("name: p\nmodel: m.onnx\nfleet: fleet.yaml\n")
    for args in (("release", "rollback", "--fleet", fleet), ("fleet", "status", "--fleet", fleet),
                 ("release", "install", "b.tar.gz", "--fleet", fleet),
                 ("fleet", "validate", "m.onnx", "--fleet", fleet), ("run", "p.yaml")):  # fmt: skip
        for empty in ("", "  "):
            code, out, err = cli(*args, "--limit", empty)
            assert code == 2 and "the pattern is empty" in err, (args, out, err)
            assert len(err.strip().splitlines()) == 1 and not out.strip(), (args, err)
    assert not [p for p in tmp_path.glob("runs/**/*") if p.is_file()]  # no run was started


@pytest.mark.parametrize("pattern, stray", [("webservers[", "["), ("webservers[0", "["), ("weber]", "]"),
                                            ("db1:webservers[1:", "[")])
def test_an_unbalanced_bracket_is_named_not_read_as_the_name_before_it(pattern, stray):
    """Issue 43.10: ``--limit 'board['`` was reported as "'board' matches no target" (the bracket dropped,
    the rest read as a name): a malformed pattern is said to be one, naming the bracket."""
    with pytest.raises(EdgeqError) as e:
        select(HOSTS, pattern)
    assert e.value.exit_code == 2 and f"--limit '{pattern}': unbalanced '{stray}'" in str(e.value)
    assert "matches no target" not in str(e.value)
