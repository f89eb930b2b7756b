"""What the target is: Python, GPU, Jetson model, L4T, CUDA, driver, memory, DLA cores, TensorRT (stdlib
only).

GPU facts come from ``nvidia-smi`` on desktops and from the device tree on Jetson, where nvidia-smi is
absent or reports little (JetPack <= 5) and memory is shared with the CPU (so MemAvailable is the
honest free-memory figure).
"""

import os
import platform
import re
import sys

from .common import load_libcudart, run_tool

# Jetson SoCs by their device-tree "compatible" string -> (family, CUDA compute capability).
# Source: NVIDIA's CUDA GPU compute capability table (Orin 8.7, Xavier 7.2, TX2 6.2, Nano/TX1 5.3).
# DLA cores are not guessed from the SoC (Orin Nano has none): TensorRT's Builder.num_DLA_cores says.
TEGRA_SOCS = {
    "nvidia,tegra234": ("Orin", "8.7"),
    "nvidia,tegra194": ("Xavier", "7.2"),
    "nvidia,tegra186": ("TX2", "6.2"),
    "nvidia,tegra210": ("Nano/TX1", "5.3"),
}


def _read(path, binary=False):
    try:
        with open(path, "rb" if binary else "r") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def python_info():
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def platform_info():
    info = {"system": platform.system(), "machine": platform.machine(), "release": platform.release()}
    jetson = jetson_info()
    if jetson:
        info["jetson"] = jetson
    return info


def jetson_info():
    """Jetson model and SoC from the device tree (its L4T release: ``l4t_info``)."""
    model = _read("/proc/device-tree/model", binary=True)
    compat = _read("/proc/device-tree/compatible", binary=True)
    if model is None and compat is None:
        return None
    info = {}
    if model:
        info["model"] = model.rstrip(b"\0").decode("utf-8", "replace")
    if compat:
        for entry in compat.split(b"\0"):
            soc = TEGRA_SOCS.get(entry.decode("ascii", "replace"))
            if soc:
                info["soc"] = entry.decode("ascii")
                info["family"], info["compute_capability"] = soc
                break
    # DLA engines appear as /dev/nvhost-nvdla<N> on L4T; TensorRT's Builder.num_DLA_cores is authoritative
    # (the python backend reports it), this count is what the trtexec backend can see without it.
    nodes = [n for n in _listdir("/dev") if re.fullmatch(r"nvhost-nvdla\d+", n)]
    info["dla_device_nodes"] = len(nodes)
    return info or None


# The files the facts below are read from; EDGEQ_PROBE_ROOT puts them under another root (a container
# with the board's /etc mounted elsewhere, tests with a fake board).
def _board_file(path):
    return os.path.join(os.environ.get("EDGEQ_PROBE_ROOT") or "/", path.lstrip("/"))


_L4T_LINE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)\.(\d+)")


def parse_nv_tegra_release(text):
    """``# R36 (release), REVISION: 2.0, GCID: ..., BOARD: generic, ...`` -> L4T ``36.2.0``, the line and
    its board; None when the text is not that line."""
    line = text.splitlines()[0].strip() if text and text.strip() else ""
    m = _L4T_LINE.search(line)
    if not m:
        return None
    info = {"release": "%s.%s.%s" % m.groups(), "line": line}
    board = re.search(r"BOARD:\s*([^,]+)", line)
    if board:
        info["board"] = board.group(1).strip()
    return info


def l4t_info():
    """The L4T (Jetson Linux) release of the board, from /etc/nv_tegra_release; None off Jetson."""
    text = _read(_board_file("/etc/nv_tegra_release"))
    return parse_nv_tegra_release(text) if text else None


# nvpmodel's files on L4T: the modes (``< POWER_MODEL ID=2 NAME=30W >``, ``< PM_CONFIG DEFAULT=2 >``) and the
# mode set now (``pmode:0002 fmode:quiet``), as nvpmodel itself and L4T's power-mode scripts read them.
NVPMODEL_CONFS = ("/etc/nvpmodel.conf", "/odm/etc/nvpmodel.conf", "/vendor/etc/nvpmodel.conf")
NVPMODEL_STATUS = "/var/lib/nvpmodel/status"


def parse_nvpmodel(conf, status):
    """The power mode set now ({"id", "name", "default"}) from nvpmodel's conf and status texts; None
    when the status names no mode. ``name`` None when the conf does not list that id."""
    m = re.search(r"pmode:\s*(\d+)", status or "")
    if not m:
        return None
    mode = int(m.group(1))
    names = {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)", conf or "")}
    default = re.search(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)", conf or "")
    return {"id": mode, "name": names.get(mode), "default": int(default.group(1)) if default else None}


def power_mode_info():
    """The Jetson power mode (nvpmodel) the board runs in; None off Jetson."""
    status = _read(_board_file(NVPMODEL_STATUS))
    if not status:
        return None
    conf = next((t for t in (_read(_board_file(p)) for p in NVPMODEL_CONFS) if t), None)
    return parse_nvpmodel(conf, status)


def _cuda_version(value):
    """CUDA's integer version (1000 * major + 10 * minor, as cudaRuntimeGetVersion returns it) -> "12.2"."""
    return "%d.%d" % (value // 1000, value % 1000 // 10) if value > 0 else None


def cuda_info():
    """The CUDA runtime (libcudart), the newest CUDA the driver supports, and the toolkit installed
    (/usr/local/cuda/version.json, or version.txt before CUDA 11). Queries only: no context is created."""
    info = {}
    try:
        import ctypes

        lib = load_libcudart()
        for key, fn in (("runtime", "cudaRuntimeGetVersion"), ("driver_supports", "cudaDriverGetVersion")):
            v = ctypes.c_int(0)
            if getattr(lib, fn)(ctypes.byref(v)) == 0 and _cuda_version(v.value):
                info[key] = _cuda_version(v.value)
    except (ImportError, AttributeError, OSError):
        pass
    home = _board_file("/usr/local/cuda")
    text = _read(os.path.join(home, "version.json"))
    if text:
        import contextlib
        import json

        with contextlib.suppress(ValueError, KeyError, TypeError):
            info["toolkit"] = json.loads(text)["cuda"]["version"]
    else:
        m = re.search(r"CUDA Version\s+([\d.]+)", _read(os.path.join(home, "version.txt")) or "")
        if m:
            info["toolkit"] = m.group(1)
    return info or None


def driver_version():
    """The NVIDIA kernel driver's version from /proc/driver/nvidia/version (Jetson and desktop alike;
    nvidia-smi's driver_version says the same where it exists)."""
    text = _read(_board_file("/proc/driver/nvidia/version")) or ""
    m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+([\d.]+)", text)
    return m.group(1) if m else None


def meminfo_available_mib():
    text = _read("/proc/meminfo")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return None


def nvidia_smi_gpus(timeout=15):
    """GPUs as nvidia-smi reports them; [] when it is missing or fails (never raises, never hangs)."""
    argv = [
        "nvidia-smi",
        "--query-gpu=name,compute_cap,memory.free,memory.total,driver_version",
        "--format=csv,noheader,nounits",
    ]
    try:
        code, lines = run_tool(argv, None, timeout)
    except Exception:
        return []
    if code != 0:
        return []
    gpus = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        gpus.append(
            {
                "name": parts[0],
                "compute_capability": parts[1],
                "memory_free_mib": _int_or_none(parts[2]),
                "memory_total_mib": _int_or_none(parts[3]),
                "driver": parts[4],
                "source": "nvidia-smi",
            }
        )
    return gpus


def _int_or_none(text):
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]" on Jetson's integrated GPU


def gpu_info():
    gpus = nvidia_smi_gpus()
    jetson = jetson_info()
    if jetson and jetson.get("compute_capability"):
        free = meminfo_available_mib()
        if gpus:
            for g in gpus:
                if g.get("compute_capability") in (None, "", "[N/A]"):
                    g["compute_capability"] = jetson["compute_capability"]
                if g.get("memory_free_mib") is None:
                    g["memory_free_mib"] = free
        else:
            gpus = [
                {
                    "name": jetson.get("model", jetson.get("family")),
                    "compute_capability": jetson["compute_capability"],
                    "memory_free_mib": free,
                    "memory_total_mib": None,
                    "driver": None,
                    "source": "device-tree",
                }
            ]
    return gpus


# The modules trt_cuda.open_cuda tries for device buffers, in order: cuda-python's runtime API
# (``cuda.cudart`` up to 12.x, ``cuda.bindings.runtime`` from 12.6 on), pycuda's driver API, and
# libcudart itself through ctypes.
CUDA_BINDINGS = {"cuda": ("cuda.cudart", "cuda.bindings.runtime"), "pycuda": ("pycuda.driver",)}


def cuda_bindings():
    """Which CUDA binding ``profile`` (backend python) can use: {"cuda", "pycuda", "libcudart": bool}."""
    found = {}
    for name, modules in CUDA_BINDINGS.items():
        found[name] = False
        for module in modules:
            try:
                __import__(module)  # imports only: no CUDA context is created
            except Exception:  # ImportError, or a broken driver raising at import time
                continue
            found[name] = True
            break
    try:
        load_libcudart()  # loads the library only: no CUDA call is made
        found["libcudart"] = True
    except ImportError:
        found["libcudart"] = False
    return found


def system_facts():
    return {
        "python": python_info(),
        "platform": platform_info(),
        "gpus": gpu_info(),
        "host_memory_available_mib": meminfo_available_mib(),
        "cuda_python": cuda_bindings(),
        "l4t": l4t_info(),
        "power_mode": power_mode_info(),
        "cuda": cuda_info(),
        "driver": driver_version(),
    }


def trtexec_facts(path, log, timeout=60):
    """Whether trtexec exists, and its TensorRT version from the banner every run prints.

    No banner means trtexec did not start (e.g. the loader cannot find libnvinfer: exit 127): ``error``
    then carries its exit code and last output line, the reason a user needs.
    """
    facts = {"path": path, "exists": os.path.isfile(path), "executable": os.access(path, os.X_OK)}
    if not facts["executable"]:
        return facts
    try:
        code, lines = run_tool([path, "--help"], None, timeout)
    except Exception as e:  # AgentError on launch failure
        facts["error"] = str(e)
        return facts
    from .trtexec_backend import version_from_banner

    facts["version"] = version_from_banner(lines)
    if facts["version"] is None:
        said = [ln.strip() for ln in lines if ln.strip()]
        status = "timed out after %d s" % timeout if code is None else "exit %d" % code
        facts["error"] = "printed no TensorRT banner (%s): %s" % (status, said[-1] if said else "no output")
    return facts
