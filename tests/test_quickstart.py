"""The README's quick start is a test: its ``console`` block under "## Quick start", typed as written.

Every ``$ `` line runs verbatim in a shell (``bash -c``) in a fresh directory, as a new user would type it,
and every line below it is what that command prints (``…`` stands for any text: a port, a path, a
figure): each must appear in the command's output, and the command must exit 0 (or the ``# exit N`` the
block says). The world around it is real, and set up as the user's would be:

- the model: nudenet 3.4.2's trained YOLOv8n (``320n.onnx``), by the README's own ``pip download`` from the
  package index; cached (tests/index_models.py): a second run is offline;
- ``images/``: photo-like images made here with Pillow (no data set to fetch);
- the board ``orin.local``: a real OpenSSH sshd on 127.0.0.1 (tests/sshd.py) with a login ``nvidia``
  whose home is a temporary directory (nss_wrapper gives sshd that user: no system account is made),
  reached through the test HOME's ``~/.ssh/config`` (``HostName 127.0.0.1``, ``Port``), its host key
  in ``~/.ssh/known_hosts``, the key at OpenSSH's default ``~/.ssh/id_ed25519``;
- the board's TensorRT: the trtexec stand-in (tests/trtexec_replay.py) on its PATH, replaying TensorRT
  8.6.0's own layer JSON and profile of this model's Q/DQ engine (tests/fixtures/trt86-h200-yolov8n,
  ``yolov8n.static.*``: the rules' placement, as quantize writes it) with a recorded build and run log.

No onnxruntime or paramiko log line may reach the terminal in any command (``THIRD_PARTY``).
A second real model of another kind, rapidocr-onnxruntime 1.4.4's PP-OCRv4 text recogniser (a dynamic
width), goes through the same commands with its own preset.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from conftest import THIRD_PARTY
from index_models import default_cache, offline_pip_env, wheel
from trtexec_replay import Recorded, calls, replay_trtexec
from trtexec_tune import builds, tune_trtexec

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
YOLO = FIXTURES / "trt86-h200-yolov8n"
LOGS = FIXTURES / "trt86-h200"  # the closest recorded logs: TensorRT 8.6.0 on the same H200 (see below)
# the H200's implicit engine ran 2782 qps where the rules' explicit one ran 2712 (yolov8n.rounds.txt): the
# stand-in times implicit at the explicit run log's figures divided by this
IMPLICIT_FACTOR = 2711.95 / 2782.41
NSS_WRAPPER = Path("/usr/lib/x86_64-linux-gnu/libnss_wrapper.so")

pytestmark = [pytest.mark.slow, pytest.mark.sshd]


@dataclass
class Step:
    command: str
    expect: list[str] = field(default_factory=list)
    exit_code: int = 0


def quickstart(readme: Path = ROOT / "README.md") -> list[Step]:
    """The ``$`` commands of the console block under ``## Quick start`` with the lines each prints."""
    text = readme.read_text(encoding="utf-8")
    section = text.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    steps: list[Step] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append(Step(line[2:]))
        elif line.startswith("# exit "):
            steps[-1].exit_code = int(line.split()[2].rstrip(":"))
        elif line.strip() and not line.startswith("#"):
            steps[-1].expect.append(line.strip())
    return steps


def said(expected: str, output: str) -> bool:
    """``expected`` (``…`` for any text) is one of ``output``'s lines, or within one; runs of spaces
    match any run (a table's columns are as wide as the terminal makes them)."""
    parts = [r"\s+".join(re.escape(w) for w in part.split()) for part in expected.split("…")]
    pattern = ".*".join(parts)
    return any(re.search(pattern, line) for line in output.splitlines())


def test_the_readme_has_five_edgeq_commands_each_with_what_it_prints() -> None:
    steps = quickstart()
    edgeq = [s for s in steps if s.command.startswith("edgeq ")]
    assert len(edgeq) == 5, [s.command for s in steps]
    assert all(s.expect for s in edgeq), "every edgeq command says what it prints"
    assert steps[0].command.startswith("pip download nudenet==3.4.2 --no-deps")


# -- the world around the commands ---------------------------------------------------------------------------
def photo_like(path: Path, seed: int, size: tuple[int, int]) -> None:
    """A few-hundred-pixel image with a photo's statistics, not noise: a lit gradient sky, a ground, a
    few soft-edged blobs (faces, objects) in skin and clothing tones, sensor noise, saved as JPEG."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    w, h = size
    y = np.linspace(0, 1, h)[:, None, None]
    sky, ground = rng.uniform(80, 220, 3), rng.uniform(30, 140, 3)
    horizon = rng.uniform(0.4, 0.7)
    img = np.where(y < horizon, sky * (1 - 0.4 * y), ground * (0.7 + 0.3 * y)) * np.ones((h, w, 3))
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(2, 6))):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(0.05, 0.25) * min(w, h)
        tones = [(224, 172, 140), (141, 85, 36), (40, 60, 120), (200, 30, 40)]
        tone = tuple(int(c) for c in tones[int(rng.integers(len(tones)))])
        draw.ellipse([cx - r, cy - 1.3 * r, cx + r, cy + 1.3 * r], fill=tone)
    im = im.filter(ImageFilter.GaussianBlur(1.5))
    noisy = np.asarray(im, np.float32) + rng.normal(0, 4, (h, w, 3))
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(path, quality=90)


def text_line(path: Path, seed: int) -> None:
    """One cropped line of printed text, as a recogniser reads it (48 px high, its own width)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    words = ["invoice", "total", "amount", "paid", "order", "number", "street", "station", "platform",
             "train", "leaves", "at", "minutes"]
    text = " ".join(rng.choice(words, int(rng.integers(1, 5))))
    font = ImageFont.load_default(size=28) if hasattr(ImageFont, "load_default") else None
    w = int(16 * len(text) + 20)
    im = Image.new("RGB", (w, 48), tuple(int(c) for c in rng.integers(200, 256, 3)))
    ImageDraw.Draw(im).text((10, 8), text, fill=tuple(int(c) for c in rng.integers(0, 60, 3)), font=font)
    im.save(path)


@dataclass
class Board:
    server: object
    home: Path
    trtexec: Path


def make_board(tmp: Path) -> Board:
    """``nvidia@orin.local``: a real sshd (tests/sshd.py) that knows the user ``nvidia`` through
    nss_wrapper (its passwd: root, sshd's privilege separation user, nvidia with uid 0 and a temporary home),
    trtexec on the login's PATH (PermitUserEnvironment: the home's .ssh/environment)."""
    from sshd import SshdServer

    home, fake = tmp / "board-home", tmp / "nss"
    (home / ".ssh").mkdir(parents=True)
    fake.mkdir()
    import pwd

    sshd_user = pwd.getpwnam("sshd") if _has_user("sshd") else None
    lines = ["root:x:0:0:root:/root:/bin/sh",
             f"nvidia:x:{os.getuid()}:{os.getgid()}:board:{home}:/bin/sh"]
    if sshd_user is not None:
        lines.append(f"sshd:x:{sshd_user.pw_uid}:{sshd_user.pw_gid}::/run/sshd:/usr/sbin/nologin")
    (fake / "passwd").write_text("\n".join(lines) + "\n")
    (fake / "group").write_text(f"root:x:0:\nboard:x:{os.getgid()}:\nnogroup:x:65534:\n")
    bin_dir = tmp / "board-bin"
    bin_dir.mkdir()
    # TensorRT 8.6.0's own engines of this model on one H200, one lease (tests/fixtures/trt86-h200-yolov8n):
    # implicit INT8, and the rules' Q/DQ placement, which answers every explicit build (the mirror deploy's
    # auto placement builds); timed there at 2782 and 2712 qps (median of 3 rounds, yolov8n.rounds.txt).
    # No build/run log of this model was recorded: the same H200's logs of TensorRT 8.6.0 (trt86-h200).
    recorded = {}
    for kind, name in (("implicit", "implicit"), ("explicit", "static")):
        files = {}
        for what in ("layers", "profile"):
            path = tmp / f"yolov8n.{name}.{what}.json"
            path.write_bytes(gzip.decompress((YOLO / f"yolov8n.{name}.{what}.json.gz").read_bytes()))
            files[what] = str(path)
        files["build"] = str(LOGS / ("yolo.implicit.build.log" if kind == "implicit"
                                     else "resnet50_ortfb.explicit.build.log"))
        files["run"] = str(LOGS / "resnet50_ortfb.explicit.run.log")  # one log: the ratio is the factor's
        recorded[kind] = files
    trtexec = tune_trtexec(bin_dir, {}, recorded=recorded, implicit_factor=IMPLICIT_FACTOR)
    (home / ".ssh" / "environment").write_text(f"PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin\n")
    env = {**os.environ, "LD_PRELOAD": str(NSS_WRAPPER), "NSS_WRAPPER_PASSWD": str(fake / "passwd"),
           "NSS_WRAPPER_GROUP": str(fake / "group")}
    server = SshdServer(env=env, config=("PermitUserEnvironment PATH",)).start()
    return Board(server, home, trtexec)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def user_home(tmp: Path, board: Board) -> Path:
    """The user's HOME: ~/.ssh/config names the board, its host key known, the key at OpenSSH's default."""
    home = tmp / "home"
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    server = board.server
    shutil.copy(server.identity_file, ssh / "id_ed25519")  # type: ignore[attr-defined]
    (ssh / "id_ed25519").chmod(0o600)
    (ssh / "config").write_text(f"Host orin.local\n  HostName 127.0.0.1\n  Port {server.port}\n")  # type: ignore[attr-defined]
    (ssh / "known_hosts").write_text(server.known_hosts_line() + "\n")  # type: ignore[attr-defined]
    return home


def run_step(step: Step, cwd: Path, env: dict[str, str]) -> str:
    p = subprocess.run(["bash", "-c", step.command], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)  # fmt: skip
    output = p.stdout + p.stderr
    assert p.returncode == step.exit_code, f"$ {step.command}\nexit {p.returncode}\n{output[-4000:]}"
    assert not THIRD_PARTY.search(output), f"$ {step.command}: a third-party log line\n{output[-4000:]}"
    for line in step.expect:
        assert said(line, output), f"$ {step.command}\ndid not print: {line}\n{output[-4000:]}"
    return output


@pytest.fixture
def world(tmp_path):
    reason = _unavailable()
    if reason:
        pytest.skip(reason)
    cache = default_cache()
    wheel("nudenet==3.4.2", cache)  # once; the README's pip download below takes it from the cache
    board = make_board(tmp_path)
    home = user_home(tmp_path, board)
    work = tmp_path / "work"
    (work / "images").mkdir(parents=True)
    for i in range(10):
        photo_like(work / "images" / f"photo{i}.jpg", i, (int(240 + 37 * i), int(200 + 23 * (9 - i))))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "SSH_AUTH"))},
           "HOME": str(home), "XDG_CACHE_HOME": str(tmp_path / "cache"), "COLUMNS": "160",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           **offline_pip_env(cache)}
    yield work, env, board, cache
    board.server.close()  # type: ignore[attr-defined]


def _unavailable() -> str | None:
    from sshd import sshd_available

    if sshd_available():
        return sshd_available()
    if not NSS_WRAPPER.exists():
        return f"{NSS_WRAPPER} not found: install libnss-wrapper (tests/run.sh does as root)"
    for tool in ("unzip", "bash"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    return None


def test_the_quick_start_typed_as_written_deploys_the_real_yolov8n(world) -> None:
    work, env, board, _ = world
    for step in quickstart():
        run_step(step, work, env)
    # what reached the board: implicit INT8 (the float model and its calibration cache) and the explicit
    # engine auto decided against it, each at the shapes the images were calibrated at (the yolo preset's
    # letterbox to the model's imgsz, from its metadata), no shape flag typed
    implicit, explicit = builds(board.trtexec)
    calibrated = [any(a.startswith("--calib=") for a in argv) for argv in (implicit, explicit)]
    assert calibrated == [True, False], calibrated
    for build in (implicit, explicit):
        assert {"--minShapes=images:1x3x320x320", "--optShapes=images:1x3x320x320",
                "--maxShapes=images:1x3x320x320", "--int8"} <= set(build), build
    assert (board.home / "edgeq" / "runs").is_dir()  # the work dir under the board login's home


REC = ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx")


def as_recogniser(step: Step) -> Step:
    """The quick start's command for the second model: rapidocr-onnxruntime 1.4.4's PP-OCRv4 recogniser
    (input x [?, 3, ?, ?]: a text line of any width), calibrated on text lines with its own preset."""
    command = step.command
    if command.startswith("pip download"):
        command = (f"pip download {REC[0]} --no-deps -d . && unzip -j rapidocr_onnxruntime-1.4.4-*.whl "
                   f"{REC[1]}")
    command = command.replace("320n", "ch_PP-OCRv4_rec_infer")
    command = command.replace("--calib images/", "--calib lines/ --preprocess ppocr-rec")
    if command.startswith("edgeq deploy"):
        # quantize's model as written: the profile from the widths it calibrated at (its .int8.json); the
        # board replays the rules' engine of this model, whose int8 gate fails (exit 1, 67 of 93 layers)
        return Step("edgeq deploy ch_PP-OCRv4_rec_infer.int8.onnx --target orin", exit_code=1)
    return Step(command, exit_code=step.exit_code)


def test_the_same_commands_deploy_a_text_recogniser_with_a_dynamic_width(world) -> None:
    """No shape flag: lint resolves the width from PaddleOCR's documented default (info), quantize
    calibrates each line at its own width (the ppocr-rec preset: height 48, at least 320 wide), and
    deploy's profile spans the widths quantize recorded (opt the most common)."""
    work, env, board, cache = world
    wheel(REC[0], cache)
    (work / "lines").mkdir()
    for i in range(32):  # a few dozen lines, as a first-time user has
        text_line(work / "lines" / f"line{i}.png", i)
    # the board replays TensorRT 8.6's layer JSON of this recogniser's rules-placed engine (H100,
    # tests/fixtures/trt86-h100-paired/rec.trtexec.*); no profile of it was recorded: the YOLOv8n's
    rec_layers = work.parent / "rec.layers.json"
    rec_layers.write_bytes(gzip.decompress((FIXTURES / "trt86-h100-paired" / "rec.trtexec.layers.json.gz")
                                           .read_bytes()))
    replay_trtexec(board.trtexec.parent, build=Recorded(LOGS / "resnet50_ortfb.explicit.build.log"),
                   run=Recorded(LOGS / "resnet50_ortfb.explicit.run.log"), layers=rec_layers,
                   profile=work.parent / "yolov8n.static.profile.json")  # fmt: skip
    outputs = {}
    for step in map(as_recogniser, quickstart()):
        outputs[step.command.split()[1]] = run_step(step, work, env)
    assert said("│ info … │ dynamic-shape … │ x (input) … edgeq builds and runs it at", outputs["lint"])
    assert "x:1x3x48x320" in outputs["lint"]  # PaddleOCR's --rec_image_shape 3, 48, 320
    assert said("2 infos; pass (--fail-on warning)", outputs["lint"])
    assert said("wrote ch_PP-OCRv4_rec_infer.int8.onnx", outputs["quantize"])
    (build,) = [argv for argv in calls(board.trtexec) if any(a.startswith("--onnx=") for a in argv)]
    shapes = {a.split("=")[0]: a.split("=")[1] for a in build if a.startswith(("--min", "--opt", "--max"))}
    widths = {flag: int(spec.rsplit("x", 1)[1]) for flag, spec in shapes.items()}
    assert shapes["--minShapes"] == "x:1x3x48x320" == shapes["--optShapes"], shapes  # short lines: 320
    assert widths["--maxShapes"] > 320, shapes  # the longest line widened its input
