"""``calib capture``: get calibration-ready traces out of your own training runs."""

from __future__ import annotations

import json
from pathlib import Path

import click

from calib.core.errors import InputError

_FRAMEWORKS = ("pytorch", "ddp", "fsdp", "fsdp2", "deepspeed", "megatron")
_MODEL_KEYS = ("d", "l", "a", "s", "V", "b")


@click.group("capture")
def capture() -> None:
    """Capture calibration-ready traces of your own training loop.

    \b
    With pynvml (package nvidia-ml-py) and a GPU, the capture also samples GPU power and
    clocks (NVML) into power_rank<R>.csv beside the trace: calib fit --power FILE.
    \b
    The capture itself is a Python context manager (calib.capture.capture) that you put
    around N steps of your loop; these commands print the recipe, check a captured
    directory, and gather traces written by Megatron-LM or other tools into one.
    \b
      calib capture recipe --framework deepspeed
      calib capture check traces/run1
      calib capture collect megatron-tb/ --out traces/run1 --system polaris --model d=5120,l=40,a=40,s=2048,V=51200,b=1
    """


@capture.command("recipe")
@click.option(
    "--framework",
    "framework",
    default="pytorch",
    show_default=True,
    help="pytorch (any torch loop: DDP, FSDP, FSDP2), torch-only (no calib on the cluster), "
    "deepspeed, or megatron.",
)
def recipe(framework: str) -> None:
    """Print the capture recipe for a framework (Python or shell you paste into your job)."""
    from calib.commands.capture_recipes import RECIPES

    if framework not in RECIPES:
        raise InputError("--framework", f"'{framework}' has no recipe (one of {', '.join(RECIPES)})")
    click.echo(RECIPES[framework], nl=False)


@capture.command("check")
@click.argument("run_dir")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(run_dir: str, as_json: bool) -> None:
    """Check that RUN_DIR (a directory of per-rank traces) is calibration-ready.

    \b
    Lists, per trace: rank, ProfilerStep numbers, operators, device kernels,
    communication events (and how many carry message sizes), whether shapes were
    recorded, and the system tag; then every problem found.  Exit code 0 when ready,
    2 when something calibration needs is missing or a file is unusable.
    """
    from calib.ingest.capture.check import check_run

    report = check_run(Path(run_dir))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(format_report(report))
    if not report.ready:
        n = sum(f.level in ("error", "missing") for f in report.findings)
        raise InputError(run_dir, f"not calibration-ready ({n} problem(s) listed above)")


def format_report(report) -> str:  # noqa: ANN001 - CheckReport, imported lazily
    cfg = report.config or {}
    lines = [
        f"{'rank':>4s}  {'file':34s} {'steps':>10s} {'ops':>7s} {'kernels':>8s} {'comm':>6s} "
        f"{'sized':>6s} {'shapes':>6s}  system"
    ]
    for t in report.traces:
        steps = f"{t.steps[0]}..{t.steps[-1]}" if len(t.steps) > 1 else (str(t.steps[0]) if t.steps else "-")
        rank = "?" if t.rank is None else str(t.rank)
        lines.append(
            f"{rank:>4s}  {t.path.name[:34]:34s} {steps:>10s} {t.n_ops:>7d} {t.n_kernels:>8d} "
            f"{t.n_comm:>6d} {t.comm_sized:>6d} {'yes' if t.shapes else 'NO':>6s}  {t.system or cfg.get('system') or '-'}"
        )
    model = cfg.get("model") or {}
    if cfg:
        shape = ", ".join(f"{k}={model[k]}" for k in _MODEL_KEYS if k in model) or "unknown"
        fw = cfg.get("framework") or {}
        lines.append(
            f"run_config: world size {cfg.get('world_size')}, framework {fw.get('name')} "
            f"(ZeRO {'-' if fw.get('zero_stage') is None else fw.get('zero_stage')}), model {shape}"
        )
    power = cfg.get("power") or {}
    if power:  # GPU power and clock samples (NVML) beside the traces: calib fit --power FILE
        lines.append(
            f"power: {power.get('samples')} NVML samples in {power.get('file')} ({power.get('device')})"
            if power.get("status") == "sampled"
            else f"power: {power.get('status')} ({power.get('note', '')})"
        )
    for f in report.findings:
        lines.append(f"{f.level.upper():8s} {f.where}: {f.message}")
    return "\n".join(lines)


@capture.command("collect")
@click.argument("sources", nargs=-1, required=True)
@click.option(
    "--out", "out", required=True, help="New directory to write rank<R>.pt.trace.json.gz + run_config.json."
)
@click.option("--system", default=None, help="System tag to record (e.g. polaris).")
@click.option("--name", default=None, help="Run name (default: the --out directory name).")
@click.option(
    "--model",
    default=None,
    help="Model shape d=,l=,a=,s=,V=,b= (hidden, layers, heads, sequence, vocab, micro-batch per rank); "
    "optionally kv=, ffn= and, for MoE, E=, topk=, effn= (expert width), shared= or shffn= (shared experts), "
    "dense= (dense layers) and, for multi-head latent attention, qr=, kvr=, rope=, nope=, vh=.",
)
@click.option("--framework", default=None, help=f"What trained the model: {', '.join(_FRAMEWORKS)}.")
@click.option(
    "--zero-stage", type=int, default=None, help="ZeRO stage 0-3 (FSDP FULL_SHARD ~ 3, SHARD_GRAD_OP ~ 2)."
)
@click.option("--tp", type=int, default=None, help="Tensor-parallel degree.")
@click.option("--pp", type=int, default=None, help="Pipeline-parallel degree.")
def collect(
    sources: tuple[str, ...],
    out: str,
    system: str | None,
    name: str | None,
    model: str | None,
    framework: str | None,
    zero_stage: int | None,
    tp: int | None,
    pp: int | None,
) -> None:
    """Gather the traces of one run (files or directories) into a calibration-ready directory.

    Each trace is copied (gzipped) to OUT/rank<R>.pt.trace.json.gz, R read from the
    trace's distributedInfo; run_config.json records the system tag, model shape and
    layout you give.  Use it for Megatron-LM (--use-pytorch-profiler) or
    tensorboard_trace_handler output.  Prints the check of the result.
    """
    from calib.core.store import check_name
    from calib.ingest.capture.collect import collect as do_collect
    from calib.ingest.capture.runconfig import OPTIONAL_SHAPE_KEYS, check_shape
    from calib.ingest.capture.units import parse_kv_ints

    if system is not None:
        check_name("system", system)
    if framework is not None and framework not in _FRAMEWORKS:
        raise InputError("--framework", f"'{framework}' is not one of {', '.join(_FRAMEWORKS)}")
    if zero_stage is not None and zero_stage not in (0, 1, 2, 3):
        raise InputError("--zero-stage", f"must be 0, 1, 2 or 3, got {zero_stage}")
    for opt, v in (("--tp", tp), ("--pp", pp)):
        if v is not None and v < 1:
            raise InputError(opt, f"must be >= 1, got {v}")
    shape = (
        parse_kv_ints(model, "--model", (*_MODEL_KEYS, "kv", "ffn", *OPTIONAL_SHAPE_KEYS)) if model else {}
    )
    check_shape(shape, "--model")
    parallel = {k: v for k, v in (("tp", tp), ("pp", pp)) if v is not None}
    report = do_collect(
        sources,
        Path(out),
        system=system,
        name=name,
        model=shape,
        framework=framework,
        zero_stage=zero_stage,
        parallel=parallel,
    )
    click.echo(format_report(report))
    click.echo(f"wrote {out}")
    if not report.ready:
        n = sum(f.level in ("error", "missing") for f in report.findings)
        raise InputError(out, f"collected, but not calibration-ready ({n} problem(s) listed above)")
