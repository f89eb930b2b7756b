"""Replaying an edgeq calibration cache on the target's TensorRT (implicit INT8 without data): the
cache header rewritten for the running version, and a calibrator that only hands TensorRT the cache.

Separate from ``trt_build`` because the header rules (and their tests) stand apart from building.
"""

import re

from .common import AgentError
from .trt_common import version_number

# Calibration cache header ``TRT-<version>-<algorithm>`` (edgeq/quant/cache.py writes it): the
# calibrator class must match the algorithm, or TensorRT ignores the cache and asks for batches.
_CACHE_HEADER = re.compile(r"^TRT-(\d+)-([A-Za-z0-9]+)$")
_CALIBRATORS = {
    "EntropyCalibration2": "IInt8EntropyCalibrator2",
    "EntropyCalibration": "IInt8EntropyCalibrator",
    "MinMaxCalibration": "IInt8MinMaxCalibrator",
}


def cache_for_tensorrt(data, version):
    """(calibrator class name, cache bytes) for replaying ``data`` on TensorRT ``version``.

    The scales in a cache do not depend on the TensorRT release, but its header names one
    (``TRT-8600-EntropyCalibration2``), and TensorRT skips a cache it finds incompatible (a TensorRT
    maintainer, NVIDIA/TensorRT#1378). edgeq writes 8.6.0 headers; JetPack 6 runs 8.6.2. So the
    version field is set to the running TensorRT, and the calibrator is the class the algorithm names.
    """
    text = data.decode("utf-8", "replace")
    first, sep, rest = text.partition("\n")
    m = _CACHE_HEADER.match(first.strip())
    if not m:
        raise AgentError(
            "input",
            "calibration cache header %r is not TRT-<version>-<algorithm>" % first.strip()[:60],
        )
    algorithm = m.group(2)
    if algorithm not in _CALIBRATORS:
        raise AgentError(
            "input",
            "calibration cache algorithm %r: expected one of %s"
            % (algorithm, ", ".join(sorted(_CALIBRATORS))),
        )
    # UNVERIFIED (8.6): that TensorRT compares the header's version field at all, and that 8.6.2 expects
    # "TRT-8602-..." (the NV_TENSORRT_VERSION number trtexec prints). Matching it is harmless either way.
    header = "TRT-%d-%s" % (version_number(version), algorithm)
    return _CALIBRATORS[algorithm], (header + sep + rest).encode("utf-8")


def cache_calibrator(trt, class_name, cache):
    """A calibrator that only replays a calibration cache (implicit INT8 without data).

    TensorRT reads the cache first (``read_calibration_cache``: bytes or None, pyInt8.cpp); when it
    accepts it, it never asks for batches. ``get_batch`` returning None (pyInt8.cpp: None -> false,
    "no more batches") makes a rejected cache fail the build loudly instead of calibrating on nothing.
    ``get_batch_size`` is 1: explicit-batch networks take the batch from the input shapes.
    """
    base = getattr(trt, class_name)

    class CacheCalibrator(base):
        def __init__(self):
            base.__init__(self)
            self.asked_for_batches = False

        def get_batch_size(self):
            return 1

        def get_batch(self, names):
            self.asked_for_batches = True
            return None

        def read_calibration_cache(self):
            return cache

        def write_calibration_cache(self, data):
            return None

    return CacheCalibrator()
