"""Real torchvision exports kept as skeletons (``*.skel.onnx``: every node and name, the large weights
left out), refilled here so they run: the architectures the zoo does not build in code."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SKELETON_MIN_ELEMENTS = 4096  # initializers larger than this are left out of a skeleton


def write_skeleton(model: onnx.ModelProto, path: str | Path) -> None:
    """Write ``model`` as a skeleton: every node and name, each initializer over
    ``SKELETON_MIN_ELEMENTS`` replaced by an external-data reference to a file that is never written.
    A corpus model's graph then costs kilobytes in the fixtures; :func:`skeleton` refills it."""
    from edgeq.fs import atomic_write_bytes

    out = onnx.ModelProto()
    out.CopyFrom(model)
    offset = 0
    for t in out.graph.initializer:
        if int(np.prod(t.dims)) <= SKELETON_MIN_ELEMENTS or t.data_location == TensorProto.EXTERNAL:
            continue
        length = int(np.prod(t.dims)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        t.ClearField("raw_data")
        for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(f)  # type: ignore[arg-type]
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(length))):
            t.external_data.add(key=k, value=v)
        offset += length
    atomic_write_bytes(Path(path), out.SerializeToString())


def skeleton(path: str | Path, *, seed: int = 0, zeros: bool = False) -> onnx.ModelProto:
    """A real exporter's graph whose large weights were left out (``*.skel.onnx``, or gzipped
    ``*.skel.onnx.gz``), refilled in memory.

    The skeletons under ``tests/fixtures/trt86-h100-zoo/skeletons`` keep every node and tensor name of
    the torchvision export behind the H100 engines, and an external-data reference for each initializer
    over 4096 elements. Each such tensor is refilled with seeded data of its dims (He-normal for weights
    of rank 2 and up, small values for vectors), so the model runs in onnxruntime and lines up with the
    engines' layer names.

    ``zeros``: each such tensor all zeros instead, for work that reads the graph and not its values
    (mirroring an engine, placement, matching): drawing VGG-11's 133M random weights takes seconds.
    """
    if str(path).endswith(".gz"):
        import gzip

        model = onnx.load_from_string(gzip.decompress(Path(path).read_bytes()))
    else:
        model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(seed)
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        dims = tuple(int(d) for d in t.dims)
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        if zeros:
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = bytes(int(np.prod(dims)) * np.dtype(dtype).itemsize)
            continue
        if len(dims) >= 2:
            fan_in = int(np.prod(dims[1:]))
            values = rng.standard_normal(dims) * np.sqrt(2.0 / max(fan_in, 1))
        else:
            values = 0.01 * rng.standard_normal(dims)
        filled = numpy_helper.from_array(values.astype(dtype), t.name)
        t.CopyFrom(filled)
    return model
