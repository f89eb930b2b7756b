"""``edgeq demo`` (``edgeq.orchestration.demo``): the pipeline on a model built in code, as far as this
machine allows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from edgeq.cli.app import app
from edgeq.cli.output import code_for, out, print_wrapped, progress_display
from edgeq.fs import output_dir

_STATUS = {"done": "[green]done[/]", "stopped": "[yellow]stopped[/]", "skipped": "[dim]skipped[/]",
           "failed": "[bold red]failed[/]"}


@app.command("demo", short_help="The pipeline on a ResNet-like model built in code: start here.")
def demo_cmd(
    workdir: Path = typer.Option(
        Path("edgeq-demo"), "--workdir", "-o", metavar="DIR", parser=output_dir,
        help="Where the demo writes its files."
    ),
    samples: int = typer.Option(16, "--samples", metavar="N", min=2, help="Synthetic calibration samples."),
) -> int:
    """Run the pipeline on a ResNet-like model built in code, as far as this machine allows.

    Builds the model and its PyTorch-eager and onnxruntime Q/DQ exports, lints them, cleans one and
    verifies it in onnxruntime, quantizes the FP32 model with TensorRT-aware and with onnxruntime-style
    placement, probes for TensorRT with the target agent, and reports on recorded TensorRT 8.6 engines.
    It says where it stops and why (no GPU/TensorRT here: no engine build).

    Everything goes into --workdir (default ./edgeq-demo/, created; files in it are replaced): the
    test models, the cleaned and quantized ONNX, the calibration caches and the target agent zipapp.

    Exit codes: 0 every step that can run here ran (stopping at the engine build for lack of
    TensorRT is not a failure); 1 a step failed; 2 usage error (e.g. --workdir is a file); 130
    Ctrl-C.
    """
    from edgeq.orchestration.demo import run_demo

    def show(step: Any) -> None:
        out.print(f"\n[bold]{escape(step.name)}[/]  {_STATUS.get(step.status, step.status)}")
        for line in step.summary:  # wrapped at words to the width, piped too: 80 columns read cleanly
            print_wrapped(f"  {escape(line)}", indent=4)
        for a in step.artifacts:
            out.print(f"  [dim]-> {escape(str(a))}[/]")

    with progress_display() as progress:
        result = run_demo(workdir, samples=samples, progress=progress, on_step=show)
    stop = result.stopped_at
    out.print()
    if stop is not None:
        print_wrapped(f"[yellow]The demo stopped at '{escape(stop.name)}':[/] {escape(stop.summary[0])}")
    out.print(f"Everything it wrote is in {escape(str(result.workdir))}/")
    return code_for(result)
