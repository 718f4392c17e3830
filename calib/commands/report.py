"""``calib report``: runs, a calibration and predictions as one HTML file, PNGs and Markdown."""

from __future__ import annotations

from pathlib import Path

import click

from calib.core.errors import InputError


@click.command(
    name="report",
    help="""Write a report: one self-contained HTML file, its figures as PNG, their numbers as
CSV and a Markdown summary.

\b
RUN is a run directory (calib ingest --out) or a run name in the store.  The report shows:
  runs         buckets per rank and iteration, kernel classes, compute dissection,
               HTA's idle-time and launch statistics beside them (GPU traces);
  calibration  busbw against message size (measured + fitted), eff g->n against GPUs,
               every parameter with its uncertainty and status (--system / --calibration);
  predictions  ZeRO-1/2/3 scaling with compute/communication split, memory per GPU
               against HBM, TP x DP and TP x PP communication maps, the top strategies
               of a search, predicted vs measured on published tables (--predict).

\b
--predict SPEC: a YAML/JSON file (keys hardware, scaling, maps, search, validate; see
docs/reports.md), 'default' or 'none'.  With a calibration and no --predict, 'default':
seed-004 GPT models 125M-18.4B, ZeRO-1/2/3 on 8-512 GPUs, maps and search for gpt-13b
on 512 GPUs, and the published validation tables.

\b
Examples:
  calib report --system polaris --out report/
  calib report calib-store/cpu-gloo/runs/ddp-d64-ws2 --out run-report/
  calib report --system polaris --predict my-spec.yaml --out report/
""",
)
@click.argument("runs", nargs=-1)
@click.option("--system", help="System whose calibration (and, without RUN, stored traces) to report.")
@click.option(
    "--calibration", type=click.Path(path_type=Path), help="A calibration JSON file instead of --system's."
)
@click.option(
    "--predict", "predict_spec", metavar="SPEC", help="Prediction spec: YAML/JSON file, 'default' or 'none'."
)
@click.option(
    "--store",
    type=click.Path(path_type=Path),
    help="Store directory (default ./calib-store or $CALIB_STORE).",
)
@click.option("--title", help="Report title.")
@click.option(
    "--seeds",
    "seeds",
    is_flag=True,
    help="Add the seed-experiment panels: energy against time under DVFS, placement on NVLink domains, "
    "offload memory against HBM (docs/seeds.md).",
)
@click.option(
    "--offload-results",
    metavar="FILE",
    type=click.Path(path_type=Path),
    help="With --seeds: the JSON of benchmarks/seed001_offload.py --json for the offload panel.",
)
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Output directory (required).")
def report(runs, system, calibration, predict_spec, store, title, seeds, offload_results, out_dir):
    from calib.report_data import predictions
    from calib.reports.build import make_report, resolve_spec, write_report
    from calib.reports.progress import Steps
    from calib.resolve import gather

    if out_dir is None:
        raise InputError("--out", "is required (the directory to write the report into)")
    if system and calibration:
        raise InputError("--calibration", "give either --system or --calibration, not both")
    if offload_results is not None and not seeds:  # was silently ignored
        raise InputError("--offload-results", "is drawn only with --seeds")
    inputs = gather(tuple(runs), store, system, calibration)
    spec = resolve_spec(predict_spec, inputs)
    if not inputs.runs and inputs.calibration is None and (spec is None or spec.empty) and not seeds:
        raise InputError(
            "calib report",
            "nothing to report: give RUN directories, --system NAME (after `calib fit`) or --predict SPEC",
        )
    with Steps(8, "report") as steps:
        pred = predictions(inputs, spec, steps.step) if spec is not None and not spec.empty else None
        extra = ()
        if seeds:
            from calib.commands.energy_cli import seeds_section

            extra = (seeds_section(offload_results),)
        path = write_report(make_report(inputs, spec, pred, title, steps.step, extra), out_dir)
    for note in inputs.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"report written to {path}")
