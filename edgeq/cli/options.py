"""The options more than one command takes, each declared once (as Polygraphy declares argument groups),
and the library options objects built from them.

A command lists the ones it takes by these names (``calib: Calib = None``); the flag, its type and its
help live here only, and ``--help`` shows each group in its own panel. Options one command alone takes
are declared in that command.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, get_args

import typer

from edgeq.fs import output_dir, output_file
from edgeq.pipeline.shapes import Shapes

if TYPE_CHECKING:
    from edgeq.pipeline.stages import ProfileSettings
    from edgeq.quant.quantize import QuantizeOptions

QUANTIZE = "Quantization"
TARGET = "Target"
GATE = TARGET  # the gate shares the target's panel: every command's --help stays one screen
BUILD = "Build and profile"


class Calibrator(str, Enum):
    auto = "auto"
    entropy = "entropy"
    max = "max"
    percentile = "percentile"
    mse = "mse"


class Weights(str, Enum):
    auto = "auto"
    nearest = "nearest"
    adaround = "adaround"


class Placement(str, Enum):
    trt = "trt"
    all = "all"
    implicit = "implicit"
    auto = "auto"  # decided on the target, cached (deploy's default; edgeq.orchestration.auto)


# -- quantization: what quantize, deploy, compare, tune, fleet and release calibrate on, and how -----------
Calib = Annotated[Optional[Path], typer.Option(
    "--calib", metavar="PATH", rich_help_panel=QUANTIZE,
    help="Calibration data: .npy/.npz or images, a directory or one file.")]
Synthetic = Annotated[Optional[int], typer.Option(
    "--synthetic", metavar="N", rich_help_panel=QUANTIZE, help="N random samples instead (demos only).")]
Preprocess = Annotated[Optional[Path], typer.Option(
    "--preprocess", metavar="NAME", rich_help_panel=QUANTIZE,
    help="Images: imagenet, yolo, ppocr-det/-rec/-cls, or a file.")]
CalibratorOpt = Annotated[Calibrator, typer.Option(
    "--calibrator", metavar="NAME", case_sensitive=False, rich_help_panel=QUANTIZE,
    help="auto, entropy, max, percentile or mse.")]
WeightsOpt = Annotated[Weights, typer.Option(
    "--weights", metavar="MODE", case_sensitive=False, rich_help_panel=QUANTIZE,
    help="Weight rounding: auto, nearest, adaround.")]
Percentile = Annotated[float, typer.Option(
    "--percentile", metavar="P", rich_help_panel=QUANTIZE, help="For --calibrator percentile.")]
Holdout = Annotated[Optional[str], typer.Option(
    "--holdout", metavar="DIR|F", rich_help_panel=QUANTIZE,
    help="Held-out data (as --calib), or a fraction \\[default: --calib].")]
MetricOpt = Annotated[str, typer.Option(
    "--metric", metavar="NAME", rich_help_panel=QUANTIZE,
    help="auto, classification, detection, mask, sequence, cosine, mod:fn.")]
MinCosine = Annotated[Optional[float], typer.Option(
    "--min-cosine", metavar="C", rich_help_panel=QUANTIZE,
    help="Accuracy bound: FP32 vs Q/DQ cosine on held-out data.")]
MinMetric = Annotated[Optional[float], typer.Option(
    "--min-metric", metavar="X", rich_help_panel=QUANTIZE,
    help="Accuracy bound on the task metric (1.0 = as FP32).")]
PlacementOpt = Annotated[Placement, typer.Option(
    "--placement", metavar="MODE", case_sensitive=False, rich_help_panel=QUANTIZE,
    help="trt (rules), all, implicit, auto (target).")]
Overrides = Annotated[Optional[Path], typer.Option(
    "--overrides", metavar="YAML", rich_help_panel=QUANTIZE, help="Nodes to force or exclude.")]
EngineRun = Annotated[Optional[Path], typer.Option(
    "--engine", metavar="PATH", rich_help_panel=QUANTIZE,
    help="An earlier deploy's run dir or layer JSON: what float regions cost.")]
MaxLoss = Annotated[Optional[float], typer.Option(
    "--max-loss", metavar="X", rich_help_panel=QUANTIZE,
    help="Keep regions float until 1 - metric <= X.")]

Budget = Annotated[Optional[str], typer.Option(
    "--budget", metavar="TIME", help="Time for the search (20m, 90s, 1h30m).")]

# -- the target ------------------------------------------------------------------------------------------
TargetName = Annotated[Optional[str], typer.Option(
    "--target", "-t", metavar="NAME", rich_help_panel=TARGET, help="targets/NAME.yaml, or a target file.")]
AcceptNewHostKey = Annotated[bool, typer.Option(
    "--accept-new-host-key", rich_help_panel=TARGET, help="Trust and record an unknown host key.")]
RunsDir = Annotated[Path, typer.Option(
    "--runs-dir", metavar="DIR", parser=output_dir, rich_help_panel=TARGET,
    help="Where run directories are created.")]
Fleet = Annotated[Optional[Path], typer.Option(
    "--fleet", "-f", metavar="FILE", rich_help_panel=TARGET, help="A fleet YAML or an Ansible inventory.")]
Workers = Annotated[Optional[int], typer.Option(
    "--workers", metavar="N", min=1, help="Targets at once \\[default: the fleet file's].")]
Limit = Annotated[Optional[str], typer.Option(
    "--limit", "-l", metavar="PATTERN", rich_help_panel=TARGET,
    help="Ansible pattern: name, group, g*, a:!b, a:&b, @file.")]
MaxFail = Annotated[Optional[int], typer.Option(
    "--max-fail", metavar="N", min=1, rich_help_panel=TARGET,
    help="Start no target after N failures.")]
Fresh = Annotated[bool, typer.Option(
    "--fresh", rich_help_panel=TARGET,
    help="Run all targets, reusing none that passed.")]


class Engine(str, Enum):
    native = "native"  # edgeq's own workers over paramiko
    ansible = "ansible"  # each board a task of an Ansible play (edgeq.ansible; pip install 'edgeq[ansible]')


EngineOpt = Annotated[Engine, typer.Option(
    "--engine", metavar="NAME", case_sensitive=False, rich_help_panel=TARGET, show_default=False,
    help="native (default), or ansible (Ansible tasks).")]

# -- the gate ----------------------------------------------------------------------------------------------
Gate = Annotated[Optional[str], typer.Option(
    "--gate", metavar="NAME", rich_help_panel=GATE,
    help="int8, fusion, none or relative.")]

# -- building and timing on a target ------------------------------------------------------------------------
Fp16 = Annotated[Optional[bool], typer.Option(
    "--fp16/--no-fp16", rich_help_panel=BUILD, help="Allow FP16 fallback \\[default: the target's].")]
Iterations = Annotated[int, typer.Option(
    "--iterations", metavar="N", min=1, rich_help_panel=BUILD, help="Profile at least N runs.")]
Duration = Annotated[float, typer.Option(
    "--duration", metavar="S", min=0, rich_help_panel=BUILD, help="Profile at least S seconds.")]
# trtexec's names and syntax; a model with dynamic inputs, else from the calibration and held-out data
# (pipeline.shapes: opt the data's most common shape, min/max spanning every sample's)
MinShapes = Annotated[str, typer.Option(
    "--minShapes", metavar="SPEC", rich_help_panel=BUILD,
    help="Dynamic inputs: min, as x:1x3x32x32.")]  # one line in every command's help (opt's says the default)
OptShapes = Annotated[str, typer.Option(
    "--optShapes", metavar="SPEC", rich_help_panel=BUILD,
    help="Dynamic inputs: opt \\[default: the data's].")]
MaxShapes = Annotated[str, typer.Option(
    "--maxShapes", metavar="SPEC", rich_help_panel=BUILD,
    help="Dynamic inputs: max \\[default: the data's].")]
BuildOncePerKind = Annotated[bool, typer.Option(
    "--build-once-per-kind", rich_help_panel=BUILD,
    help="One build a GPU kind.")]

# the model's own dynamic inputs where no data decides them (clean's verification, lint): trtexec's --shapes
InputShapesOpt = Annotated[str, typer.Option(
    "--shapes", metavar="SPEC",
    help="Dynamic inputs, as images:1x3x320x320 \\[default: the model's metadata].")]

# -- output ------------------------------------------------------------------------------------------------
Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
Html = Annotated[Optional[Path], typer.Option(
    "--html", metavar="FILE", parser=output_file, help="Also write a self-contained HTML page here.")]
Onnx = Annotated[Optional[Path], typer.Option(
    "--onnx", metavar="MODEL", help="The model the engines came from: their layers mapped to its nodes.")]


def in_panel(option: Any, panel: str) -> Any:
    """The ``typer.Option`` of an ``Annotated`` alias above, listed under another help panel: a command
    whose help would run past one screen folds a small panel into a bigger one (each panel costs two
    lines). Use as ``Annotated[int, in_panel(Iterations, TARGET)]``."""
    import copy

    moved = copy.copy(get_args(option)[1])
    moved.rich_help_panel = panel
    return moved


def quantize_options(
    calib: Optional[Path] = None,
    *,
    synthetic: Optional[int] = None,
    preprocess: Optional[Path] = None,
    calibrator: Calibrator = Calibrator.auto,
    percentile: float = 99.99,
    placement: Placement = Placement.trt,
    overrides: Optional[Path] = None,
    holdout: str | float | None = None,
    metric: str = "auto",
    min_cosine: Optional[float] = None,
    min_metric: Optional[float] = None,
    cache: Optional[Path] = None,
    from_engine: Optional[Path] = None,
    max_loss: Optional[float] = None,
    weights: Weights = Weights.auto,
) -> QuantizeOptions:
    """The one options object of every command that quantizes (the groups above, by value). ``auto`` is
    decided on a target (deploy resolves it before this); anywhere else it is a usage error."""
    from edgeq.quant.quantize import QuantizeOptions, holdout_option

    if placement == Placement.auto:
        raise typer.BadParameter("--placement auto is edgeq deploy's and fleet validate's (a target decides, "
                                 "once, cached); give trt, all or implicit here", param_hint="--placement")
    fraction, held = holdout_option(holdout)
    return QuantizeOptions(
        calib=calib, synthetic=synthetic, preprocess=preprocess, calibrator=Calibrator(calibrator).value,
        percentile=percentile, placement=Placement(placement).value, overrides=overrides, holdout=fraction,
        holdout_data=held, metric=metric, min_cosine=min_cosine, min_metric=min_metric, cache_path=cache,
        from_engine=from_engine, max_loss=max_loss, weights=Weights(weights).value,
    )  # fmt: skip


def profile_settings(fp16: Optional[bool] = None, iterations: int = 10, duration: float = 3.0,
                     shapes: Optional[Shapes] = None) -> ProfileSettings:  # fmt: skip
    from edgeq.pipeline.stages import ProfileSettings

    return ProfileSettings(fp16=fp16, iterations=iterations, duration=duration, shapes=shapes or Shapes())


def shapes_given(min_shapes: str = "", opt_shapes: str = "", max_shapes: str = "") -> Shapes:
    """--minShapes/--optShapes/--maxShapes as given (resolved against the model before any SSH)."""
    return Shapes(min_shapes, opt_shapes, max_shapes)
