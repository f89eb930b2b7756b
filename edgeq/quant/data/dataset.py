"""The calibration set: an index over the readers' samples, built and checked from a directory (or
synthetic data), iterated lazily, and split into calibration and held-out parts."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from edgeq.errors import QuantError
from edgeq.findings import ProgressFn, no_progress
from edgeq.graph.exporter import KINDS, Export
from edgeq.quant.data.arrays import ARRAY_SUFFIXES, ArrayFile
from edgeq.quant.data.images import IMAGE_SUFFIXES, ImageFile
from edgeq.quant.data.inputs import InputSpec, input_specs
from edgeq.quant.data.preprocess import load_preprocess

if TYPE_CHECKING:
    import numpy as np
    import onnx


class _Synthetic:
    """Seeded random samples; sample k is the same on every pass (the set is re-iterable)."""

    def __init__(self, specs: list[InputSpec], count: int, seed: int) -> None:
        self.specs, self.count, self.seed = specs, count, seed
        self._shapes: list[tuple[int, ...]] = []  # per spec: (batch, *fixed dims)
        for s in specs:
            dims = tuple(d for d in s.shape[1:] if d is not None)
            if len(dims) != len(s.shape[1:]):
                raise QuantError(
                    f"input '{s.name}' has dynamic dimensions {s.describe()}; synthetic data needs fixed "
                    "shapes",
                    hint="give real calibration data with --calib",
                )
            shape = (s.batch, *dims)
            from edgeq.graph.verify import oversized_input, shape_hint

            too_big = oversized_input(s.name, shape, s.dtype)
            if too_big:
                raise QuantError(too_big, hint=shape_hint(s.name))
            self._shapes.append(shape)
        self.path = Path("<synthetic>")

    def read(self, k: int, cache: dict[str, Any]) -> dict[str, np.ndarray]:
        import numpy as np

        rng = np.random.default_rng([self.seed, k])
        feed = {}
        for s, shape in zip(self.specs, self._shapes):
            if np.issubdtype(np.dtype(s.dtype), np.floating):
                feed[s.name] = rng.standard_normal(shape, dtype=np.float32).astype(s.dtype)
            elif s.dtype == "bool":
                feed[s.name] = rng.integers(0, 2, shape).astype(bool)
            else:
                feed[s.name] = rng.integers(0, 10, shape).astype(s.dtype)
        return feed


_Source = Union[ArrayFile, ImageFile, _Synthetic]


# ---------------------------------------------------------------------------------------------------
# The set
# ---------------------------------------------------------------------------------------------------


class CalibrationSet:
    """An ordered, re-iterable index of calibration samples; yields one feed dict per sample.

    Samples are read lazily (``.npy`` rows by plain reads, one ``.npz`` in memory at a time), checked
    for NaN/Inf when read, and cast to the input's dtype.
    """

    def __init__(self, specs: list[InputSpec], sources: list[_Source],
                 index: list[tuple[int, int]], notes: tuple[str, ...] = ()) -> None:
        self.specs = specs
        self._sources = sources
        self._index = index  # (source number, sample number within the source)
        self.notes = notes

    def __len__(self) -> int:
        return len(self._index)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        import numpy as np

        cache: dict[str, Any] = {}
        for src_no, k in self._index:
            src = self._sources[src_no]
            feed = src.read(k, cache)
            for name, x in feed.items():
                if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
                    bad = "NaN" if np.isnan(x).any() else "Inf"
                    where = f"{src.path}" + (f" (sample {k})" if src.count > 1 else "")
                    raise QuantError(f"{where}: input '{name}' contains {bad}",
                                     hint="remove or fix the sample")
            yield feed
        cache.clear()

    def shapes(self) -> Iterator[dict[str, tuple[int, ...]]]:
        """Each sample's input shapes, in order, as iterating would give them: from the array files'
        headers where the source has them (no data read), else by reading the sample (an image: its
        preprocessing decides). What a dynamic model's optimization profile is made from."""
        cache: dict[str, Any] = {}
        for src_no, k in self._index:
            src = self._sources[src_no]
            known = getattr(src, "sample_shapes", None)
            if known is not None:
                yield known(k)
            else:
                yield {n: tuple(x.shape) for n, x in src.read(k, cache).items()}
        cache.clear()

    def check_values(self, progress: ProgressFn = no_progress) -> None:
        """Read every sample once and fail on NaN/Inf before any model runs.

        Iteration checks too, but only when it reaches the bad sample, possibly after outputs such as a
        calibration cache were written; this costs one read of the data and no inference.
        """
        total = len(self)
        progress("checking calibration data", 0, total)
        for done, _ in enumerate(self, start=1):
            if done % 16 == 0 or done == total:
                progress("checking calibration data", done, total)

    def split(self, holdout: float) -> tuple[CalibrationSet, CalibrationSet]:
        """(calibration part, held-out part): a seeded, reproducible choice of ``holdout`` of the samples.

        Held-out samples are never used for statistics, so the accuracy check is not measured on the
        data the scales were fitted to. At least one sample stays on each side when there are two.
        """
        import numpy as np

        if not 0.0 <= holdout < 1.0:
            raise QuantError(f"holdout fraction must be in [0, 1), got {holdout}")
        n = len(self._index)
        k = min(n - 1, math.ceil(n * holdout)) if holdout > 0 and n >= 2 else 0
        chosen = set(np.random.default_rng(0).permutation(n)[:k].tolist())
        calib = [e for i, e in enumerate(self._index) if i not in chosen]
        held = [e for i, e in enumerate(self._index) if i in chosen]
        return (CalibrationSet(self.specs, self._sources, calib, self.notes),
                CalibrationSet(self.specs, self._sources, held, self.notes))

    def subset(self, order: Sequence[int]) -> CalibrationSet:
        """These samples in ``order`` (indices into this set): ``--calibrator auto`` runs the held-out
        samples the best candidate so far got least right first."""
        return CalibrationSet(self.specs, self._sources, [self._index[i] for i in order], self.notes)

    def __repr__(self) -> str:
        return f"CalibrationSet({len(self)} samples, inputs={[s.name for s in self.specs]})"


def _preset_for(root: Path, export: Export) -> str:
    """The preset for images when none was given: the one the model's metadata names unambiguously;
    otherwise a usage error naming the preset edgeq would suggest and why, or that it cannot tell."""
    from edgeq.quant.data.preprocess import preset_names

    if export.certain:
        return export.preset
    presets = ", ".join(preset_names())
    if export:
        raise QuantError(f"{root}: images need preprocessing; this looks like a {KINDS[export.kind].name} "
                         f"({export.why.split(': ', 1)[0]}), trained with the {export.preset} preset's",
                         hint=f"pass --preprocess {export.preset} (presets: {presets}; or a YAML file)")
    raise QuantError(f"{root}: images need preprocessing, and nothing in the model says which it was trained "
                     "with", hint=f"pass --preprocess NAME (presets: {presets}) or --preprocess spec.yaml "
                                  "('edgeq presets NAME' prints one to copy)")


def _sized(spec: InputSpec, shape: tuple[int, ...] | None) -> InputSpec:
    """``spec`` with the dimensions it leaves dynamic taken from ``shape`` (the exporter's size, e.g.
    ultralytics' imgsz): a letterbox needs a size; the batch stays open."""
    if shape is None or len(shape) != len(spec.shape):
        return spec
    dims = tuple(d if d is not None or i == 0 else shape[i] for i, d in enumerate(spec.shape))
    return InputSpec(spec.name, dims, spec.dtype)


def calibration_set(
    model: onnx.ModelProto,
    source: str | Path | None,
    *,
    synthetic: int | None = None,
    preprocess: str | Path | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> CalibrationSet:
    """Index calibration data for ``model`` and check it against the model's inputs.

    Raises ``QuantError`` (one line naming the file, expected vs found) on anything unusable.
    """
    specs = input_specs(model)
    if limit is not None and limit < 1:
        raise QuantError(f"--limit must be at least 1, got {limit}")
    if synthetic is not None:
        if source is not None:
            raise QuantError("give either a calibration directory or --synthetic, not both")
        if synthetic < 1:
            raise QuantError(f"--synthetic must be at least 1, got {synthetic}")
        src = _Synthetic(specs, synthetic if limit is None else min(synthetic, limit), seed)
        return CalibrationSet(specs, [src], [(0, k) for k in range(src.count)],
                              ("synthetic random data: scales are for demos, not for accuracy",))
    if source is None:
        raise QuantError("no calibration data", hint="pass --calib DIR (or --synthetic N for a demo)")
    root = Path(source)
    if not root.exists():
        raise QuantError(f"{root}: calibration data not found")
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))  # ._x.jpg, .DS_Store
    arrays = [p for p in files if p.suffix.lower() in ARRAY_SUFFIXES]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    notes: list[str] = []
    if arrays and images:
        raise QuantError(f"{root}: mixes arrays (.npy/.npz) and images; use one kind per directory")
    sources: list[_Source] = []
    if arrays:
        if preprocess is not None:
            notes.append("the preprocessing spec applies to images only; ignored for .npy/.npz data")
        sources = [ArrayFile(p, specs) for p in arrays]
    elif images:
        if len(specs) != 1:
            raise QuantError(f"images can feed a single-input model; this one has {len(specs)} inputs",
                             hint="save samples as .npz keyed by input name")
        from edgeq.graph.exporter import identify

        export = identify(model)
        if preprocess is None:
            preprocess = _preset_for(root, export)
            notes.append(f"preprocessing: the {preprocess} preset, from {export.why} (--preprocess to choose "
                         "another, 'edgeq presets' lists them)")
        pre = load_preprocess(preprocess)
        spec = specs[0]
        if pre.letterbox and pre.size is None:  # the letterbox's size: the model's, where it says it
            spec = _sized(spec, export.shapes.get(spec.name))
        pre.check_input(spec, Path(preprocess))
        sources = [ImageFile(p, pre, spec) for p in images]
    else:
        skipped = f" ({len(files)} files of other kinds)" if files else ""
        raise QuantError(f"{root}: no calibration data (.npy, .npz or images){skipped}")
    if any(isinstance(s, ArrayFile) and s.float64 for s in sources):
        notes.append("float64 calibration data cast to float32")
    index = [(i, k) for i, s in enumerate(sources) for k in range(s.count)]
    if limit is not None:
        index = index[:limit]
    return CalibrationSet(specs, sources, index, tuple(notes))
