"""``calib demo``: the whole pipeline on the bundled fixtures, then the report's path."""

from __future__ import annotations

from pathlib import Path

import click


@click.command(
    name="demo",
    help="""Run the whole pipeline on the bundled fixtures and write a report.

\b
Ingests the ALCF Polaris nccl-tests logs and real GPU and CPU training traces, fits
the 'polaris' calibration, predicts ZeRO-1/2/3 scaling from 8 to 512 GPUs for the
seed-004 GPT models, a TP x DP / TP x PP sweep and a strategy search, validates on
published tables, and writes OUT/report/report.html.  Everything happens under OUT
(its own store in OUT/store); your calib store is not touched.

\b
Example:
  calib demo --out demo-out
""",
)
@click.option(
    "--out", "out_dir", type=click.Path(path_type=Path), default=Path("demo-out"), show_default=True,
    help="Directory for the demo's store and report.",
)  # fmt: skip
@click.option(
    "--fixtures",
    type=click.Path(path_type=Path),
    help="Fixtures directory (default: $CALIB_FIXTURES, else the installed package data, else the repository's).",
)
def demo(out_dir: Path, fixtures: Path | None):
    from calib.demo_pipeline import run_demo

    path = run_demo(out_dir, fixtures, echo=click.echo)
    click.echo(f"report: {path.resolve()}")
    click.echo(f"open it with: xdg-open {path}   (or any browser; it needs no network)")
