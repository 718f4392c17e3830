"""``calib validate``: the model against a measured table, with held-out errors."""

from __future__ import annotations

import click

from calib.commands.options import Choice, Fraction, Int, machine_options, require
from calib.core.errors import InputError

SCHEMA_HELP = """\b
Table (CSV): the validation schema, or one of the published tables (detected by header):
  sc21 (Megatron SC21 Table 1), korthikanti (Korthikanti 2022 Table 5),
  megatron2020 (Megatron-LM README 2020 TP/DP table), mosaicml (llm-foundry FSDP).
Schema columns (units in names): label, hardware, d_model, n_layers, n_heads, seq_len,
vocab, gpus, tp, pp, [dp], micro_batch, global_batch, [interleave], [zero 0-3],
[recompute none|selective|full], [seq_parallel], [dp_overlap], [flash_attention],
one of measured_iter_s | measured_tflops_per_gpu (+ tflops_convention
model|hardware|megatron_eq3) | measured_tokens_per_s_per_gpu, [group], [source].
Full description: docs/analytic.md.

\b
Machine: the table's hardware column (presets with stated default efficiencies), or
--system/--calibration/--hardware for every row.
"""


@click.command(
    epilog=SCHEMA_HELP,
    help="""Predict every row of a measured table and report per-row and summary errors.

\b
The compute-efficiency parameters the tables can identify (GEMM efficiency y_max and
the element-wise traffic factor; --fit) are fitted by least squares on a stated subset
and errors are reported on the other rows only:
  --calibrate-on ROWS   1-based rows, ranges (3-5), labels or group tags, e.g. 1,4,7,10 or full
  --holdout FRACTION    a seeded random fraction held out
  --loo                 leave-one-out: each row predicted by a fit to all the others (default)
  --fit none            the calibration as given, every row held out
Errors are predicted/measured - 1 of the measured quantity (s, TFLOP/s or tokens/s), in %;
the summary gives the median, mean and max absolute error over held-out rows.

\b
Example:
  calib validate fixtures/published/megatron_sc21_table1_weak_scaling.csv --calibrate-on 1,4,7,10
""",
)
@click.argument("table", required=False)
@click.option(
    "--runs",
    "runs_system",
    metavar="SYSTEM",
    help="Instead of a table: the fitted device model of SYSTEM against each of its traced runs.",
)
@click.option(
    "--measured", metavar="FILE", help="With --runs: measured step times / peak memory (measured_steps.json)."
)
@click.option("--format", "fmt", type=Choice(("auto", "canonical", "sc21", "korthikanti", "megatron2020", "mosaicml")),
              default="auto", show_default=True, help="Table format.")  # fmt: skip
@click.option(
    "--calibrate-on", help="Rows to fit on (numbers, ranges, labels or group tags, comma separated)."
)
@click.option(
    "--holdout", type=Fraction(), help="Fraction of rows to hold out at random (the rest are fitted)."
)
@click.option("--loo", is_flag=True, help="Leave-one-out cross-validation (the default split).")
@click.option("--seed", type=Int(0), default=0, show_default=True, help="Random seed of --holdout.")
@click.option("--fit", "fit_kind", type=Choice(("compute", "gemm", "ymax", "none")), default="compute", show_default=True,
              help="compute: GEMM y_max + element-wise traffic; gemm: y_max + x_half; ymax: y_max only; none: no fit.")  # fmt: skip
@machine_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the per-row results as CSV.")
@click.option("-o", "--out", metavar="FILE", help="Write the output to this file (atomically).")
def validate(
    table,
    runs_system,
    measured,
    fmt,
    calibrate_on,
    holdout,
    loo,
    seed,
    fit_kind,
    system,
    calibration,
    hardware,
    store,
    as_json,
    as_csv,
    out,
):
    from calib.analytic.validate import validate as run_validate
    from calib.analytic.vtable import read_table
    from calib.commands import output
    from calib.resolve import resolve_system

    if as_json and as_csv:
        raise InputError("--json", "give either --json or --csv")
    if runs_system:
        return _validate_runs(runs_system, measured, table, store, as_json, as_csv, out)
    df, name = read_table(require(table, "TABLE"), fmt)
    base = (
        resolve_system(system, calibration, hardware, store)[0]
        if (system or calibration or hardware)
        else None
    )
    res = run_validate(df, str(table), base, calibrate_on, holdout, loo, fit_kind, seed)
    info = {
        "table": str(table),
        "format": name,
        "rows": len(df),
        "split": res.split,
        "fit": res.params,
        "summary": res.summary,
    }
    if as_json:
        text = output.dumps({**info, "per_row": output.records(res.rows)})
    elif as_csv:
        text = res.rows.to_csv(index=False)
    else:
        text = output.validate_text(info, res.rows)
    text = output.emit(text, out)
    if text is not None:
        click.echo(text, nl=False)


def _validate_runs(system, measured, table, store, as_json, as_csv, out) -> None:
    from calib.commands import output, validate_runs
    from calib.resolve import resolve_system

    if table:
        raise InputError("--runs", "give either a TABLE or --runs SYSTEM")
    cal = resolve_system(system, None, None, store)[0].cal
    dm = cal.device_model
    if dm is None or not dm.runs:
        raise InputError(
            "--runs", f"the calibration of {system} has no device model (fit it from GPU traces with shapes)"
        )
    df = validate_runs.table(dm, validate_runs.measured_file(measured))
    s = validate_runs.summary(df)
    notes = [n for n in dm.notes if "memory" in n] + [
        "leave-one-run-out: every term refitted without the run, the run predicted by that fit; its interval "
        "uses the other runs' leave-one-out errors only"
    ]
    if df["measured_mem_gb"].notna().any() and not any(r.get("measured_mem_gb") for r in dm.runs):
        notes.append("the runs recorded no peak memory: the fit used the reference activation bytes "
                     "(status default), so memory errors on the reference runs themselves are in-sample")  # fmt: skip
    if as_json:
        text = output.dumps({"system": system, "summary": s, "runs": output.records(df), "notes": notes})
    elif as_csv:
        text = df.to_csv(index=False)
    else:
        text = validate_runs.text(system, df, s, notes)
    text = output.emit(text, out)
    if text is not None:
        click.echo(text, nl=False)
