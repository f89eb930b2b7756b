"""The pieces of the Ansible engine that need no play (issue 44): OpenSSH's own failure messages read as the
causes edgeq's transport names, the host key policy the modules hold Ansible's connection to, the ssh
arguments edgeq's inventory gives each board, and a target's round trip through that inventory."""

from __future__ import annotations

import shlex
import socket
import subprocess
from pathlib import Path

import pytest

from edgeq.ansible.connection import (
    HostKeyPolicyError,
    check_host_key_policy,
    connection_error,
    strict_ssh_args,
)
from edgeq.ansible.hostvars import inventory, target_from_record, target_from_vars, target_record
from edgeq.errors import EdgeqError
from edgeq.remote.causes import CAUSES, cause_of
from edgeq.remote.targets import target_from_dict


def _target(sshd, **extra):
    data = {"host": sshd.host, "port": sshd.port, "user": sshd.user, "identity_file": sshd.identity_file,
            "known_hosts": sshd.known_hosts, **extra}  # fmt: skip
    return target_from_dict(data, Path("board.yaml"), "board")


def _ssh(target, *more: str) -> str:
    """What OpenSSH's client says (stderr) trying ``true`` on the target with edgeq's strict arguments."""
    argv = ["ssh", *strict_ssh_args(target), "-i", str(target.identity_file), "-p", str(target.port),
            "-l", target.user, *more, target.host, "true"]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert res.returncode == 255, res
    return res.stderr


@pytest.mark.sshd
def test_openssh_failures_read_as_the_causes_edgeq_names(sshd, tmp_path):
    """Real OpenSSH client, real sshd on 127.0.0.1: each failure becomes the native transport's typed error,
    with its cause's exit code and reachability."""
    from sshd import keygen

    def said(target, *more: str) -> EdgeqError:
        return connection_error(_ssh(target, *more), target)

    unknown = _target(sshd, known_hosts=str(tmp_path / "empty_known_hosts"))
    (tmp_path / "empty_known_hosts").write_text("")
    stranger = keygen(tmp_path / "stranger")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = {
        "host key unknown": said(unknown),
        "authentication refused": said(_target(sshd, identity_file=str(stranger))),
        "connection refused": said(_target(sshd, port=closed)),
    }
    for cause, error in cases.items():
        assert cause_of(error) is CAUSES[cause], (cause, error)
        assert error.exit_code == CAUSES[cause].exit_code
    assert "is not in" in str(cases["host key unknown"]) and "ssh-keyscan" in str(cases["host key unknown"])
    assert "refused authentication" in str(cases["authentication refused"])
    # and a connection that works says nothing at all
    ok = subprocess.run(["ssh", *strict_ssh_args(_target(sshd)), "-p", str(sshd.port), "-l", sshd.user, "-i",
                         sshd.identity_file, sshd.host, "true"], capture_output=True, timeout=30)  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_a_dropped_connection_and_an_unknown_name_read_as_such():
    """OpenSSH's words for the two failures a loopback sshd cannot stage on demand (ssh(1), sshconnect.c)."""
    t = target_from_dict({"host": "orin-7", "user": "nvidia", "use_agent": True}, Path("orin-7.yaml"))
    dropped = connection_error("Failed to connect to the host via ssh: Connection to orin-7 closed by remote "
                               "host.", t, running="python3")  # fmt: skip
    assert cause_of(dropped) is CAUSES["connection dropped"] and "while running python3" in str(dropped)
    name = connection_error("ssh: Could not resolve hostname orin-7: Name or service not known", t)
    assert cause_of(name) is CAUSES["unknown host name"] and name.exit_code == 2
    timeout = connection_error("ssh: connect to host 10.0.0.7 port 22: Connection timed out", t)
    assert cause_of(timeout) is CAUSES["unreachable"] and "Connection timed out" in str(timeout)


class _Connection:
    def __init__(self, **options):
        self.options = options

    def get_option(self, name):
        if name not in self.options:
            raise KeyError(name)
        return self.options[name]


def test_the_modules_refuse_a_connection_that_accepts_any_host_key():
    strict = _Connection(host_key_checking=True, ssh_common_args="-o StrictHostKeyChecking=yes")
    check_host_key_policy(strict, "b")
    with pytest.raises(HostKeyPolicyError, match="host_key_checking is off"):
        check_host_key_policy(_Connection(host_key_checking=False), "b")
    for loose in ("-o StrictHostKeyChecking=no", "-o UserKnownHostsFile=/dev/null",
                  "-oStrictHostKeyChecking off"):
        with pytest.raises(HostKeyPolicyError, match="turn host key checking off"):
            check_host_key_policy(_Connection(host_key_checking=True, ssh_extra_args=loose), "b")


def test_the_inventory_makes_openssh_check_keys_as_edgeq_does(tmp_path):
    key = tmp_path / "id"
    key.write_text("")
    t = target_from_dict({"host": "10.0.0.7", "user": "nvidia", "identity_file": str(key),
                          "known_hosts": str(tmp_path / "kh"), "jump_host": "ops@bastion:2222",
                          "timeouts": {"connect": 7}}, tmp_path / "t.yaml", "orin-7")  # fmt: skip
    hv = inventory((t,), previous={"orin-7": tmp_path / "runs" / "old" / "targets" / "orin-7"})["all"]
    host = hv["children"]["edgeq_fleet"]["hosts"]["orin-7"]
    args = shlex.split(host["ansible_ssh_common_args"])
    opts = dict(a.split("=", 1) for a in args[1::2])
    assert opts["StrictHostKeyChecking"] == "yes" and opts["UserKnownHostsFile"] == str(tmp_path / "kh")
    assert (opts["GlobalKnownHostsFile"], opts["IdentitiesOnly"]) == ("/dev/null", "yes")
    assert opts["ConnectTimeout"] == "7"
    hop = shlex.split(opts["ProxyCommand"])  # the jump host's key checked against the same file, never added
    assert hop[:3] == ["ssh", "-i", str(key)] and "StrictHostKeyChecking=yes" in hop
    assert f"UserKnownHostsFile={tmp_path / 'kh'}" in hop
    assert hop[-5:] == ["-p", "2222", "-l", "ops", "bastion"]
    assert (host["ansible_host"], host["ansible_user"], host["ansible_ssh_private_key_file"]) == \
        ("10.0.0.7", "nvidia", str(key))  # fmt: skip
    assert host["edgeq_previous"] == str(tmp_path / "runs" / "old" / "targets" / "orin-7")
    assert target_from_vars("orin-7", host, Path("hosts.json")) == t  # the target as edgeq read it
    accept = shlex.split(inventory((t,), accept_new_host_key=True)["all"]["children"]["edgeq_fleet"]["hosts"][
        "orin-7"]["ansible_ssh_common_args"])  # fmt: skip
    assert "StrictHostKeyChecking=accept-new" in accept


def test_a_target_survives_the_inventory_round_trip(tmp_path):
    t = target_from_dict({"host": "h", "user": "u", "use_agent": True, "tensorrt": "8.6",
                          "gpu": {"name": "Orin", "compute_capability": "8.7"},
                          "build": {"workspace": 2048, "tactic_sources": ["-CUBLAS", "+CUDNN"],
                                    "dla_core": 0},
                          "timeouts": {"build": 1200}, "gate": {"policy": "int8", "allow": ["/head/*"]}},
                         tmp_path / "orin.yaml")  # fmt: skip
    import json

    assert target_from_record(json.loads(json.dumps(target_record(t)))) == t


def test_a_users_inventory_host_reads_only_target_keys(tmp_path):
    """edgeq_<key> variables of the target schema become the target; other edgeq_ variables (a playbook's
    edgeq_model, the edgeq_board fact) are not target keys; what the inventory leaves out comes from the
    connection Ansible uses."""
    hv = {"ansible_host": "10.0.0.7", "edgeq_python": "python3.8", "edgeq_backend": "trtexec",
          "edgeq_model": "m.onnx", "edgeq_board": {"tensorrt": "8.6.2"},
          "edgeq_gpu": {"compute_capability": "8.7"}}
    t = target_from_vars("orin-7", hv, tmp_path / "inventory.yml", {"port": 2200, "remote_user": "nvidia"})
    assert (t.host, t.port, t.user) == ("10.0.0.7", 2200, "nvidia")
    assert (t.python, t.backend) == ("python3.8", "trtexec")
    assert t.compute_capability == "8.7" and t.use_agent  # no key file named: ssh-agent and default keys


def test_without_ansible_the_engine_says_how_to_get_it_before_any_work(tmp_path, monkeypatch, cli):
    """Exit 2, one line naming the missing package and the extra; no run directory made, nothing prepared."""
    import importlib.util

    from fleet_helpers import qdq_model

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ansible_runner"
                        else real(name, *a))  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "b1.yaml").write_text("host: 10.0.0.7\nuser: nvidia\nuse_agent: true\n")
    (tmp_path / "fleet.yaml").write_text("targets: [b1]\n")
    model = qdq_model(tmp_path / "net.onnx")
    code, out, err = cli("fleet", "validate", model, "--fleet", "fleet.yaml", "--engine", "ansible")
    assert code == 2 and "Traceback" not in out + err
    assert "--engine ansible needs ansible-runner, which is not installed" in err
    assert "pip install 'edgeq[ansible]'" in err and len(err.strip().splitlines()) <= 2
    assert not (tmp_path / "runs").exists()
