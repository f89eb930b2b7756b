"""The optimization profile of a model with dynamic input dimensions: trtexec's ``--minShapes``/
``--optShapes``/``--maxShapes``, resolved once on the host before anything reaches a target.

TensorRT 8.6 builds nothing from a network with a symbolic or -1 input dimension and no profile ("Network
has dynamic or shape inputs, but no optimization profile has been defined"); many real exports are dynamic
(a batch of ``N``, a free height and width). The shapes come from the user's flags, else from the
calibration data (the shape quantize already ran the model at), else from the shapes ``edgeq quantize``
recorded in ``<name>.json`` beside the Q/DQ model it wrote, else from the model's own (its exporter's
metadata or documented default: ``edgeq.graph.shapes``), and otherwise the deploy stops in one line (exit 2)
before any SSH, naming a shape to give. ``--optShapes`` is the flag's, else the shape the calibration and
held-out data have most often within the profile (the first calibration sample's in a tie: ``most_common``);
where ``--minShapes``/``--maxShapes`` are not given they span the data: the elementwise min/max over every
calibration and held-out sample's shape (and ``--optShapes``), so each held-out sample runs on the engine at
its own shape (an OCR recogniser's text lines each have their own width); data of one shape, or no data,
gives a profile of that one shape, as trtexec does. The engine is timed at ``--optShapes`` (``--shapes`` to
the agent).
The syntax, and the rule for a profile with its messages, live in one place, ``edgeq.agent.shapes``
(``profile_shapes``), which the agent runs on the target too: this module only feeds it the model's inputs
and the calibration data's shape, and turns its errors into edgeq's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from edgeq.agent.shapes import BUILD_FLAGS
from edgeq.errors import EdgeqError

if TYPE_CHECKING:
    from edgeq.quant.quantize import QuantizeOptions

FLAGS = tuple(f"--{f}" for f in BUILD_FLAGS)  # trtexec's, as the agent names them


@dataclass(frozen=True)
class Shapes:
    """The three shape specs (trtexec syntax). As given: any of them, possibly none; ``resolved``: complete
    for every dynamic input of the model (all empty for a static model), ``source`` says where from."""

    min: str = ""
    opt: str = ""
    max: str = ""
    resolved: bool = False
    source: str = ""

    def __bool__(self) -> bool:
        return bool(self.min or self.opt or self.max)

    def build_args(self) -> list[str]:
        """The agent's build flags (trtexec's names); none for a static model."""
        return [f"{f}={t}" for f, t in zip(FLAGS, (self.min, self.opt, self.max)) if t]

    def run_args(self) -> list[str]:
        """The agent's profile flag: the engine runs at ``--optShapes``."""
        return [f"--shapes={self.opt}"] if self.opt else []

    def describe(self) -> str:
        if not self:
            return "static input shapes"
        same = self.min == self.opt == self.max
        shown = f"{self.opt}" if same else f"min {self.min}, opt {self.opt}, max {self.max}"
        return f"optimization profile {shown} ({self.source})"


def resolve_shapes(model: Path, given: Shapes, quantize: Optional[QuantizeOptions] = None) -> Shapes:
    """``given`` completed for ``model``'s dynamic inputs (see the module doc); ``given`` itself when it
    is resolved already. Raises ``EdgeqError`` (exit 2) on flags that do not fit the model, and on a
    dynamic input with no shape to use (the fix names one, in numbers)."""
    if given.resolved:
        return given
    from edgeq.agent.shapes import ShapeError, format_shapes, parse_shapes, profile_shapes
    from edgeq.graph.io import load_model
    from edgeq.graph.shapes import dynamic_inputs, input_shapes, shapes_hint

    onnx_model = load_model(model)
    recorded, summary = recorded_shapes(Path(model))
    filled: dict[str, tuple[int, ...]] = {}
    origin: dict[str, str] = {}

    def fill(names: list[str]) -> dict[str, tuple[int, ...]]:
        calib = _calibration_shapes(onnx_model, quantize, names)
        own = input_shapes(onnx_model)  # the exporter's (metadata, documented defaults)
        for name in names:
            if name in calib:
                filled[name], origin[name] = calib[name], "calibration data"
            elif name in recorded:
                filled[name], origin[name] = recorded[name], f"the data quantize calibrated on ({summary})"
            elif name in own.shapes:
                filled[name], origin[name] = own.shapes[name], f"the model's own size, {own.sources[name]}"
        return filled

    try:
        profile = profile_shapes(_inputs(onnx_model), given.min, given.opt, given.max, Path(model).name,
                                 fill_opt=fill, fill_hint="--calib data of that shape",
                                 one_shape=True)  # fmt: skip
    except ShapeError as e:
        opt = {n for n, _ in parse_shapes(given.opt)}
        missing = {n: d for n, d in dynamic_inputs(onnx_model) if n not in filled and n not in opt}
        hint = f"{shapes_hint(missing, '--optShapes')}, or --calib data" if missing else e.hint
        raise EdgeqError(str(e), hint) from None
    except ValueError as e:
        raise EdgeqError(str(e), "trtexec's syntax: name:1x3x224x224,other:1x10") from None
    if not profile:
        return Shapes(resolved=True, source="static")
    sources = {origin.get(name, "--optShapes") for name, *_ in profile}
    source = " and ".join(sorted(sources))
    bounded = {n for n, _ in parse_shapes(given.min)} & {n for n, _ in parse_shapes(given.max)}
    open_ = [name for name, *_ in profile if name not in bounded or name in filled]  # min, max or opt: data's
    shapes_seen, data = _data_shapes(onnx_model, quantize, open_)
    if not shapes_seen and recorded:
        shapes_seen = {n: seen for n, seen in recorded_samples(Path(model)).items() if n in open_}
        data = f"data quantize calibrated on ({summary})"
    spanned = spanning(profile, given, shapes_seen)
    widened = spanned != profile
    common = most_common(spanned, shapes_seen, set(filled))
    if common != spanned:
        spanned = common
        source = source.replace("calibration data", f"the {data}'s most common shape", 1)
    if spanned != profile:
        try:  # the one rule again, on the shapes the data filled in
            lo, opt, hi = (format_shapes([(n, s[i]) for n, *s in spanned]) for i in range(3))
            profile = profile_shapes(_inputs(onnx_model), lo, opt, hi, Path(model).name)
        except ShapeError as e:
            raise EdgeqError(str(e), e.hint) from None
    if widened:
        source += f"; min/max from the {data}"
    lo, opt, hi = (format_shapes([(name, shapes[i]) for name, *shapes in profile]) for i in range(3))
    return Shapes(lo, opt, hi, resolved=True, source=source)


def recorded_shapes(model: Path) -> tuple[dict[str, tuple[int, ...]], str]:
    """For a model ``edgeq quantize`` wrote (``<name>.onnx`` beside its summary ``<name>.json``): each
    dynamic input's first calibration shape, and the summary's file name; empty where there is none."""
    seen = recorded_samples(model)
    return {name: shapes[0] for name, shapes in seen.items() if shapes}, _summary_path(model).name


def recorded_samples(model: Path) -> dict[str, list[tuple[int, ...]]]:
    """Every calibration and held-out sample's shape of each dynamic input, as ``<name>.json`` records
    them (``QuantizeResult.input_shapes``: shape and count, first seen first); {} without a summary of this
    model (its ``output`` is another file, or it records none)."""
    import json

    path = _summary_path(model)
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(summary, dict) or Path(str(summary.get("output", ""))).name != model.name:
        return {}
    out: dict[str, list[tuple[int, ...]]] = {}
    for name, seen in (summary.get("input_shapes") or {}).items():
        try:
            out[name] = [tuple(int(d) for d in s["shape"]) for s in seen for _ in range(int(s["samples"]))]
        except (KeyError, TypeError, ValueError):
            return {}  # not a summary this edgeq wrote: ignored, as if absent
    return out


def _summary_path(model: Path) -> Path:
    stem = model.name[: -len(".onnx")] if model.name.endswith(".onnx") else model.name
    return model.with_name(f"{stem}.json")


Profile = list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def spanning(profile: Profile, given: Shapes, shapes: dict[str, list[tuple[int, ...]]]) -> Profile:
    """``profile`` with the min (max) of each input the user gave no ``--minShapes`` (``--maxShapes``) for
    widened to the elementwise min (max) of its ``--optShapes`` and the data's shapes of it (``shapes``:
    per input, ``_data_shapes``). Flags given always win."""
    from edgeq.agent.shapes import parse_shapes

    lo_given = dict(parse_shapes(given.min, "minShapes"))
    hi_given = dict(parse_shapes(given.max, "maxShapes"))
    out: Profile = []
    for name, lo, opt, hi in profile:
        seen = [s for s in shapes.get(name, []) if len(s) == len(opt)] + [opt]
        if name not in lo_given:
            lo = tuple(min(d) for d in zip(*seen))
        if name not in hi_given:
            hi = tuple(max(d) for d in zip(*seen))
        out.append((name, lo, opt, hi))
    return out


def most_common(profile: Profile, shapes: dict[str, list[tuple[int, ...]]], from_data: set[str]) -> Profile:
    """``profile`` with the ``--optShapes`` of each input in ``from_data`` (no flag gave it) the shape the
    data has most often within the profile (the first of a tie, calibration samples first): TensorRT
    chooses its kernels for opt, and the engine is timed there, so opt should be what the engine mostly
    runs (PP-OCRv4's recogniser: 18 of its 65 held-out lines and 12 of 32 calibration lines at width 320,
    its first calibration line at another)."""
    from collections import Counter

    out: Profile = []
    for name, lo, opt, hi in profile:
        inside = [s for s in shapes.get(name, []) if within(s, lo, hi)]
        if name in from_data and inside:
            counts = Counter(inside)
            opt = max(dict.fromkeys(inside), key=lambda s: counts[s])  # first seen wins a tie
        out.append((name, lo, opt, hi))
    return out


def within(shape: tuple[int, ...], lo: tuple[int, ...], hi: tuple[int, ...]) -> bool:
    """``shape`` lies in the profile ``lo``..``hi``: same rank, every dimension between the two."""
    return len(shape) == len(lo) == len(hi) and all(a <= d <= b for d, a, b in zip(shape, lo, hi))


def _inputs(model: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """The model's real inputs as ``profile_shapes`` reads them: a dimension's value, else the name the
    export gives it (``N``, ``H``: what the fix shows to fill in), else None."""
    from edgeq.quant.data.inputs import input_specs

    declared = {vi.name: vi.type.tensor_type for vi in model.graph.input}
    out = []
    for spec in input_specs(model):
        tt = declared[spec.name]
        dims = tt.shape.dim if tt.HasField("shape") else []
        out.append((spec.name, tuple(d.dim_value if d.dim_value > 0 else d.dim_param or None for d in dims)))
    return out


def _data_shapes(model: object, quantize: Optional[QuantizeOptions], names: list[str]
                 ) -> tuple[dict[str, list[tuple[int, ...]]], str]:  # fmt: skip
    """Every calibration and held-out (``--holdout DIR``) sample's shape of each named input, and what
    they came from ("calibration and held-out data"); empty without data. Array files are not read, only
    their headers; images are decoded and preprocessed (their shape is the preprocessing's)."""
    if not names or quantize is None or not quantize.has_data:
        return {}, "calibration data"
    from edgeq.quant.data.dataset import calibration_set

    sets = [calibration_set(model, quantize.calib, synthetic=quantize.synthetic,  # type: ignore[arg-type]
                            preprocess=quantize.preprocess)]  # fmt: skip
    if quantize.holdout_data is not None:
        sets.append(calibration_set(model, quantize.holdout_data, preprocess=quantize.preprocess))  # type: ignore[arg-type]
    out: dict[str, list[tuple[int, ...]]] = {name: [] for name in names}
    for data in sets:
        for shapes in data.shapes():  # array files: their headers alone
            for name in names:
                if name in shapes:
                    out[name].append(tuple(int(d) for d in shapes[name]))
    return out, "calibration and held-out data" if len(sets) > 1 else "calibration data"


def _calibration_shapes(model: object, quantize: Optional[QuantizeOptions], names: list[str]
                        ) -> dict[str, tuple[int, ...]]:  # fmt: skip
    """The shape of each named input in the first calibration sample (what quantize runs the model at);
    empty without calibration data or without names."""
    if not names or quantize is None or not quantize.has_data:
        return {}
    from edgeq.quant.data.dataset import calibration_set

    data = calibration_set(model, quantize.calib, synthetic=quantize.synthetic,  # type: ignore[arg-type]
                           preprocess=quantize.preprocess, limit=1)  # fmt: skip
    first = next(data.shapes(), {})
    return {name: tuple(int(d) for d in first[name]) for name in names if name in first}
