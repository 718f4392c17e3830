"""``calib validate``: the model against a measured table, with held-out errors."""

from __future__ import annotations

import click

from calib.commands.options import Choice, Fraction, Int, machine_options, require, terminal_progress
from calib.core.errors import InputError

SCHEMA_HELP = """\b
Table (CSV): the validation schema, or one of the published tables (detected by header):
  sc21 (Megatron SC21 Table 1), korthikanti (Korthikanti 2022 Table 5),
  megatron2020 (Megatron-LM README 2020 TP/DP table), mosaicml (llm-foundry FSDP).
Schema columns (units in names): label, hardware, d_model, n_layers, n_heads, seq_len,
vocab, gpus, tp, pp, [dp], micro_batch, global_batch, [interleave], [zero 0-3],
[recompute none|selective|full|op], [seq_parallel], [dp_overlap], [flash_attention],
one of measured_iter_s | measured_tflops_per_gpu (+ tflops_convention
model|hardware|megatron_eq3) | measured_tokens_per_s_per_gpu, [group], [source].
Optional shape/stack columns: [model] (a preset: fills the shape), [ffn], [kv_heads],
[mlp gelu|swiglu], [tied_embeddings], [n_experts, top_k, expert_ffn, shared_experts,
dense_layers, capacity_factor, router_imbalance (default 1.0)], [cp], [cp_kind ring|ulysses|allgather], [ep],
[precision bf16|fp8], [master_weights fp32|bf16], [schedule 1f1b|zb-h1|dualpipe],
[distributed_optimizer], [tp_comm_overlap].
Full description: docs/analytic.md.

\b
Machine: the table's hardware column (presets with stated default efficiencies), or
--system/--calibration/--hardware for every row.
"""


def _folds(it):
    """A bar over leave-one-out folds (one fit per row) on a terminal, from 20 folds."""
    return terminal_progress(it, "validate (leave-one-out)", "fold", minimum=20)


@click.command(
    epilog=SCHEMA_HELP,
    help="""Predict every row of a measured table and report per-row and summary errors.

\b
The efficiencies the tables can identify (GEMM efficiency y_max, capped at the device's
measured achievable matmul; the element-wise traffic factor, the attention core's
efficiency over the GEMMs' and the inter-node bus bandwidth the software reached, these
three kept only where the rows identify them; --fit) are fitted by least squares on a stated
subset and errors are reported on the other rows only:
  --calibrate-on ROWS   1-based rows, ranges (3-5), labels or group tags, e.g. 1,4,7,10 or full
  --calibrate-on every-third   rows 1, 4, 7, ... by position (chosen before any error is seen)
  --holdout FRACTION    a seeded random fraction held out
  --loo                 leave-one-out: each row predicted by a fit to all the others (default)
  --fit compute         the network as stated (no bandwidth scale fitted)
  --fit none            the calibration as given, every row held out
Errors are predicted/measured - 1 of the measured quantity (s, TFLOP/s or tokens/s), in %;
the summary gives the median, mean and max absolute error over held-out rows (and per
group tag, where they span several), how many measured (trained) configurations the model
says do not fit in memory and which term overflows, and a warning for every fitted
parameter that ends on its bound.

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
@click.option("--fit", "fit_kind", type=Choice(("compute", "network", "gemm", "ymax", "none")), default="network", show_default=True,
              help="network: GEMM y_max + element-wise traffic + attention ratio + the inter-node bus bandwidth over the machine's stated one (the last two where identified); compute: the same with the network as stated; gemm: y_max + x_half; ymax: y_max only; none: no fit.")  # fmt: skip
@machine_options
@click.option(
    "--override-hardware",
    is_flag=True,
    help="Model every row on --hardware/--system/--calibration even where the table's hardware column "
    "names another (recorded per row); without it a disagreement is refused.",
)
@click.option(
    "--save-calibration",
    metavar="NAME",
    help="Store the fitted efficiencies as calibration NAME (<store>/NAME/NAME.calib.json) for "
    "`calib predict/search --calibration NAME` (needs --calibrate-on or --holdout: one fit).",
)
@click.option(
    "--replace", is_flag=True, help="With --save-calibration: replace an existing calibration NAME."
)
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
    override_hardware,
    save_calibration,
    replace,
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
    from calib.core.bundled import table_or_published

    table = str(table_or_published(require(table, "TABLE")))
    df, name = read_table(table, fmt)
    base = (
        resolve_system(system, calibration, hardware, store)[0]
        if (system or calibration or hardware)
        else None
    )
    if base is not None and not override_hardware:
        _refuse_disagreement(df, base, hardware, system, calibration)
    if save_calibration:
        _check_save(save_calibration, store, replace, fit_kind, calibrate_on, holdout)
    res = run_validate(df, str(table), base, calibrate_on, holdout, loo, fit_kind, seed, progress=_folds)
    info = {
        "table": str(table),
        "format": name,
        "rows": len(df),
        "split": res.split,
        "fit": res.params,
        "summary": res.summary,
    }
    if save_calibration:
        info["saved_calibration"] = str(_save(res, save_calibration, store, replace, str(table)))
    if as_json:
        text = output.dumps({**info, "per_row": output.records(res.rows)})
    elif as_csv:
        text = res.rows.to_csv(index=False)
    else:
        text = output.validate_text(info, res.rows)
    text = output.emit(text, out)
    if text is not None:
        click.echo(text, nl=False)


def _refuse_disagreement(df, base, hardware, system, calibration) -> None:
    """One line naming both when the table's hardware column and the machine given disagree."""
    from calib.analytic.validate import hardware_conflicts

    conflicts = hardware_conflicts(df, base)
    if conflicts:
        opt = "--hardware" if hardware else "--system" if system else "--calibration"
        table_hw = ", ".join(f"'{h}' ({n} rows)" for h, n in conflicts.items())
        raise InputError(
            opt,
            f"the table's hardware column says {table_hw} but {opt} gives '{base.hw.name}'; "
            "give --override-hardware to model every row on it (recorded per row)",
        )


def _check_save(name, store, replace, fit_kind, calibrate_on, holdout) -> None:
    """Refuse before fitting: a bad or taken name, or a split that is not one fit."""
    from calib.core.store import calibration_path, check_name
    from calib.resolve import store_path

    check_name("save-calibration", name)
    if fit_kind == "none" or (calibrate_on is None and holdout is None):
        raise InputError(
            "--save-calibration",
            "needs one fit: give --calibrate-on ROWS or --holdout FRACTION (leave-one-out fits once per row; "
            "--fit none fits nothing)",
        )
    target = calibration_path(store_path(store), name)
    if target.exists() and not replace:
        raise InputError(
            "--save-calibration",
            f"a calibration '{name}' already exists at {target}; give --replace to replace it",
        )


def _save(res, name, store, replace, table):
    """Write the fit as calibration NAME into the store, under the store's writer lock."""
    from calib.analytic.vfit import fitted_calibration
    from calib.commands.options import on_wait
    from calib.core.store import calibration_path, locked
    from calib.resolve import store_path

    machines = res.systems or {}
    hws = sorted({s.hw.name for s in machines.values()})
    if len(hws) != 1:
        raise InputError(
            "--save-calibration",
            f"the table spans hardware {', '.join(hws)}: one calibration describes one machine; give --hardware "
            "(with --override-hardware) or a table of one hardware",
        )
    cal = fitted_calibration(next(iter(machines.values())), name, res.params, f"{table}, {res.split}")
    root = store_path(store)
    target = calibration_path(root, name)
    with locked(root, on_wait=on_wait):
        if target.exists() and not replace:
            raise InputError("--save-calibration", f"a calibration '{name}' already exists at {target}")
        try:
            cal.save(target)
        except OSError as exc:
            raise InputError(str(target), f"cannot write the calibration: {exc.strerror or exc}") from None
    return target


def _validate_runs(system, measured, table, store, as_json, as_csv, out) -> None:
    from calib.commands import output, validate_runs
    from calib.resolve import resolve_system

    if table:
        raise InputError("--runs", "give either a TABLE or --runs SYSTEM")
    try:
        machine = resolve_system(system, None, None, store)[0]
    except InputError as exc:  # the system was named by --runs, not --system
        if exc.where != "system":
            raise
        raise InputError("--runs", exc.problem) from None
    dm = machine.cal.device_model
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
    vdf = validate_runs.variant_table(machine, dm)
    if vdf.empty and (dm.moe is not None or dm.mla is not None or dm.fp8_cast_bytes_per_elem is not None):
        notes.append(
            "this calibration predates the FP8, MoE and MLA runs' table: run `calib fit` again to list them"
        )
    if df["measured_mem_gb"].notna().any() and not any(r.get("measured_mem_gb") for r in dm.runs):
        notes.append("the runs recorded no peak memory: the fit used the reference activation bytes "
                     "(status default), so memory errors on the reference runs themselves are in-sample")  # fmt: skip
    if as_json:
        text = output.dumps({"system": system, "summary": s, "runs": output.records(df),
                             "variant_runs": output.records(vdf), "notes": notes})  # fmt: skip
    elif as_csv:
        text = validate_runs.csv(df, vdf)
    else:
        text = validate_runs.text(system, df, s, notes) + validate_runs.variant_text(vdf)
    text = output.emit(text, out)
    if text is not None:
        click.echo(text, nl=False)
