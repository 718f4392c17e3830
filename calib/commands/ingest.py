"""``calib ingest``: traces or nccl-tests logs into a run directory."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
import pandas as pd

from calib.commands.options import on_wait, replace_option, run_exists, terminal_progress
from calib.core.errors import InputError
from calib.core.rundir import RunExists, write_run
from calib.core.schema import KIND_TRACE
from calib.core.store import check_name, check_new_run, default_store, save_run
from calib.ingest.budget import budget_from_option
from calib.ingest.capture.runconfig import OPTIONAL_SHAPE_KEYS, check_shape
from calib.ingest.executors import EXECUTORS, ExecutorSpec, parse_jobs
from calib.ingest.orchestrate import FRAMEWORKS, IngestOptions
from calib.ingest.orchestrate import ingest as run_ingest
from calib.ingest.rules import load_rules

_MODEL_KEYS = {"d": int, "l": int, "a": int, "s": int, "V": int, "b": int, "kv": int, "ffn": int, "name": str,
               **dict.fromkeys(OPTIONAL_SHAPE_KEYS, int)}  # fmt: skip


def _parse_model(text: str | None) -> dict:
    if not text:
        return {}
    out: dict = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in _MODEL_KEYS or not value:
            raise InputError(
                "--model", f"expected KEY=VALUE pairs with keys {', '.join(_MODEL_KEYS)}; got '{part}'"
            )
        try:
            out[key] = _MODEL_KEYS[key](value.strip())
        except ValueError:
            raise InputError("--model", f"'{key}' must be an integer, got '{value}'") from None
        if isinstance(out[key], int) and out[key] < (0 if key in OPTIONAL_SHAPE_KEYS else 1):
            what = "non-negative" if key in OPTIONAL_SHAPE_KEYS else "positive"
            raise InputError("--model", f"'{key}' must be {what}, got {out[key]}")
    check_shape({k: v for k, v in out.items() if k != "name"}, "--model")
    return out


def _progress(it):
    """A bar over the ranks on a terminal (options.terminal_progress)."""
    return terminal_progress(it, "ingest", "rank")


@click.command(name="ingest")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--system", help="System the run was recorded on (e.g. polaris); files it in the store under that name."
)
@click.option("--name", "run_name", help="Run name (default: derived from the first path).")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path),
    help="Write the run directory here instead of the store.",
)
@click.option(
    "--store",
    type=click.Path(path_type=Path),
    help="Store directory (default ./calib-store or $CALIB_STORE).",
)
@click.option(
    "--framework", type=click.Choice(FRAMEWORKS), help="State the framework when the trace cannot tell."
)
@click.option(
    "--zero-stage", type=int, help="State the ZeRO stage (0-3); ZeRO-1 and ZeRO-2 look alike in traces."
)
@click.option(
    "--model",
    "model_spec",
    help="Model shape, e.g. d=768,l=12,a=12,s=1024,V=50257,b=8; also kv, ffn and, for MoE, E, topk, effn "
    "(expert width), shared or shffn (shared experts), dense (leading dense layers) and, for multi-head latent "
    "attention, qr, kvr, rope, nope, vh (compression ranks, rotary and plain head part, value head).",
)
@click.option(
    "--rules",
    "rules_file",
    type=click.Path(path_type=Path),
    help="JSON/YAML file of extra classification rules.",
)
@replace_option
@click.option("--json", "as_json", is_flag=True, help="Print the run (metadata and tables) as JSON.")
@click.option(
    "--jobs",
    "-j",
    "jobs_text",
    default="1",
    show_default=True,
    help="Rank traces ingested in parallel: a number, or 'auto' for every core this process may use.",
)
@click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default="local",
    show_default=True,
    help="'local': processes on this machine; 'dask': a Dask cluster (pip install 'calib[dask]').",
)
@click.option(
    "--scheduler",
    help="Dask scheduler address (tcp://host:8786) for --executor dask; default: a LocalCluster of --jobs workers.",
)
@click.option(
    "--max-memory",
    "max_memory",
    help="Memory ingest may use (e.g. 16G, 40%); split between workers. Traces that would not fit "
    "their share are streamed in batches. Default: half the memory available (cgroup-aware).",
)
@click.option(
    "--skip-bad",
    is_flag=True,
    help="Leave out empty or cut-off nccl-tests logs of a directory (a failed job) and ingest the rest; "
    "each skipped file is recorded in the run's notes.",
)
def ingest_cmd(
    skip_bad,
    paths,
    system,
    run_name,
    out_dir,
    store,
    framework,
    zero_stage,
    model_spec,
    rules_file,
    replace,
    as_json,
    jobs_text,
    executor,
    scheduler,
    max_memory,
):
    """Turn Kineto traces or nccl-tests logs into a run (run.json + Parquet tables).

    PATH is a trace (.json or .json.gz), a directory of per-rank traces, or nccl-tests
    output logs (detected by content).  For each rank and iteration (ProfilerStep#N; the
    whole trace when there is none) it prints the buckets of Cheng et al. (POMACS 2024) in
    seconds and percent of the iteration: communication (total, and exposed = not
    overlapped by compute), kernel execution (memcpy/memset as a sub-bucket), intra-op
    dispatch, inter-op dispatch and other (host waits); then the kernel-class shares of
    kernel time and the collectives (bytes in nccl-tests' size convention, algbw and busbw
    in GB/s with nccl-tests' bus factors).

    A run name that is taken in the store (or an --out directory that holds a run) is
    refused unless --replace is given; then the old run is replaced atomically, once the
    new one is complete.  Concurrent ingests into one store are serialised by a lock.
    """
    if system:
        check_name("system", system)
    if run_name:
        check_name("name", run_name)
    options = IngestOptions(
        system=system,
        name=run_name,
        framework=framework,
        zero_stage=zero_stage,
        model=_parse_model(model_spec),
        rules=load_rules(rules_file),
        skip_bad=skip_bad,
    )
    spec = ExecutorSpec(
        kind=executor,
        jobs=parse_jobs(jobs_text),
        scheduler=scheduler,
        memory=budget_from_option(max_memory),
        memory_from_user=max_memory is not None,
    )
    store = store or default_store()
    if run_name and out_dir is None:
        _refuse_taken(lambda: check_new_run(store, system, run_name, replace=replace), "--name")
    try:
        meta, tables = run_ingest(paths, options, progress=_progress, executor=spec)
    except InputError as exc:  # the stage names the field; the command line names the flag
        raise InputError(exc.where, exc.problem.replace("skip_bad", "--skip-bad")) from None
    if out_dir is not None:
        target = _refuse_taken(lambda: write_run(out_dir, meta, tables, replace=replace), "--out")
    else:
        target = _refuse_taken(
            lambda: save_run(store, meta, tables, replace=replace, on_wait=on_wait), "--name"
        )
    if as_json:
        doc = {
            "run_dir": str(target),
            "meta": meta.to_json(),
            "tables": {k: json.loads(v.to_json(orient="records")) for k, v in tables.items()},
        }
        click.echo(json.dumps(doc, indent=1, default=str))
        return
    if meta.kind == KIND_TRACE:
        _print_trace_run(meta, tables)
    else:
        _print_samples(meta, tables)
    click.echo(f"\nrun written to {target}")


ingest = ingest_cmd  # the name calib.cli.COMMANDS resolves


def _refuse_taken(write, option: str):
    """Run ``write``; a taken run name becomes the one-line refusal naming ``option``."""
    try:
        return write()
    except RunExists as exc:
        raise run_exists(exc.target, option) from None


def _print_trace_run(meta, tables) -> None:
    fw = meta.framework
    fw_text = fw.name + (f", ZeRO-{fw.zero_stage}" if fw.zero_stage is not None else "")
    fw_text += f", {fw.sharding_strategy}" if fw.sharding_strategy else ""
    fw_text += " (stated)" if fw.stated else ""
    click.echo(
        f"run {meta.name}: {len(meta.ranks)} rank(s) of world size {meta.world_size}, backend {meta.backend}, "
        f"devices {', '.join(meta.devices) or '-'}, framework {fw_text}"
    )
    for note in meta.notes:
        click.echo(f"  note: {note}")
    b = tables["buckets"]
    views = summary_frames(tables)
    cols = ["comm_s", "comm_exposed_s", "kernel_s", "memcpy_s", "intra_op_s", "inter_op_s", "other_s"]
    show = pd.DataFrame({"rank": b["rank"], "iter": b["iteration"], "wall_s": b["wall_s"]})
    for c in cols:
        label = c.removesuffix("_s")
        show[f"{label}_s"] = b[c]
        show[f"{label}%"] = views["bucket_pct"][f"{c}%"]
    click.echo("\nTime buckets per rank and iteration (seconds; % of wall time):")
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.max_rows", 500):
        click.echo(show.to_string(index=False, float_format=_fmt))
        if "class_pct" in views:
            click.echo("\nKernel classes, % of kernel time:")
            click.echo(views["class_pct"].to_string(float_format=lambda v: f"{v:.1f}"))
        if "collective_summary" in views:
            click.echo("\nCollectives (bytes = nccl-tests size; -1 = unknown; bandwidths in GB/s):")
            click.echo(views["collective_summary"].to_string(index=False, float_format=_fmt))
        if "crossrank" in tables:
            _print_crossrank(meta, tables["crossrank"])


def _print_crossrank(meta, cr) -> None:
    """The straggler summary: who the others waited for, per iteration and overall."""
    from calib.ingest import crossrank

    cov = crossrank.coverage(cr)
    if cov["matches"] == 0:
        click.echo("\nCross-rank: no collective matched across ranks.")
        return
    how = "process group + sequence number" if cov["by_seq"] == cov["matches"] else "order"
    if 0 < cov["by_seq"] < cov["matches"]:
        how = "sequence number or order"
    unmatched = f"; {cov['unmatched_calls']} calls unmatched" if cov["unmatched_calls"] else ""
    click.echo(
        f"\nStragglers ({cov['matches']} collectives matched across up to {cov['max_ranks']} ranks "
        f"by {how}{unmatched}):"
    )
    click.echo("  transfer = the fastest rank's time (the last to arrive); wait = the rest, per rank")
    if len(meta.ranks) < (meta.world_size or 0):
        click.echo(
            f"  only {len(meta.ranks)} of {meta.world_size} ranks traced: transfer is an upper bound, wait a lower bound"
        )
    per_it = crossrank.stragglers(cr)
    per_rank = crossrank.rank_summary(cr).sort_values(["wait_s"], kind="stable")
    with pd.option_context("display.width", 200, "display.max_rows", 60):
        click.echo(per_it.to_string(index=False, float_format=_fmt))
        click.echo("  ranks the others waited for most (least waiting themselves):")
        click.echo(per_rank.head(5).to_string(index=False, float_format=_fmt))


def _print_samples(meta, tables) -> None:
    s = tables["samples"]
    click.echo(f"run {meta.name}: {len(s)} nccl-tests samples from {len(meta.sources)} file(s)")
    with pd.option_context("display.width", 200, "display.max_rows", 60):
        summary = s.groupby(["collective", "nnodes", "nranks", "setup"]).agg(
            sizes=("bytes", "nunique"), max_busbw_gbps=("busbw_oop_gbps", "max")
        )
        click.echo(summary.reset_index().to_string(index=False, float_format=_fmt))


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "nan"
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"


def summary_frames(tables: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Derived views for printing: bucket percentages, class shares, collective summary."""
    b = tables["buckets"]
    out: dict[str, pd.DataFrame] = {}
    if not b.empty:
        pct = b[["comm_s", "comm_exposed_s", "kernel_s", "memcpy_s", "intra_op_s", "inter_op_s", "other_s"]]
        out["bucket_pct"] = (100.0 * pct.div(b["wall_s"].replace(0, np.nan), axis=0)).add_suffix("%")
    k = tables["kernels"]
    if not k.empty:
        share = k.groupby(["rank", "kernel_class"], sort=False)["time_s"].sum().unstack(fill_value=0.0)
        total = share.sum(axis=1).replace(0, np.nan)
        out["class_pct"] = 100.0 * share.div(total, axis=0)
    c = tables["collectives"]
    if not c.empty:
        keys = ["collective", "pg_name", "dtype", "bytes", "group_size"]
        g = c.fillna({"pg_name": "-", "dtype": "-"}).groupby(keys, sort=True, dropna=False)
        out["collective_summary"] = g.agg(
            count=("dur_s", "size"),
            mean_s=("dur_s", "mean"),
            algbw_gbps=("algbw_gbps", "median"),
            busbw_gbps=("busbw_gbps", "median"),
        ).reset_index()
    return out
