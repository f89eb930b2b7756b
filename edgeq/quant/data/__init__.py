"""Calibration data: what the model is run on to collect activation statistics.

A :class:`CalibrationSet` is an index of samples, not the samples: iterating it reads one sample at a
time from disk, so a 10,000-image calibration set costs the memory of one image (a stacked ``.npz``
is the exception: it is loaded whole, one file at a time, as zip members cannot be read by rows).
Everything that can be checked without reading the data (names, shapes, dtypes) is checked when the
set is built, so a bad file fails before the model has run; NaN/Inf can only be seen when a sample
is read and fail then, naming the file (``CalibrationSet.check_values`` reads everything up front).

Sources (``calibration_set``):

- a directory of ``.npy``/``.npz`` files. Each array is either one sample (the model's input shape,
  with or without the batch dimension) or a stack of samples along dim 0. ``.npz`` files are keyed
  by input name (required for models with several inputs; a single-input model also accepts
  ``np.savez``'s default key ``arr_0``).
- a directory of images (JPEG, PNG, BMP, WebP, TIFF, GIF through Pillow; binary ``.ppm``/``.pgm``
  read natively) with a YAML preprocessing spec (see :class:`Preprocess` and
  ``pipelines/preprocess-imagenet.yaml``). Headers are opened when the set is built, so a file that
  is not an image fails up front; a truncated or corrupt one fails when read, naming the file.
- ``synthetic=N``: seeded random samples for demos; statistics from them are not meaningful for
  accuracy.

dtype policy: float64 data for a float32 input is cast to float32 (numpy's default dtype is float64,
and float32 holds calibration data to far better than int8 resolution); the cast is recorded in
``CalibrationSet.notes``. Any other mismatch (integers for a float input, float for an integer input,
float16 <-> float32) is refused: it usually means missing preprocessing, and guessing would calibrate
on the wrong value range.

Split by concern: ``inputs`` (the model's inputs), ``arrays`` (``.npy``/``.npz`` reading), ``images``
(decoding), ``preprocess`` (the YAML spec, resize/crop/normalise), ``dataset`` (``CalibrationSet``,
``calibration_set``, holdout). This package re-exports the public API.
"""

from __future__ import annotations

from edgeq.quant.data.dataset import CalibrationSet, calibration_set
from edgeq.quant.data.inputs import Feed, InputSpec, input_specs
from edgeq.quant.data.preprocess import Preprocess, load_preprocess

__all__ = ["CalibrationSet", "Feed", "InputSpec", "Preprocess", "calibration_set", "input_specs",
           "load_preprocess"]
