"""``edgeq targets add``: a target file from [USER@]HOST, reached as ssh reaches it (~/.ssh/config), never
over an existing file; and the transport honouring ~/.ssh/config, against a real sshd on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeq.errors import ConfigError
from edgeq.remote.newtarget import add_target
from edgeq.remote.targets import resolve_target


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.chdir(tmp_path)
    return home


def test_add_writes_a_target_that_reads_back_and_never_overwrites(home, cli) -> None:
    (home / ".ssh" / "id_ed25519").write_text("key")
    code, out, err = cli("targets", "add", "orin", "--host", "nvidia@orin.local")
    assert code == 0, err
    assert "wrote targets/orin.yaml: nvidia@orin.local, key ~/.ssh/id_ed25519 (OpenSSH's default)" in out
    assert "host key: none in ~/.ssh/known_hosts for orin.local yet" in " ".join(out.split())
    t = resolve_target("orin")
    assert (t.host, t.user, t.port, t.backend, t.tensorrt) == ("orin.local", "nvidia", 22, "trtexec", "8.6")
    assert t.identity_file == home / ".ssh" / "id_ed25519"
    before = Path("targets/orin.yaml").read_text()
    code, _, err = cli("targets", "add", "orin", "--host", "other@orin.local")
    assert code == 2 and "targets/orin.yaml exists; edgeq targets add never overwrites" in err
    assert Path("targets/orin.yaml").read_text() == before and list(Path("targets").iterdir()) == [
        Path("targets/orin.yaml")]  # no temporary file left


def test_the_key_is_the_flag_then_ssh_config_then_the_defaults_then_an_agent(home, monkeypatch) -> None:
    with pytest.raises(ConfigError, match=r"no SSH key for nvidia@b: .*ssh-keygen -t ed25519 && ssh-copy-id"):
        add_target("t1", "nvidia@b")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
    assert add_target("t2", "nvidia@b").key == "the running ssh-agent"
    (home / ".ssh" / "id_rsa").write_text("key")
    assert add_target("t3", "nvidia@b").key == "~/.ssh/id_rsa (OpenSSH's default)"
    (home / "k").write_text("key")
    (home / ".ssh" / "config").write_text("Host b\n  IdentityFile ~/k\n  User jet\n")
    new = add_target("t4", "b")
    assert new.key == "~/k (~/.ssh/config)" and new.target.user == "jet"  # the user ssh would log in as
    given = add_target("t5", "nvidia@b", key=str(home / ".ssh" / "id_rsa"))
    assert given.key == "~/.ssh/id_rsa (--identity-file)"
    with pytest.raises(ConfigError, match="--identity-file nope: no such file"):
        add_target("t6", "b", key="nope")
    with pytest.raises(ConfigError, match=r"target name '\.\./x'"):
        add_target("../x", "b")


def test_ssh_config_decides_where_a_target_goes_unless_the_file_says(home) -> None:
    (home / ".ssh" / "id_ed25519").write_text("key")
    (home / ".ssh" / "config").write_text("Host orin.local\n  HostName 10.1.2.3\n  Port 2200\n"
                                          "  UserKnownHostsFile ~/kh\n  ProxyJump me@gate:2022\n")
    new = add_target("orin", "nvidia@orin.local")
    cfg = new.target.ssh_config()
    assert (cfg.host, cfg.port, cfg.known_hosts_name) == ("10.1.2.3", 2200, "[10.1.2.3]:2200")
    assert cfg.known_hosts_path == home / "kh"
    assert cfg.jump is not None and (cfg.jump.user, cfg.jump.host, cfg.jump.port) == ("me", "gate", 2022)
    assert new.reached == "10.1.2.3:2200 (~/.ssh/config)"
    fixed = add_target("orin2", "nvidia@orin.local", port=22)  # the file's port wins over ssh's
    assert fixed.target.ssh_config().port == 22


@pytest.mark.sshd
def test_the_transport_reaches_a_host_by_its_ssh_config_alias(sshd, home) -> None:
    """A real sshd on 127.0.0.1 reached as ``board``: HostName and Port from ~/.ssh/config, the host key
    checked under [127.0.0.1]:PORT in ~/.ssh/known_hosts, as OpenSSH checks it."""
    import shutil

    from edgeq.remote.transport import Connection

    shutil.copy(sshd.identity_file, home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "config").write_text(f"Host board\n  HostName 127.0.0.1\n  Port {sshd.port}\n")
    (home / ".ssh" / "known_hosts").write_text(sshd.known_hosts_line() + "\n")
    new = add_target("board", f"{sshd.user}@board")
    assert new.host_key == "ssh-ed25519 (line 1)" and new.known_as == f"[127.0.0.1]:{sshd.port}"
    with Connection(new.target.ssh_config()) as c:
        assert c.run(["echo", "reached"]).stdout.strip() == "reached"


def test_a_port_that_speaks_no_ssh_is_one_edgeq_line_and_no_paramiko_log(tmp_path, edgeq_process) -> None:
    """paramiko's transport thread logs 'Error reading SSH protocol banner' (with a traceback) for a port
    that answers something else; the terminal shows only edgeq's line (edgeq_process checks fd 2)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(30)

    def answer() -> None:
        try:
            while True:
                conn, _ = server.accept()
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                conn.close()
        except OSError:
            pass

    threading.Thread(target=answer, daemon=True).start()
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "web.yaml").write_text(
        f"host: 127.0.0.1\nport: {server.getsockname()[1]}\nuser: nvidia\nuse_agent: true\n"
        f"known_hosts: {tmp_path / 'kh'}\ntimeouts: {{connect: 2}}\n")
    try:
        code, _, err = edgeq_process("targets", "check", "web", cwd=tmp_path,
                                     env={"SSH_AUTH_SOCK": "/nonexistent"})
    finally:
        server.close()
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 1 and line.startswith("error: cannot connect to nvidia@127.0.0.1:") and "banner" in line
