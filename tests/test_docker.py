"""The Dockerfile, checked without a Docker engine: its install step is the README's, the image runs as
a non-root user with SSH files mounted read-only, and everything its commands need is inside the
package (the demo runs from the package files alone, with no tests/ beside them)."""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def bash_blocks(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [b.split("```", 1)[0].strip() for b in text.split("```bash\n")[1:]]


def readme_blocks() -> list[str]:
    return bash_blocks(ROOT / "README.md")


def docker_lines() -> list[str]:
    """The docker commands the docs show (Getting started, Docker)."""
    blocks = bash_blocks(ROOT / "docs" / "getting-started.md")
    return [ln for b in blocks for ln in b.splitlines() if ln.startswith("docker ")]


def test_the_image_installs_what_the_readme_installs():
    steps = instructions()
    (pip,) = [a for k, a in steps if k == "RUN" and "pip install" in a]
    def targets(command: str) -> tuple[list[str], list[str]]:
        """(what pip installs, the constraints files it pins them with)."""
        words = shlex.split(command.split("pip install", 1)[1].split("&&")[0])
        pins = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-c", "--constraint")]
        return [w for w in words if not w.startswith("-") and w not in pins], pins

    image, readme = targets(pip), targets(readme_blocks()[0])  # the README's set-up command
    assert image == readme == (["."], ["constraints.txt"])  # the same project, extras (none) and pins
    # pip builds from what was copied before it: the files pyproject's build reads, and the pins
    copied = [src for k, a in steps[: steps.index(("RUN", pip))] if k == "COPY" for src in a.split()[:-1]]
    assert {"pyproject.toml", "README.md", "edgeq", "constraints.txt"} <= set(copied)
    base = next(a for k, a in steps if k == "FROM")
    major, minor = map(int, re.search(r"python:(\d+)\.(\d+)", base).groups())
    need = re.search(r'requires-python = ">=(\d+)\.(\d+)"', (ROOT / "pyproject.toml").read_text()).groups()
    assert (major, minor) >= tuple(map(int, need))


def test_the_image_runs_edgeq_as_a_non_root_user_with_ssh_files_read_only():
    steps = instructions()
    users = [a for k, a in steps if k == "USER"]
    assert users and users[-1] not in ("root", "0")
    entry = [a for k, a in steps if k == "ENTRYPOINT"]
    assert entry == ['["edgeq"]']
    home = f"/home/{users[-1]}"
    docker = [ln for ln in docker_lines() if ln.startswith("docker run")]
    assert docker, "the docs show how to run the image"
    from edgeq.cli import app

    commands = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for line in docker:
        words = shlex.split(line)
        mounts = [words[i + 1] for i, w in enumerate(words) if w == "-v"]
        ssh = [m for m in mounts if ".ssh" in m]
        # keys, config, known_hosts: read-only, in the image user's home
        assert all(m == f"$HOME/.ssh:{home}/.ssh:ro" for m in ssh), ssh
        image_at = words.index("edgeq")
        assert words[image_at + 1] in commands, line
    assert any(".ssh" in ln and " deploy " in ln for ln in docker)


def _package_files() -> list[Path]:
    """What ``pip install .`` puts in site-packages: pyproject's packages and package data."""
    tomllib = pytest.importorskip("tomllib")
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    include = conf["packages"]["find"]["include"]
    files = []
    for init in (ROOT / "edgeq").rglob("__init__.py"):
        pkg = ".".join(init.parent.relative_to(ROOT).parts)
        if any(fnmatch.fnmatch(pkg, pat) for pat in include):
            files += sorted(init.parent.glob("*.py"))
    for pkg, globs in conf.get("package-data", {}).items():
        base = ROOT.joinpath(*pkg.split("."))
        for g in globs:
            files += sorted(base.glob(g))
    return files


@pytest.mark.slow
def test_the_demo_runs_from_the_package_files_alone(tmp_path):
    site = tmp_path / "site"
    for f in _package_files():
        dest = site / f.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.read_bytes())
    assert list((site / "edgeq" / "data" / "engines").glob("*.layers.json.gz"))
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = "import sys, edgeq; from edgeq.cli import run; print(edgeq.__file__); sys.exit(run(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "demo", "--samples", "8"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[0].startswith(str(site))  # the copy ran, not the checkout
    assert "report (recorded engines)" in proc.stdout and "resnet50.implicit" in proc.stdout
    assert "not present in this install" not in proc.stdout
