"""Release bundles: what a fleet run proved, in one reproducible tarball with a manifest.

A bundle (``edgeq release``) holds the shipped ONNX (cleaned, quantized), the calibration cache, one
engine per target kind (``engines/<kind>/engine.plan``, kind = compute capability + TensorRT version:
an engine loads only on the GPU and TensorRT it was built for, and on every identical board), each
target's report and stage records, and ``manifest.json``: sha256 and size of every file, the versions
(TensorRT, CUDA driver, L4T/JetPack, GPU) of each kind, edgeq's version, the source model's hash, the
git commit, the creation time and the manifest's own hash.

Same inputs, same bytes: entries sorted, mtimes fixed to the creation time (the fleet run's, or
``SOURCE_DATE_EPOCH`` as reproducible-builds.org defines it), owners 0/root-less, gzip without name or
timestamp. ``verify`` re-reads a bundle and names every problem by kind.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from edgeq import __version__
from edgeq.errors import EdgeqError
from edgeq.fs import atomic_path
from edgeq.pipeline.rundir import slug
from edgeq.text import noun, plural

FORMAT = "edgeq-release/1"
MANIFEST = "manifest.json"
STAMP = "%Y-%m-%dT%H:%M:%SZ"
REPORT_FILES = ("report.json", "report.html", "stages.json", "timings.json", "probe.json")


class ReleaseError(EdgeqError):
    """A fleet directory cannot be bundled, or a file is not a release bundle."""


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest with ``manifest_sha256``: the hash of its canonical JSON without that key."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return {**body, "manifest_sha256": sha256_bytes(canonical(body))}


def _git_commit(path: Path) -> Optional[str]:
    try:
        res = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    out = res.stdout.strip()
    return out if res.returncode == 0 and len(out) == 40 else None


def versions_from_probe(facts: dict[str, Any]) -> dict[str, Any]:
    """The board facts an engine was built with (edgeq.agent.probe): TensorRT, GPU, driver, CUDA,
    L4T/JetPack (edgeq.release.jetpack), free disk."""
    from edgeq.release.jetpack import jetpack_for, l4t_of

    gpus = facts.get("gpus") or [{}]
    cuda = facts.get("cuda") or {}
    disk = facts.get("disk") or {}
    l4t = l4t_of(facts)
    return {
        "tensorrt": (facts.get("tensorrt") or {}).get("version"),
        "gpu": gpus[0].get("name"),
        "compute_capability": gpus[0].get("compute_capability"),
        "cuda_driver": gpus[0].get("driver") or facts.get("driver"),
        "cuda": cuda.get("toolkit") or cuda.get("runtime"),  # the board's installed CUDA
        "l4t": l4t,
        "jetpack": jetpack_for(l4t),
        "disk_free_mib": disk["free_bytes"] >> 20 if isinstance(disk.get("free_bytes"), int) else None,
    }


def _created(fleet: dict[str, Any]) -> _dt.datetime:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch and epoch.isdigit():
        return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc)
    return _dt.datetime.strptime(fleet["created"], STAMP).replace(tzinfo=_dt.timezone.utc)


def collect(fleet_dir: Path) -> tuple[dict[str, bytes], dict[str, Any]]:
    """(bundle path -> bytes, manifest without files) from a fleet run directory (``fleet.json``)."""
    fleet_dir = Path(fleet_dir)
    try:
        fleet = json.loads((fleet_dir / "fleet.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ReleaseError(f"{fleet_dir}: not a fleet run directory (no readable fleet.json)",
                           "give the directory 'edgeq fleet validate' printed") from None
    if not fleet.get("passed"):
        failed = [t["target"] for t in fleet.get("targets", []) if t.get("status") != "passed"]
        raise ReleaseError(f"{fleet_dir}: not released: {noun(len(failed), 'target')} {', '.join(failed)} "
                           "did not pass",
                           "fix them (or drop them from the fleet) and validate again", exit_code=1)
    files: dict[str, bytes] = {}
    model = fleet_dir / fleet["model_file"]
    files[f"model/{model.name}"] = model.read_bytes()
    if fleet.get("cache_file"):
        cache = fleet_dir / fleet["cache_file"]
        files[f"model/{cache.name}"] = cache.read_bytes()
        # its implicit-path pair (edgeq quantize's naming): trtexec --int8 --calib=CACHE --onnx=FP32
        from edgeq.quant.quantize import implicit_model_path

        fp32 = implicit_model_path(cache)
        if fp32.is_file():
            files[f"model/{fp32.name}"] = fp32.read_bytes()
    engines: dict[str, Any] = {}
    targets = []
    rows = sorted(fleet["targets"], key=lambda r: r["target"])

    def kind_of(row: dict[str, Any]) -> str:  # unknown GPU or TensorRT: an engine of its own
        return row["kind"] or f"target-{slug(row['target'])}"

    # A kind's engine is its builder's (the other rows' build cell says "reused"): that board's engine
    # and probe, whatever the order of the rows.
    for row in sorted(rows, key=lambda r: r.get("build") == "reused"):
        run = fleet_dir / "targets" / slug(row["target"])
        kind = kind_of(row)
        if kind not in engines:
            probe = json.loads((run / "probe.json").read_text(encoding="utf-8"))
            files[f"engines/{kind}/engine.plan"] = (run / "engine.plan").read_bytes()
            versions = versions_from_probe(probe)
            # where each came from: the probe, or the target file where the probe found no GPU
            sources = {k: "probe" for k in ("tensorrt", "gpu", "compute_capability") if versions[k]}
            for k in ("gpu", "compute_capability"):
                if not versions[k] and row.get(k):
                    versions[k], sources[k] = row[k], (row.get("sources") or {}).get(k, "target file")
            engines[kind] = {"path": f"engines/{kind}/engine.plan", "built_on": row["target"], **versions,
                             "sources": sources}  # fmt: skip
    for row in rows:
        run = fleet_dir / "targets" / slug(row["target"])
        for name in REPORT_FILES:
            if (run / name).is_file():
                files[f"reports/{row['target']}/{name}"] = (run / name).read_bytes()
        targets.append({"name": row["target"], "kind": kind_of(row), "engine": engines[kind_of(row)]["path"],
                        "gate": row["gate"], "latency_p50_ms": row["latency_p50_ms"],
                        "latency_p99_ms": row["latency_p99_ms"], "throughput_qps": row["throughput_qps"]})
    placements = placement_files(fleet_dir, fleet, files)
    src = Path(fleet["model"])
    meta = {
        "format": FORMAT,
        "edgeq": fleet.get("edgeq", __version__),
        "created": _created(fleet).strftime(STAMP),
        "source_model": {"name": src.name, "sha256": fleet["source_sha256"]},
        "git_commit": _git_commit(src.resolve().parent),
        "engines": engines,
        "targets": targets,
        **({"placements": placements} if placements else {}),
    }
    return files, meta


# What a kind's placement record keeps: the decision and its figures, no machine-local paths.
_PLACEMENT_KEYS = ("kind", "decided_on", "kept", "reason", "from_cache", "key", "implicit_build_seconds")
_EVIDENCE_KEYS = ("created", "target", "ratio", "min_ratio", "implicit_qps", "relative_gate",
                  "explicit_build_error")


def placement_files(fleet_dir: Path, fleet: dict[str, Any], files: dict[str, bytes]) -> dict[str, Any]:
    """``--placement auto``: each kind's decision into ``placement/<kind>/`` (``placement.json``, both
    engines' layer JSON where at hand, the kind's model when it is not the fleet's), added to ``files``;
    returns the manifest's summary per kind (kept, reason, ratio, from cache)."""
    out: dict[str, Any] = {}
    for kind, p in sorted((fleet.get("placements") or {}).items()):
        ev = p.get("evidence") or {}
        record = {**{k: p.get(k) for k in _PLACEMENT_KEYS},
                  "evidence": {k: ev.get(k) for k in _EVIDENCE_KEYS}}
        base = f"placement/{kind}"
        for engine, path in sorted((ev.get("layers") or {}).items()):
            if path and Path(path).is_file():  # a decision read from the cache: where it was made, if kept
                files[f"{base}/{engine}.layers.json"] = Path(path).read_bytes()
        record["layers"] = sorted(f for f in files if f.startswith(f"{base}/") and f.endswith(".layers.json"))
        if p.get("model_file") and p["model_file"] != fleet.get("model_file"):
            model = fleet_dir / p["model_file"]
            files[f"{base}/{model.name}"] = model.read_bytes()
            record["model"] = f"{base}/{model.name}"
        files[f"{base}/placement.json"] = json.dumps(record, indent=2, sort_keys=True).encode("utf-8") + b"\n"
        out[kind] = {"kept": p.get("kept"), "ratio": ev.get("ratio"), "from_cache": p.get("from_cache"),
                     "reason": p.get("reason"), "record": f"{base}/placement.json"}  # fmt: skip
    return out


def _tar_bytes(files: dict[str, bytes], mtime: int) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar:  # fmt: skip
        for name in sorted(files):
            data = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def build_bundle(fleet_dir: Path, output: Path) -> dict[str, Any]:
    """Write the bundle of ``fleet_dir`` to ``output`` (atomically); returns its manifest. An output in
    the fleet directory is refused: it would overwrite what the bundle is made of, or land in it."""
    where, into = Path(fleet_dir).resolve(), Path(output).resolve()
    if into == where or where in into.parents:
        raise ReleaseError(f"{output}: is inside the fleet directory {fleet_dir} it bundles; edgeq never "
                           "writes into its input", "write the bundle outside it")
    files, meta = collect(fleet_dir)
    meta["files"] = [
        {"path": p, "sha256": sha256_bytes(files[p]), "size": len(files[p])} for p in sorted(files)
    ]
    manifest = seal(meta)
    files[MANIFEST] = json.dumps(manifest, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    created = _dt.datetime.strptime(manifest["created"], STAMP).replace(tzinfo=_dt.timezone.utc)
    with atomic_path(output) as tmp:
        tmp.write_bytes(_tar_bytes(files, int(created.timestamp())))
    return manifest


# --------------------------------------------------------------------------------------------------
# verify / inspect
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    kind: str  # corrupt | manifest | modified | missing | extra
    path: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.path}: {self.detail}"


@dataclass(frozen=True)
class Verification:
    """The verdict of ``verify``: true when every file and the manifest check out."""

    bundle: Path
    manifest: Optional[dict[str, Any]]
    problems: tuple[Problem, ...]
    checked: int
    files: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)  # what was checked

    def __bool__(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        if self:
            return f"{self.bundle}: OK, {self.checked} files match manifest.json (sha256 and size)"
        kinds = sorted({p.kind for p in self.problems})
        return f"{self.bundle}: FAILED: {plural(len(self.problems), 'problem')} ({', '.join(kinds)})"


GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952's ID1 ID2
_A_BUNDLE = "give the .tar.gz 'edgeq release' wrote"


def check_gzip(path: Path) -> None:
    """An ONNX model, an engine or a plain tar given as a bundle is the wrong file (exit 2), said before
    anything is made of its bytes (install checks this before its signature)."""
    with open(path, "rb") as f:
        if f.read(len(GZIP_MAGIC)) != GZIP_MAGIC:
            raise ReleaseError(f"{path}: not a .tar.gz bundle (not gzip data)", _A_BUNDLE)


def read_bundle(path: Path, data: Optional[bytes] = None) -> dict[str, bytes]:
    """Every regular file of a bundle (from ``data``, the file's bytes already read, when given). A file
    that is no tar.gz at all (a model, an engine) is the wrong input (ReleaseError, exit 2); a tar.gz
    whose bytes do not read back is damaged (exit 1: what ``release verify`` reports as a problem
    found)."""
    path = Path(path)
    if data is None:
        if path.is_dir():
            raise ReleaseError(f"{path}: is a directory, not a bundle",
                               f"give the .tar.gz 'edgeq release' wrote (a fleet directory becomes one with "
                               f"'edgeq release --from {path} -o B.tar.gz')")  # fmt: skip
        if not path.is_file():
            raise ReleaseError(f"{path}: no such bundle", "give the .tar.gz 'edgeq release' wrote")
        check_gzip(path)
        raw = path.read_bytes()
    elif data[: len(GZIP_MAGIC)] != GZIP_MAGIC:
        raise ReleaseError(f"{path}: not a .tar.gz bundle (not gzip data)", _A_BUNDLE)
    else:
        raw = data
    try:
        # Whole-file gunzip first: it checks the gzip CRC, which reading the tar stream may stop short of.
        data = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as e:
        raise ReleaseError(f"{path}: corrupt bundle: the archive does not read back ({e})",
                           "the file was damaged in transit or edited; fetch it again", exit_code=1) from None
    out: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for m in tar.getmembers():
                if not m.isfile():
                    raise ReleaseError(f"{path}: entry '{m.name}' is not a regular file", exit_code=1)
                f = tar.extractfile(m)
                out[m.name] = f.read() if f is not None else b""
    except (tarfile.TarError, OSError, EOFError) as e:  # gzip's CRC held: what was compressed is no tar
        raise ReleaseError(f"{path}: not a .tar.gz bundle (gzip data, but not a tar archive: {e})",
                           _A_BUNDLE) from None
    return out


def verify(path: Path, data: Optional[bytes] = None) -> Verification:
    """Check the manifest's own hash, then every file's sha256 and size, then files not listed (of
    ``data``, the file's bytes already read, when given: what was checked is what is used)."""
    files = read_bundle(path, data)
    problems: list[Problem] = []
    raw = files.pop(MANIFEST, None)
    if raw is None:
        missing = Problem("missing", MANIFEST, "the bundle has no manifest")
        return Verification(Path(path), None, (missing,), 0)
    try:
        manifest = json.loads(raw)
        listed = {f["path"]: f for f in manifest["files"]}
    except (ValueError, KeyError, TypeError):
        unreadable = Problem("manifest", MANIFEST, "not a readable manifest")
        return Verification(Path(path), None, (unreadable,), 0)
    if seal(manifest).get("manifest_sha256") != manifest.get("manifest_sha256"):
        problems.append(Problem("manifest", MANIFEST, "edited: its content does not match manifest_sha256"))
    for name, entry in sorted(listed.items()):
        if name not in files:
            problems.append(Problem("missing", name, "listed in the manifest, not in the bundle"))
            continue
        data = files[name]
        if len(data) != entry.get("size") or sha256_bytes(data) != entry.get("sha256"):
            found = f"sha256 {sha256_bytes(data)[:16]}... size {len(data)}"
            want = f"sha256 {str(entry.get('sha256'))[:16]}... size {entry.get('size')}"
            problems.append(Problem("modified", name, f"{found}, the manifest says {want}"))
    for name in sorted(set(files) - set(listed)):
        problems.append(Problem("extra", name, "in the bundle, not in the manifest"))
    return Verification(Path(path), manifest, tuple(problems), len(listed), {**files, MANIFEST: raw})


REFUSED = 2  # a bundle a command will not act on is the user's input, whatever is wrong with it


def require_intact(path: Path, refused: str, data: Optional[bytes] = None) -> Verification:
    """``verify`` as a refusal, for the commands that act on a bundle (``release sign``: "not signed",
    ``release install``: "not installed"): a file that is no bundle, an archive that does not read back
    or a bundle that fails its manifest is refused (exit 2), naming what is wrong with it. Run before
    anything about signatures, so a damaged bundle is said to be damaged, never "not signed"."""
    try:
        checked = verify(path, data)
    except ReleaseError as e:
        raise ReleaseError(f"{refused}: {e.message}", e.hint, exit_code=REFUSED) from None
    if not checked or checked.manifest is None:
        first = checked.problems[0] if checked.problems else "no manifest"
        raise ReleaseError(f"{refused}: {path}: it does not verify ({first})",
                           f"see 'edgeq release verify {path}'; fetch the bundle again", exit_code=REFUSED)
    return checked


def inspect(path: Path) -> dict[str, Any]:
    """The bundle's manifest (read, not verified: ``verify`` does that). ``inspect`` checks nothing, so
    a file it cannot read a manifest from (damaged, no manifest) is bad input: exit 2."""
    try:
        files = read_bundle(path)
    except ReleaseError as e:
        raise ReleaseError(e.message, e.hint, exit_code=REFUSED) from None
    if MANIFEST not in files:
        raise ReleaseError(f"{path}: no manifest.json in the bundle", "is it an edgeq release bundle?")
    try:
        manifest: dict[str, Any] = json.loads(files[MANIFEST])
    except ValueError:
        raise ReleaseError(f"{path}: manifest.json is not JSON", "is it an edgeq release bundle?") from None
    return manifest
