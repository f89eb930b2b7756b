"""SSH transport against a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py): quoting, streaming, timeouts,
the verified upload cache with resume, and strict host keys."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from edgeq.errors import RemoteError
from edgeq.remote.transport import (
    AuthenticationFailed,
    CommandFailed,
    CommandTimeout,
    Connection,
    ConnectionFailed,
    HostKeyChanged,
    HostKeyUnknown,
    known_host_lines,
    quick_key,
    remote_command,
)

MiB = 1 << 20
NASTY = (
    "a b  'single' \"double\" $(touch {m}) `touch {m}`; touch {m} && echo x | cat >{m}\n"
    "line two\t$HOME \\ * ? ~ -n"
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _procs_with_arg(arg: str) -> list[int]:
    """PIDs of live processes with ``arg`` in their argv (the sshd runs on this machine)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if arg.encode() in argv:
                pids.append(int(entry))
    return pids


@pytest.fixture
def conn(sshd):
    with Connection(sshd.ssh_config()) as c:
        yield c


# -- no sshd needed ---------------------------------------------------------------------------------------
def test_remote_command_passes_arguments_verbatim_through_a_posix_shell(tmp_path):
    """The string sent to the login shell, run by a real /bin/sh here: argv arrives intact, nothing runs."""
    marker = tmp_path / "pwned"
    nasty = NASTY.format(m=marker)
    probe = "import json, sys; print(json.dumps(sys.argv[1:]))"
    command = remote_command(["python3", "-c", probe, nasty, "", "-e"], cwd=str(tmp_path), env={"X_Y": nasty})
    res = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, check=True)
    pgid_line, output = res.stdout.split("\n", 1)
    assert pgid_line.split()[1].isdigit()  # the process group run() kills on timeout / Ctrl-C
    assert json.loads(output) == [nasty, "", "-e"]
    assert not marker.exists()
    with pytest.raises(ValueError):
        remote_command(["true"], env={"A;touch x": "1"})


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen (openssh-client) not installed")
def test_known_host_lines_finds_plain_and_hashed_entries(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("# comment\nother ssh-ed25519 AAAA\n[127.0.0.1]:2222 ssh-ed25519 AAAA\n")
    assert known_host_lines(kh, "[127.0.0.1]:2222") == [(3, "ssh-ed25519")]
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(kh)], check=True, capture_output=True)
    assert "[127.0.0.1]" not in kh.read_text()
    assert [kind for _, kind in known_host_lines(kh, "[127.0.0.1]:2222")] == ["ssh-ed25519"]


# -- commands -------------------------------------------------------------------------------------------
@pytest.mark.sshd
def test_run_quotes_every_argument_no_shell_injection(conn, tmp_path):
    marker = tmp_path / "pwned"
    nasty = NASTY.format(m=marker)
    res = conn.run(["printf", "%s", nasty])
    assert res.stdout == nasty
    probe = "import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), os.environ['EDGEQ_T']]))"
    workdir = tmp_path / "dir with spaces; $(touch pwned)"
    workdir.mkdir()
    res = conn.run(["python3", "-c", probe, nasty, "", "--"], cwd=str(workdir), env={"EDGEQ_T": nasty})
    assert json.loads(res.stdout) == [[nasty, "", "--"], str(workdir), nasty]
    assert not marker.exists()
    assert not (workdir / "pwned").exists()
    with pytest.raises(TypeError):
        conn.run("echo hi; touch " + str(marker))  # type: ignore[arg-type]


@pytest.mark.sshd
def test_run_streams_lines_live_and_in_order(conn):
    seen: list[tuple[str, str, float]] = []
    script = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.4; done; printf tail"
    res = conn.run(
        ["sh", "-c", script],
        on_stdout=lambda line: seen.append(("out", line, time.monotonic())),
        on_stderr=lambda line: seen.append(("err", line, time.monotonic())),
    )
    end = time.monotonic()
    assert [line for kind, line, _ in seen if kind == "out"] == ["out1", "out2", "out3", "tail"]
    assert [line for kind, line, _ in seen if kind == "err"] == ["err1", "err2", "err3"]
    first = next(t for kind, line, t in seen if line == "out1")
    assert end - first > 0.7  # arrived while the command was still running, not buffered to the end
    assert res.stdout == "out1\nout2\nout3\ntail"
    assert res.stderr == "err1\nerr2\nerr3\n"  # the process-group marker line is not user output


@pytest.mark.sshd
def test_run_nonzero_exit_raises_remote_error_with_stderr_tail(conn):
    with pytest.raises(CommandFailed) as info:
        conn.run(["sh", "-c", "echo starting; echo 'engine build failed: out of memory' >&2; exit 3"])
    err = info.value
    assert isinstance(err, RemoteError) and err.exit_code == 1
    assert err.result.exit_code == 3 and "out of memory" in str(err)
    res = conn.run(["sh", "-c", "exit 4"], check=False)
    assert res.exit_code == 4 and not res


@pytest.mark.sshd
def test_timeout_kills_the_remote_process_group(conn):
    tag = str(random.randint(100000, 999999))  # sleep's argument: unique, so we find only our processes
    alive_while_running: list[int] = []

    def started(line: str) -> None:
        deadline = time.monotonic() + 3  # the forked shells may not have exec'd sleep yet
        while line == "started" and time.monotonic() < deadline:
            found = _procs_with_arg(tag + "1") + _procs_with_arg(tag + "2")
            if len(found) == 2:
                alive_while_running.extend(found)
                break
            time.sleep(0.01)

    t0 = time.monotonic()
    with pytest.raises(CommandTimeout):
        script = f"sleep {tag}1 & sleep {tag}2 & echo started; wait"
        conn.run(["sh", "-c", script], timeout=1.0, on_stdout=started)
    assert len(alive_while_running) == 2  # the foreground and the background sleep both ran
    assert time.monotonic() - t0 < 8
    deadline = time.monotonic() + 5
    while (_procs_with_arg(tag + "1") or _procs_with_arg(tag + "2")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with_arg(tag + "1") == [] and _procs_with_arg(tag + "2") == []
    assert conn.run(["echo", "still usable"]).stdout == "still usable\n"


@pytest.mark.sshd
def test_ctrl_c_stops_the_remote_process_group(conn):
    tag = str(random.randint(100000, 999999))

    running: list[int] = []

    def interrupt(line: str) -> None:
        deadline = time.monotonic() + 3
        while not running and time.monotonic() < deadline:
            running.extend(_procs_with_arg(tag))
        raise KeyboardInterrupt  # what Ctrl-C does to the streaming loop

    with pytest.raises(KeyboardInterrupt):
        conn.run(["sh", "-c", f"sleep {tag} & echo started; wait"], on_stdout=interrupt)
    assert len(running) == 1
    deadline = time.monotonic() + 5
    while _procs_with_arg(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with_arg(tag) == []


@pytest.mark.sshd
def test_connection_dropped_mid_command_is_reported_not_hung(sshd, conn):
    tag = str(random.randint(100000, 999999))

    def cut(line: str) -> None:
        deadline = time.monotonic() + 3  # let sleep start, so it is among the processes killed
        while not _procs_with_arg(tag) and time.monotonic() < deadline:
            time.sleep(0.01)
        sshd.kill_sessions()

    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed) as info:
        conn.run(["sh", "-c", f"echo started; sleep {tag}"], on_stdout=cut)
    assert "dropped" in str(info.value) and time.monotonic() - t0 < 10
    # SIGKILL returns before the kernel has torn the process down: give a loaded machine a moment.
    deadline = time.monotonic() + 5
    while _procs_with_arg(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_with_arg(tag) == []
    assert conn.run(["echo", "back"]).stdout == "back\n"  # the next command reconnects


@pytest.mark.sshd
@pytest.mark.parametrize(("sig", "number"), [("KILL", 9), ("SEGV", 11), ("TERM", 15)])
def test_command_killed_on_the_target_names_the_signal_not_a_dropped_link(conn, sig, number):
    """sshd reports a command a signal ended with exit-signal, not exit-status: that is a command
    failure naming the signal (the link is up), not "connection dropped ... may still be running"."""
    script = f"echo partial; echo dying >&2; kill -{sig} $$"
    res = conn.run(["sh", "-c", script], check=False)
    assert (res.signal, res.exit_code, res.stdout, res.stderr) == (sig, 128 + number, "partial\n", "dying\n")
    with pytest.raises(CommandFailed) as info:
        conn.run(["sh", "-c", script])
    assert f"was killed by signal {sig} on" in str(info.value) and "dying" in str(info.value)
    assert not isinstance(info.value, ConnectionFailed) and info.value.result.signal == sig
    assert conn.run(["echo", "same link"]).stdout == "same link\n"


@pytest.mark.sshd
def test_stdin_is_delivered(conn):
    payload = os.urandom(300_000)
    probe = "import hashlib,sys;print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    res = conn.run(["python3", "-c", probe], stdin=payload)
    assert res.stdout.strip() == _sha(payload)


# -- uploads --------------------------------------------------------------------------------------------
@pytest.mark.sshd
def test_upload_is_verified_and_unchanged_redeploy_sends_zero_bytes(sshd, conn, tmp_path):
    data = os.urandom(3 * MiB + 123)
    local = tmp_path / "model.onnx"
    local.write_bytes(data)
    cache = tmp_path / "cache"
    events: list[tuple[str, int, int | None]] = []
    up = conn.put_cached(local, str(cache), progress=lambda *e: events.append(e))
    assert up.remote_path == f"{cache}/{_sha(data)}/model.onnx"
    assert (up.sha256, up.bytes_sent, up.resumed_from, up.cached) == (_sha(data), len(data), 0, False)
    assert _sha(Path(up.remote_path).read_bytes()) == _sha(data)  # what the target's disk holds
    assert conn.remote_sha256(up.remote_path) == _sha(data)
    assert not Path(up.remote_path + ".part").exists()
    assert ("upload model.onnx", len(data), len(data)) in events

    again = conn.put_cached(local, str(cache))
    assert (again.cached, again.bytes_sent, again.remote_path) == (True, 0, up.remote_path)
    with Connection(sshd.ssh_config()) as fresh:  # a new session knows nothing locally: still 0 bytes
        assert fresh.put_cached(local, str(cache)).bytes_sent == 0

    # A cached copy that no longer hashes right (same size, flipped byte) is replaced, not trusted.
    broken = bytearray(data)
    broken[1000] ^= 0xFF
    Path(up.remote_path).write_bytes(bytes(broken))
    fixed = conn.put_cached(local, str(cache))
    assert (fixed.cached, fixed.bytes_sent) == (False, len(data))
    assert Path(up.remote_path).read_bytes() == data


def _cut_after(sshd, part: Path, at: int):
    """A progress callback that kills the sshd session (a dropped link) once ``at`` bytes were sent and
    the target holds at least 1 MiB of the .part file."""
    state = {"killed": 0}

    def progress(task: str, done: int, total: int | None) -> None:
        if task.startswith("upload") and done >= at and not state["killed"]:
            deadline = time.monotonic() + 10
            while (not part.exists() or part.stat().st_size < MiB) and time.monotonic() < deadline:
                time.sleep(0.01)
            state["killed"] = sshd.kill_sessions()

    return progress, state


@pytest.mark.sshd
def test_upload_resumes_after_the_connection_is_cut(sshd, tmp_path):
    data = os.urandom(10 * MiB)
    local = tmp_path / "big model.onnx"
    local.write_bytes(data)
    cache = tmp_path / "cache"
    part = cache / "incoming" / quick_key(local) / "big model.onnx.part"
    progress, state = _cut_after(sshd, part, 4 * MiB)
    with Connection(sshd.ssh_config(retries=0)) as c, pytest.raises(ConnectionFailed):
        c.put_cached(local, str(cache), progress=progress)
    assert state["killed"] > 0
    have = part.stat().st_size
    assert MiB <= have < len(data)
    # nothing of the half upload is at its content address or recorded as cached
    assert not (cache / _sha(data)).exists() and not (cache / "keys").exists()

    with Connection(sshd.ssh_config()) as c:
        up = c.put_cached(local, str(cache))
    assert up.resumed_from == have
    assert up.bytes_sent == len(data) - have < len(data)
    assert _sha(Path(up.remote_path).read_bytes()) == _sha(data)
    assert not part.exists()


@pytest.mark.sshd
def test_concurrent_uploads_of_one_new_file_never_collide(sshd, tmp_path):
    """Two deploys of the same new model to one target at once (each its own connection): both succeed
    with the same verified file; the target's upload lock lets one send it and the other find it."""
    import threading

    data = os.urandom(16 * MiB)
    local = tmp_path / "model.onnx"
    local.write_bytes(data)
    cache = tmp_path / "cache"
    start = threading.Barrier(3)
    results: list = []

    def deploy() -> None:
        with Connection(sshd.ssh_config()) as c:
            c.connect()
            start.wait()
            try:
                results.append(c.put_cached(local, str(cache)))
            except Exception as exc:
                results.append(exc)

    threads = [threading.Thread(target=deploy) for _ in range(2)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join(120)
    assert all(not isinstance(r, Exception) for r in results), results
    a, b = results
    assert a.remote_path == b.remote_path and _sha(Path(a.remote_path).read_bytes()) == _sha(data)
    assert sorted([a.bytes_sent, b.bytes_sent]) == [0, len(data)]  # sent once
    assert not [p for p in (cache / "incoming").rglob("*") if p.is_file()]  # no .part or lock left


@pytest.mark.sshd
def test_target_without_room_is_refused_before_sending(conn, tmp_path):
    """More than the target's disk holds (a sparse file: no local space needed): one line naming the
    target, the cache and the size, and nothing written there."""
    cache = tmp_path / "cache"
    local = tmp_path / "huge.onnx"
    size = shutil.disk_usage(tmp_path).free + (1 << 30)
    with open(local, "wb") as f:
        f.truncate(size)

    def guard(task: str, done: int, total: int | None) -> None:
        if task.startswith("upload"):  # never fill this machine's disk, whatever edgeq does
            raise AssertionError("the upload started")

    with pytest.raises(RemoteError) as info:
        conn.put_cached(local, str(cache), progress=guard)
    msg = str(info.value)
    assert msg.startswith(f"no space left on {conn.config.destination}:{cache} (needs {-(-size // 10**6)} MB")
    assert info.value.exit_code == 1 and "permissions" not in msg
    assert not [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size]  # no data sent


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=1777", "tmpfs", str(where)],
                           capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@pytest.mark.sshd
def test_target_disk_filling_up_mid_upload_is_no_space_and_leaves_no_part(conn, tmp_path):
    """The target's disk fills while the file is on its way (a 16 MiB tmpfs, filled up by something
    else after 4 MiB): "no space left", the partial file removed; once there is room again the upload
    succeeds (not "arrived corrupted")."""
    disk = tmp_path / "target disk"
    if not _mount_tmpfs(disk, "16m"):
        pytest.skip("cannot mount a tmpfs here (the refused-before-sending test covers the check)")
    try:
        data = os.urandom(10 * MiB)
        local = tmp_path / "model.onnx"
        local.write_bytes(data)
        cache = disk / "cache"
        filler = disk / "someone else's file"

        def fill_up(task: str, done: int, total: int | None) -> None:
            if task.startswith("upload") and done >= 4 * MiB and not filler.exists():
                with open(filler, "wb") as f, contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * (1 << 16))
                        f.flush()

        with pytest.raises(RemoteError) as info:
            conn.put_cached(local, str(cache), progress=fill_up)
        assert str(info.value).startswith(f"no space left on {conn.config.destination}:{cache}")
        assert not [p for p in (cache / "incoming").rglob("*.part")]
        filler.unlink()
        up = conn.put_cached(local, str(cache))
        assert _sha(Path(up.remote_path).read_bytes()) == _sha(data) and up.resumed_from == 0
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, timeout=20)


@pytest.mark.sshd
def test_upload_reconnects_transparently_when_the_connection_drops(sshd, tmp_path):
    data = os.urandom(10 * MiB)
    local = tmp_path / "model.onnx"
    local.write_bytes(data)
    cache = tmp_path / "cache"
    progress, state = _cut_after(sshd, cache / "incoming" / quick_key(local) / "model.onnx.part", 4 * MiB)
    with Connection(sshd.ssh_config(retries=2, backoff=0.1)) as c:
        up = c.put_cached(local, str(cache), progress=progress)
        assert state["killed"] > 0
        assert up.resumed_from >= MiB and not up.cached
        assert up.bytes_sent >= len(data) - up.resumed_from
        assert c.run(["echo", "ok"]).stdout == "ok\n"  # and the connection is usable afterwards
    assert _sha(Path(up.remote_path).read_bytes()) == _sha(data)


def _middle_flipped(data: bytes) -> bytes:
    other = bytearray(data)
    other[len(data) // 2] ^= 0xFF
    return bytes(other)


@pytest.mark.sshd
def test_quick_key_hit_from_another_copy_sends_nothing(sshd, conn, tmp_path):
    """The target's key record finds a file it verified before: a byte-identical copy elsewhere (new
    mtime, new local path, fresh connection) is cached, and the record holds the full sha256."""
    data = os.urandom(3 * MiB + 7)
    first = tmp_path / "a" / "model.onnx"
    first.parent.mkdir()
    first.write_bytes(data)
    cache = tmp_path / "cache"
    up = conn.put_cached(first, str(cache))
    assert (cache / "keys" / quick_key(first)).read_text().strip() == _sha(data)
    assert not [p for p in (cache / "incoming").rglob("*") if p.is_file()]  # no leftovers
    copy = tmp_path / "b" / "model.onnx"
    copy.parent.mkdir()
    copy.write_bytes(data)
    with Connection(sshd.ssh_config()) as fresh:
        again = fresh.put_cached(copy, str(cache))
    assert (again.cached, again.bytes_sent, again.remote_path) == (True, 0, up.remote_path)
    assert again.sha256 == _sha(data)


@pytest.mark.sshd
def test_quick_key_collision_uploads_and_addresses_by_the_full_sha256(conn, tmp_path):
    """Same size, head and tail, one different byte in the middle: the same quick key, other content.
    The full hash decides: the second file is sent in full and lands under its own sha256; both are
    then cached (0 bytes) although the key record can name only one of them."""
    a = os.urandom(5 * MiB)
    b = _middle_flipped(a)
    la, lb = tmp_path / "a" / "m.onnx", tmp_path / "b" / "m.onnx"
    for path, data in ((la, a), (lb, b)):
        path.parent.mkdir()
        path.write_bytes(data)
    assert quick_key(la) == quick_key(lb)
    cache = tmp_path / "cache"
    up_a = conn.put_cached(la, str(cache))
    up_b = conn.put_cached(lb, str(cache))
    assert (up_b.cached, up_b.bytes_sent, up_b.sha256) == (False, len(b), _sha(b))
    assert up_b.remote_path == f"{cache}/{_sha(b)}/m.onnx" != up_a.remote_path
    assert Path(up_b.remote_path).read_bytes() == b and Path(up_a.remote_path).read_bytes() == a
    for path, data in ((la, a), (lb, b)):
        again = conn.put_cached(path, str(cache))
        assert (again.cached, again.bytes_sent, again.sha256) == (True, 0, _sha(data))


@pytest.mark.sshd
def test_key_record_pointing_to_a_missing_or_bad_file_means_upload(conn, tmp_path):
    data = os.urandom(2 * MiB + 5)
    local = tmp_path / "m.onnx"
    local.write_bytes(data)
    cache = tmp_path / "cache"
    up = conn.put_cached(local, str(cache))
    shutil.rmtree(Path(up.remote_path).parent)  # the record survives, the file does not
    again = conn.put_cached(local, str(cache))
    assert (again.cached, again.bytes_sent, again.remote_path) == (False, len(data), up.remote_path)
    assert Path(up.remote_path).read_bytes() == data
    # A record naming another file's (existing, intact, same name and size) address is not trusted:
    # the full hash differs, and our own address is found instead.
    other = tmp_path / "o" / "m.onnx"
    other.parent.mkdir()
    other.write_bytes(os.urandom(len(data)))
    up_o = conn.put_cached(other, str(cache))
    (cache / "keys" / quick_key(local)).write_text(up_o.sha256 + "\n")
    third = conn.put_cached(local, str(cache))
    assert (third.cached, third.bytes_sent, third.remote_path) == (True, 0, up.remote_path)
    (cache / "keys" / quick_key(local)).write_text("garbage")
    assert conn.put_cached(local, str(cache)).sha256 == _sha(data)


@pytest.mark.sshd
def test_cache_without_key_records_still_sends_nothing_for_a_cached_file(sshd, conn, tmp_path):
    """A cache filled before key records existed (``<sha256>/<name>`` only): still 0 bytes, once
    verified the record is written, and another file is uploaded normally."""
    data = os.urandom(2 * MiB + 1)
    local = tmp_path / "m.onnx"
    local.write_bytes(data)
    cache = tmp_path / "cache"
    up = conn.put_cached(local, str(cache))
    shutil.rmtree(cache / "keys")
    with Connection(sshd.ssh_config()) as fresh:
        again = fresh.put_cached(local, str(cache))
    assert (again.cached, again.bytes_sent, again.remote_path) == (True, 0, up.remote_path)
    assert (cache / "keys" / quick_key(local)).read_text().strip() == _sha(data)
    shutil.rmtree(cache / "keys")
    Path(up.remote_path).write_bytes(_middle_flipped(data))  # damaged since: not trusted
    fixed = conn.put_cached(local, str(cache))
    assert (fixed.cached, fixed.bytes_sent) == (False, len(data))
    assert Path(up.remote_path).read_bytes() == data


@pytest.mark.sshd
def test_stale_incoming_part_with_other_content_is_restarted_not_resumed(conn, tmp_path):
    """A .part left by a different file with the same quick key (or a corrupt one) is not resumed:
    its prefix does not hash like ours, so the upload starts over and still verifies."""
    data = os.urandom(4 * MiB)
    local = tmp_path / "m.onnx"
    local.write_bytes(data)
    cache = tmp_path / "cache"
    part = cache / "incoming" / quick_key(local) / "m.onnx.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(_middle_flipped(data)[: 3 * MiB])  # same first 2 MiB, then different
    up = conn.put_cached(local, str(cache))
    assert (up.resumed_from, up.bytes_sent, up.cached) == (0, len(data), False)
    assert Path(up.remote_path).read_bytes() == data and not part.exists()


@pytest.mark.sshd
def test_file_name_with_spaces_and_shell_metacharacters(conn, tmp_path):
    tag = uuid.uuid4().hex[:8]
    name = f"my model; rm -rf x $(touch pwned-{tag}) `touch pwned-{tag}` 'q' \"d\" &.onnx"
    local = tmp_path / "src" / name
    local.parent.mkdir()
    data = os.urandom(100_000)
    local.write_bytes(data)
    x = tmp_path / "x"
    x.mkdir()
    cache = tmp_path / "cache"
    up = conn.put_cached(local, str(cache))
    assert up.remote_path == f"{cache}/{_sha(data)}/{name}"
    assert conn.exists(up.remote_path) and not conn.exists(up.remote_path + ".nope")
    listing = conn.run(["ls", "-1", "--", str(Path(up.remote_path).parent)]).stdout.splitlines()
    assert listing == [name]
    back = tmp_path / "back" / name
    conn.get(up.remote_path, back)
    assert back.read_bytes() == data
    assert conn.put_cached(local, str(cache)).cached
    home = Path(conn.run(["sh", "-c", 'printf %s "$HOME"']).stdout)
    for where in (home, tmp_path, cache, Path.cwd(), Path(up.remote_path).parent):
        assert not (where / f"pwned-{tag}").exists()
    assert x.is_dir()


@pytest.mark.sshd
def test_relative_cache_dir_lands_under_home_as_an_absolute_path(conn, tmp_path):
    local = tmp_path / "m.onnx"
    local.write_bytes(b"weights")
    name = f".edgeq-test-cache-{uuid.uuid4().hex[:8]}"
    home = conn.run(["sh", "-c", 'printf %s "$HOME"']).stdout
    try:
        up = conn.put_cached(local, f"~/{name}")
        assert up.remote_path == f"{home}/{name}/{_sha(b'weights')}/m.onnx"
        assert conn.run(["cat", up.remote_path], cwd="/").stdout == "weights"
    finally:
        conn.run(["rm", "-rf", "--", f"{home}/{name}"])


@pytest.mark.sshd
def test_empty_file_uploads(conn, tmp_path):
    (tmp_path / "empty.bin").write_bytes(b"")
    up = conn.put_cached(tmp_path / "empty.bin", str(tmp_path / "cache"))
    assert (up.sha256, up.bytes_sent, Path(up.remote_path).read_bytes()) == (_sha(b""), 0, b"")


@pytest.mark.sshd
def test_get_missing_file_is_a_remote_error_and_writes_nothing(conn, tmp_path):
    with pytest.raises(RemoteError):
        conn.get(str(tmp_path / "nope.json"), tmp_path / "out" / "nope.json")
    assert not (tmp_path / "out" / "nope.json").exists()


# -- host keys and authentication -------------------------------------------------------------------------
@pytest.mark.sshd
@pytest.mark.parametrize("exists", [True, False])
def test_unknown_host_key_is_refused(sshd, tmp_path, exists):
    kh = tmp_path / "known_hosts"
    if exists:
        kh.write_text("# nothing for this host\n")
    with Connection(sshd.ssh_config(known_hosts=str(kh))) as c, pytest.raises(HostKeyUnknown) as info:
        c.run(["true"])
    assert "ssh-keyscan" in str(info.value) and "--accept-new-host-key" in str(info.value)
    assert info.value.exit_code == 2
    assert kh.read_text() == "# nothing for this host\n" if exists else not kh.exists()


@pytest.mark.sshd
@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_host_key_is_always_refused(sshd, tmp_path, accept_new):
    from sshd import keygen

    other = keygen(tmp_path / "other_host_key")
    kind, blob = Path(f"{other}.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# lab targets\n[{sshd.host}]:{sshd.port} {kind} {blob}\n")
    before = kh.read_bytes()
    cfg = sshd.ssh_config(known_hosts=str(kh), accept_new_host_key=accept_new)
    with Connection(cfg) as c, pytest.raises(HostKeyChanged) as info:
        c.run(["true"])
    msg = str(info.value)
    assert "CHANGED" in msg and str(kh) in msg and "line 2" in msg and f"[{sshd.host}]:{sshd.port}" in msg
    assert kh.read_bytes() == before


@pytest.mark.sshd
@pytest.mark.parametrize("pattern", ["*", "[127.0.0.*]:{port}", "lab,[127.0.0.?]:{port}"])
def test_pattern_entry_with_another_key_is_a_changed_key(sshd, tmp_path, pattern):
    """OpenSSH applies wildcard known_hosts entries; one holding another key of the server's type is a
    changed key, never a new one (paramiko alone looks up exact names and would call it unknown)."""
    from sshd import keygen

    other = keygen(tmp_path / "other_host_key")
    kind, blob = Path(f"{other}.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"# lab\n{pattern.format(port=sshd.port)} {kind} {blob}\n")
    before = kh.read_bytes()
    cfg = sshd.ssh_config(known_hosts=str(kh), accept_new_host_key=True)
    with Connection(cfg) as c, pytest.raises(HostKeyChanged) as info:
        c.run(["true"])
    assert "CHANGED" in str(info.value) and "line 2" in str(info.value) and str(kh) in str(info.value)
    assert kh.read_bytes() == before  # nothing added
    # OpenSSH's own client refuses it the same way
    opts = [o.replace(sshd.known_hosts, str(kh)) for o in sshd.ssh_options()]
    first = ["-o", "StrictHostKeyChecking=accept-new"]  # ssh keeps the first value given for an option
    res = subprocess.run(["ssh", *first, *opts, sshd.host, "true"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in res.stderr


@pytest.mark.sshd
def test_pattern_entries_with_the_right_key_or_excluding_the_host(sshd, tmp_path):
    kind, blob = sshd.known_hosts_line().split()[1:3]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.*]:{sshd.port} {kind} {blob}\n")  # the server's key, by pattern: trusted
    with Connection(sshd.ssh_config(known_hosts=str(kh))) as c:
        assert c.run(["true"]).exit_code == 0
    assert kh.read_text() == f"[127.0.0.*]:{sshd.port} {kind} {blob}\n"
    from sshd import keygen

    other = Path(f"{keygen(tmp_path / 'other_host_key')}.pub").read_text().split()[1]
    kh.write_text(f"*,![{sshd.host}]:{sshd.port} {kind} {other}\n")
    with Connection(sshd.ssh_config(known_hosts=str(kh))) as c, pytest.raises(HostKeyUnknown):
        c.run(["true"])  # the negated pattern excludes this host: its key is unknown, not changed


@pytest.mark.sshd
def test_accept_new_host_key_adds_it_and_then_it_is_trusted(sshd, tmp_path):
    kh = tmp_path / "ssh" / "known_hosts"  # the directory does not exist yet either
    with Connection(sshd.ssh_config(known_hosts=str(kh), accept_new_host_key=True)) as c:
        assert c.run(["echo", "hi"]).stdout == "hi\n"
    assert kh.read_text() == sshd.known_hosts_line() + "\n"  # exactly the server's key, OpenSSH's format
    with Connection(sshd.ssh_config(known_hosts=str(kh))) as c:
        assert c.run(["true"]).exit_code == 0
    # OpenSSH's own client agrees with what we wrote.
    if shutil.which("ssh") is None:
        pytest.skip("ssh (openssh-client) not installed")
    opts = [o.replace(sshd.known_hosts, str(kh)) for o in sshd.ssh_options()]
    res = subprocess.run(["ssh", *opts, sshd.host, "true"], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


@pytest.mark.sshd
def test_malformed_known_hosts_is_one_clear_error(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{sshd.host}]:{sshd.port} ssh-ed25519 AAAA%%%not-base64\n")
    with Connection(sshd.ssh_config(known_hosts=str(kh))) as c, pytest.raises(RemoteError) as info:
        c.run(["true"])
    assert str(kh) in str(info.value) and info.value.exit_code == 2


@pytest.mark.sshd
def test_hashed_known_hosts_entry_is_honoured(sshd, tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text(sshd.known_hosts_line() + "\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(kh)], check=True, capture_output=True)
    with Connection(sshd.ssh_config(known_hosts=str(kh))) as c:
        assert c.run(["true"]).exit_code == 0


@pytest.mark.sshd
def test_wrong_key_is_authentication_failed(sshd, tmp_path):
    from sshd import keygen

    wrong = keygen(tmp_path / "id_wrong")
    cfg = sshd.ssh_config(identity_file=str(wrong))
    with Connection(cfg) as c, pytest.raises(AuthenticationFailed) as info:
        c.run(["true"])
    assert "PRIVATE KEY" not in str(info.value) and info.value.exit_code == 2
    for bad in (tmp_path / "missing", Path(f"{wrong}.pub")):  # absent; a public key, not a private one
        t0 = time.monotonic()
        with Connection(sshd.ssh_config(identity_file=str(bad), retries=3, backoff=1.0)) as c, pytest.raises(
            AuthenticationFailed
        ) as info:
            c.run(["true"])
        assert str(bad) in str(info.value) and time.monotonic() - t0 < 1.0  # no retries for a config error


# -- connections ----------------------------------------------------------------------------------------
@pytest.mark.sshd
def test_unreachable_target_fails_after_retries_with_backoff(sshd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once the socket closes
    t0 = time.monotonic()
    cfg = sshd.ssh_config(port=port, retries=2, backoff=0.1)
    with Connection(cfg) as c, pytest.raises(ConnectionFailed) as info:
        c.run(["true"])
    assert time.monotonic() - t0 >= 0.1 + 0.2  # two backoffs: 0.1 s then 0.2 s
    assert "3 attempt" in str(info.value) and info.value.exit_code == 1


@pytest.mark.sshd
def test_reconnects_after_the_server_restarts(sshd, conn, tmp_path):
    (tmp_path / "f").write_text("x")
    assert conn.run(["echo", "1"]).stdout == "1\n" and conn.exists(str(tmp_path / "f"))
    sshd.restart()
    assert conn.exists(str(tmp_path / "f"))  # SFTP reconnects for an idempotent read
    sshd.restart()
    assert conn.run(["echo", "2"]).stdout == "2\n"  # and so does a command that had not started


@pytest.mark.sshd
def test_jump_host(sshd, tmp_path):
    """ProxyJump through the same sshd to itself: the target connection rides a direct-tcpip channel."""
    cfg = sshd.ssh_config(jump=sshd.ssh_config())
    with Connection(cfg) as c:
        assert c.run(["echo", "via jump"]).stdout == "via jump\n"
        assert c._jump is not None and c._jump._alive()
        local = tmp_path / "m.onnx"
        local.write_bytes(os.urandom(50_000))
        assert c.put_cached(local, str(tmp_path / "cache")).bytes_sent == 50_000
