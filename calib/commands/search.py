"""``calib search``: every valid parallel strategy for a model on N GPUs, ranked."""

from __future__ import annotations

import click

from calib.commands.options import (
    MACHINE_HELP,
    Choice,
    Int,
    machine_options,
    model_options,
    require,
    resolve_model,
)
from calib.core.errors import InputError


def parse_gpu_spec(text: str) -> list[int]:
    """'4096', '512,1024,2048' or a range 'START-STOP:STEP' (inclusive)."""
    out: list[int] = []
    try:
        for part in filter(None, text.replace(" ", "").split(",")):
            if "-" in part:
                rng, _, step = part.partition(":")
                lo, _, hi = rng.partition("-")
                out += list(range(int(lo), int(hi) + 1, int(step or 1)))
            else:
                out.append(int(part))
    except ValueError:
        raise InputError(
            "--gpus", f"expected N, a list N1,N2 or a range START-STOP:STEP, got '{text}'"
        ) from None
    if not out or min(out) < 1:
        raise InputError("--gpus", f"GPU counts must be positive, got '{text}'")
    if len(out) > 100_000:
        raise InputError("--gpus", f"{len(out)} GPU counts is too many (at most 100000)")
    return out


def parse_zero(text: str) -> tuple[int, ...]:
    try:
        stages = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise InputError("--zero", f"expected ZeRO stages like 0,1,3, got '{text}'") from None
    if not stages or not set(stages) <= {0, 1, 2, 3}:
        raise InputError("--zero", f"ZeRO stages must be among 0,1,2,3, got '{text}'")
    return stages


@click.command(
    epilog=MACHINE_HELP,
    help="""Enumerate every valid strategy for a model on N GPUs and rank them by iteration time.

\b
The space: TP (divides heads and N), PP (divides layers and N/TP), DP = N/(TP x PP)
(divides the global batch), micro-batch (divides the batch per DP rank), interleaving
(divides layers per stage; micro-batches divisible by PP), ZeRO stage, recompute
(none/selective/full), sequence parallelism (TP > 1), DP overlap.  Strategies that do
not fit in device memory are counted but not ranked.  Evaluation is vectorised with
numpy (no Python loop per strategy); the header reports strategies/s.

\b
Output per strategy: iteration time (s), tokens/s, model TFLOP/s per GPU, MFU, compute,
exposed communication, bubble (s) and memory per GPU (GB).

\b
Examples:
  calib search --model gpt3-175b --gpus 4096 --hardware selene --top 10
  calib search --model gpt3-175b --gpus 8-4096:8 --hardware dgx-h100   # system-size sweep
""",
)
@machine_options
@model_options
@click.option("--gpus", help="GPU count N, a list (512,1024) or a range START-STOP:STEP (required).")
@click.option("--global-batch", type=Int(1), help="Sequences per iteration (default: the model preset's).")
@click.option(
    "--top",
    type=Int(1, 10_000),
    default=10,
    show_default=True,
    help="How many strategies to list.",
)
@click.option("--zero", "zero_stages", default="0,1,2,3", show_default=True, help="ZeRO stages to consider.")
@click.option("--max-tp", type=Int(1), help="Largest tensor-parallel size to consider.")
@click.option("--no-interleave", is_flag=True, help="Do not consider interleaved pipeline schedules.")
@click.option(
    "--flash-attention", is_flag=True, help="Fused attention for every strategy (no s x s activations)."
)
@click.option(
    "--objective",
    type=Choice(("time", "energy", "cost")),
    default="time",
    show_default=True,
    help="Rank by iteration time, energy per token (datasheet or fitted power, docs/energy.md) or cost "
    "(GPU-seconds per token, i.e. GPU-hours x price for a fixed token budget).",
)
@click.option(
    "--dtype",
    type=Choice(("bf16", "fp16", "fp8", "tf32", "fp32", "int8")),
    default="bf16",
    show_default=True,
    help="Matmul data type for the energy per FLOP (with --objective energy).",
)
@click.option("--power", "power_file", metavar="FILE", help="Fitted power JSON (calib fit --power).")
@click.option(
    "--nvlink-domain",
    type=Int(1),
    help="Placement axis: re-time the fastest strategies under every placement of their TP/DP/PP groups on "
    "NVLink domains of this many GPUs (4, 8, 72 ...) and rank by the placed time (seed 002).",
)
@click.option(
    "--offload-gbps",
    type=float,
    help="Offload axis (seeds 000/001): host memory at this bandwidth per GPU and direction; the search adds "
    "weight, activation and optimizer offload knobs and ranks by time with the exposed offload traffic.",
)
@click.option(
    "--offload-gb", type=float, default=1024.0, show_default=True, help="Offload capacity per GPU (GB)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the ranked strategies as CSV.")
@click.option("-o", "--out", metavar="FILE", help="Write the output to this file (atomically).")
def search(system, calibration, hardware, store, model_name, d_model, n_layers, n_heads, seq_len, vocab, gpus,
           global_batch, top, zero_stages, max_tp, no_interleave, flash_attention, objective, dtype, power_file,
           nvlink_domain, offload_gbps, offload_gb, as_json, as_csv, out, **shape):  # fmt: skip
    from calib.analytic.formulas import RECOMPUTE_NAMES
    from calib.analytic.search import Space
    from calib.analytic.search import search as run_search
    from calib.commands import output
    from calib.resolve import resolve_system

    if as_json and as_csv:
        raise InputError("--json", "give either --json or --csv")
    model = resolve_model(model_name, d_model, n_layers, n_heads, seq_len, vocab, **shape)
    B = global_batch or model.global_batch
    if B is None:
        raise InputError(
            "--global-batch", f"model {model.label} has no default global batch; give --global-batch"
        )
    if B < 1:
        raise InputError("--global-batch", f"must be positive, got {B}")
    if max_tp is not None and max_tp < 1:
        raise InputError("--max-tp", f"must be positive, got {max_tp}")
    counts = parse_gpu_spec(require(gpus, "--gpus"))
    machine, notes = resolve_system(system, calibration, hardware, store)
    space = Space(
        zero=parse_zero(zero_stages),
        interleave=not no_interleave,
        max_tp=max_tp,
        flash_attention=flash_attention,
    )
    power = None
    if objective == "energy":
        from calib.commands.energy_cli import power_spec

        power = power_spec(machine.hw, system, store, dtype, power_file)
        notes = notes + list(power.notes)
    if nvlink_domain or offload_gbps is not None:
        from calib.commands.energy_cli import axis_search

        text = axis_search(
            model, machine, counts, B, space, top, nvlink_domain, offload_gbps, offload_gb, as_json, notes
        )
        text = output.emit(text, out)
        if text is not None:
            click.echo(text, nl=False)
        return
    res = run_search(model, machine, counts, B, space, top, objective=objective, power=power)
    if objective != "time":
        notes = notes + [f"ranked by {objective}: " + ("joules per token at the top clock under the power cap" if objective == "energy"
                                                        else "GPU-seconds per token (GPU-hours x price per token)")]  # fmt: skip

    def named(df):
        return df.assign(recompute=[RECOMPUTE_NAMES[i] for i in df["recompute"]]) if not df.empty else df

    table = named(res.top)
    summary = {
        "model": model.label, "machine": machine.hw.name, "calibration": machine.cal.system,
        "gpus": counts if len(counts) > 1 else counts[0], "global_batch": B,
        "strategies": res.n_strategies, "feasible": res.n_feasible, "seconds": res.seconds,
        "strategies_per_s": res.rate,
    }  # fmt: skip
    if as_json:
        text = output.dumps({**summary, "notes": notes, "top": output.records(table),
                             "best_per_gpus": output.records(named(res.best_per_gpus)) if len(counts) > 1 else []})  # fmt: skip
    elif as_csv:
        text = table.to_csv(index=False)
    else:
        text = output.search_text(
            summary, table, named(res.best_per_gpus) if len(counts) > 1 else None, notes
        )
    text = output.emit(text, out)
    if text is not None:
        click.echo(text, nl=False)
