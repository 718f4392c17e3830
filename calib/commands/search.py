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
from calib.commands.stack_options import (
    SCHEDULE_HELP,
    apply_moe,
    energy_options,
    moe_model_options,
    parse_list,
    parse_schedules,
    pop_moe,
    zero_impl_code,
    zero_impl_option,
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
Today's stacks: context parallelism (--cp sizes, ring or Ulysses), expert parallelism for
MoE models (--ep sizes; default every divisor of the experts), pipeline schedules 1F1B /
interleaved, ZB-H1 and DualPipe, FP8, the distributed optimizer, TP overlap.

\b
Output per strategy: iteration time (s), tokens/s, model TFLOP/s per GPU, MFU, compute,
exposed communication (of it TP, EP/CP and DP), bubble (s) and memory per GPU (GB); with
several GPU counts the best layout of each.

\b
Examples:
  calib search --model gpt3-175b --gpus 4096 --hardware selene --top 10
  calib search --model gpt3-175b --gpus 8-4096:8 --hardware dgx-h100   # system-size sweep
  calib search --model mixtral-8x7b --s 4096 --global-batch 1024 --gpus 256,512,1024 \\
      --hardware dgx-h100 --cp 1,2 --schedules 1f1b,zb-h1,dualpipe --precision fp8 --distributed-optimizer
""",
)
@machine_options
@model_options
@moe_model_options
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
@zero_impl_option
@click.option("--shard-groups", "shard_groups", default="0", show_default=True,
              help="Hybrid sharding shard-group sizes for ZeRO-2/3 (FSDP HYBRID_SHARD), e.g. 0,8 "
              "(0 = the whole DP group).")  # fmt: skip
@click.option("--max-tp", type=Int(1), help="Largest tensor-parallel size to consider.")
@click.option("--no-interleave", is_flag=True, help="Do not consider interleaved pipeline schedules.")
@click.option(
    "--flash-attention/--no-flash-attention",
    default=None,
    help="Fused attention for every strategy (no s x s activations), or Megatron's 2021 unfused attention.  "
    "Default: fused for SwiGLU, grouped-query, MoE or latent-attention models, s >= 4096 or FP8-capable "
    "hardware, unfused otherwise; a note says which.",
)
@click.option("--cp", "cp_sizes", help="Context-parallel sizes to consider, e.g. 1,2,4,8 (default 1).")
@click.option("--cp-kind", type=Choice(("ring", "ulysses", "allgather")), default="ring", show_default=True,
              help="Context parallelism: ring attention, Ulysses all-to-all or all-gathered K/V (Llama 3).")  # fmt: skip
@click.option(
    "--ep", "ep_sizes", help="Expert-parallel sizes to consider (default: every divisor of the experts)."
)
@click.option("--schedules", default="1f1b", show_default=True,
              help="Pipeline schedules to consider, e.g. 1f1b,zb-h1,dualpipe: " + SCHEDULE_HELP)  # fmt: skip
@click.option("--precision", type=Choice(("bf16", "fp8")), default="bf16", show_default=True,
              help="GEMM precision for every strategy (fp8: the hardware's measured FP8 GEMM rate, else its FP8 peak ratio).")  # fmt: skip
@click.option("--master-weights", type=Choice(("fp32", "bf16")), default="fp32", show_default=True,
              help="Optimizer master weights.")  # fmt: skip
@click.option("--uneven-pp", is_flag=True,
              help="Also PP sizes that do not divide the layers (extra layers on the first stages).")  # fmt: skip
@click.option("--distributed-optimizer", is_flag=True,
              help="ZeRO-1 strategies run Megatron's distributed optimizer (reduce-scatter + all-gather).")  # fmt: skip
@click.option(
    "--tp-comm-overlap", is_flag=True, help="Overlap TP collectives with GEMMs (a stated fraction)."
)
@click.option("--compile", "compiled", is_flag=True,
              help="torch.compile'd training for every strategy: the device model's torch.compile family, "
              "fitted from the system's compiled traces (without one: eager, with a note).")  # fmt: skip
@click.option("--tp-cols", "tp_cols", help="2D tensor parallelism (seed 002): columns tp_c of the tp_r x tp_c TP "
              "grid to consider, e.g. 1,2,4 (1 = 1D TP, the default; the columns split the sequence).")  # fmt: skip
@click.option("--tp2d-kind", type=Choice(("2d", "summa")), default="2d", show_default=True,
              help="2D TP grid: seed 002's 2D table (weights over the rows) or SUMMA (weights over the grid).")  # fmt: skip
@click.option("--fused-layers", "fused_layers", default="off", show_default=True,
              help="Fused element-wise layers (Calculon's knob) to consider: off, on or on,off (an axis).")  # fmt: skip
@click.option(
    "--objective",
    type=Choice(("time", "energy", "cost")),
    default="time",
    show_default=True,
    help="Rank by iteration time, energy per token (datasheet or fitted power, docs/energy.md) or cost "
    "(GPU-seconds per token, i.e. GPU-hours x price for a fixed token budget).",
)
@energy_options("--objective energy")
@click.option(
    "--nvlink-domain",
    type=Int(1),
    help="Placement axis: time every strategy of the grid under its best placement of the TP/CP/DP/PP "
    "groups on NVLink domains of this many GPUs (4, 8, 72 ...) and rank by the placed time (seed 002).",
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
           global_batch, top, zero_stages, zero_impl, shard_groups, max_tp, no_interleave, flash_attention, objective, dtype, power_file,
           nvlink_domain, offload_gbps, offload_gb, compiled, as_json, as_csv, out, **shape):  # fmt: skip
    from calib.analytic.bubble import SCHEDULES
    from calib.analytic.context import cp_kind_code
    from calib.analytic.formulas import RECOMPUTE_NAMES
    from calib.analytic.precision import master_code
    from calib.analytic.search import Space
    from calib.analytic.search import search as run_search
    from calib.commands import output
    from calib.resolve import resolve_system

    if as_json and as_csv:
        raise InputError("--json", "give either --json or --csv")
    moe = pop_moe(shape)
    stack = {k: shape.pop(k) for k in ("cp_sizes", "cp_kind", "ep_sizes", "schedules", "precision",
                                       "master_weights", "distributed_optimizer", "tp_comm_overlap",
                                       "uneven_pp", "tp_cols", "tp2d_kind", "fused_layers")}  # fmt: skip
    model = apply_moe(resolve_model(model_name, d_model, n_layers, n_heads, seq_len, vocab, **shape), **moe)
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
    from calib.analytic import moe as MOE
    from calib.analytic.device_path import compiled_view

    machine, compile_notes = compiled_view(machine, model, compiled)
    notes = notes + compile_notes
    from calib.analytic.predict import attention_note, network_note, sharded_span
    from calib.resolve import attention_default

    flash_attention, fnotes = attention_default(flash_attention, model, machine.hw)
    notes = notes + fnotes

    notes = (
        notes
        + attention_note(model, flash_attention)
        + ([MOE.router_note(model)] if MOE.is_moe(model) else [])
    )
    space = Space(
        zero=parse_zero(zero_stages),
        interleave=not no_interleave,
        max_tp=max_tp,
        flash_attention=flash_attention,
        cp=parse_list(stack["cp_sizes"], "--cp", (1,)),
        cp_kind=cp_kind_code(stack["cp_kind"]),
        ep=parse_list(stack["ep_sizes"], "--ep", ()) or None,
        schedules=parse_schedules(stack["schedules"]),
        fp8=stack["precision"] == "fp8",
        dist_opt=stack["distributed_optimizer"],
        tp_overlap=stack["tp_comm_overlap"],
        master=master_code(stack["master_weights"]),
        uneven_pp=stack["uneven_pp"],
        tp_c=parse_list(stack["tp_cols"], "--tp-cols", (1,)),
        tp2d_kind=("2d", "summa").index(stack["tp2d_kind"]),
        fused_layers=parse_on_off(stack["fused_layers"], "--fused-layers"),
        shard=parse_list(shard_groups, "--shard-groups", (0,), minimum=0),  # 0: the whole DP group
        zero_impl=zero_impl_code(zero_impl),
    )
    _check_axes(model, space)
    if space.fp8 and not machine.hw.peak_fp8_tflops:
        raise InputError("--precision", f"hardware {machine.hw.name} states no peak_fp8_tflops")
    power = None
    if power_file is not None and objective != "energy":  # was silently ignored
        raise InputError("--power", "a power fit is used only with --objective energy")
    if objective == "energy":
        from calib.commands.energy_cli import power_spec

        power = power_spec(machine.hw, system, store, dtype, power_file)
        notes = notes + list(power.notes)
        if not power.clock_mhz_known:
            from calib.commands.energy_cli import relative_clock_note

            notes.append(relative_clock_note(machine.hw.device))
    if nvlink_domain or offload_gbps is not None:
        from calib.commands.energy_cli import axis_search

        if objective != "time":  # was silently ranked by time
            axis = "--nvlink-domain" if nvlink_domain else "--offload-gbps"
            raise InputError(
                "--objective", f"{axis} ranks by time only; '{objective}' is not available with it"
            )

        text = axis_search(
            model, machine, counts, B, space, top, nvlink_domain, offload_gbps, offload_gb, as_json, notes
        )
        text = output.emit(text, out)
        if text is not None:
            click.echo(text, nl=False)
        return
    res = run_search(model, machine, counts, B, space, top, objective=objective, power=power)
    notes = notes + [n for n in res.notes if n not in notes]
    if objective != "time":
        notes = notes + [f"ranked by {objective}: " + ("joules per token at the top clock under the power cap" if objective == "energy"
                                                        else "GPU-seconds per token (GPU-hours x price per token)")]  # fmt: skip

    def named(df):
        if df.empty:
            return df
        return df.assign(recompute=[RECOMPUTE_NAMES[i] for i in df["recompute"]],
                         schedule=[SCHEDULES[i] for i in df["schedule"]])  # fmt: skip

    table = named(res.top)
    shown = table if len(counts) == 1 else res.best_per_gpus  # the layouts the output ranks first
    if not shown.empty:
        from calib.analytic.search import iter_of

        raw = res.top.head(1) if len(counts) == 1 else res.best_per_gpus  # the layouts shown first
        names = [f"{g} GPUs (best layout)" for g in raw["gpus"]]

        def iter_at(other):  # the first-ranked layouts on a variant of the machine
            return iter_of(model, other, raw, B, space)

        span = sharded_span(*(shown[k].to_numpy() for k in ("tp", "cp", "dp", "shard")))
        notes = notes + network_note(machine, shown["zero"].to_numpy(), span, names, iter_at)
        if flash_attention:  # the stated attention efficiency's reach
            from calib.analytic.predict import attention_spread_note

            notes = notes + attention_spread_note(machine, raw["iter_s"], names, iter_at)
    if power is not None and not power.clock_mhz_known:
        table = table.drop(columns=["f_opt_mhz"], errors="ignore")
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


def parse_on_off(text: str, option: str) -> tuple[bool, ...]:
    """'on', 'off' or 'on,off' as the values of a boolean search axis."""
    words = {w.strip().lower() for w in text.split(",") if w.strip()}
    if not words or not words <= {"on", "off"}:
        raise InputError(option, f"expected on, off or on,off, got '{text}'")
    return tuple(sorted(w == "on" for w in words))


def _check_axes(model, space) -> None:
    """Values of --cp, --ep and --tp-cols that no layout can take are refused, naming the option
    (as ``calib predict`` does), instead of an empty search."""
    S, E = model.seq_len, int(getattr(model, "n_experts", 0) or 0)
    for c in space.cp:
        if c > 1 and S % (2 * c):
            raise InputError(
                "--cp", f"CP={c} needs the sequence {S} divisible by 2 x CP (load-balanced chunks)"
            )
    for e in space.ep or ():
        if e > 1 and not E:
            raise InputError("--ep", f"expert parallelism needs a MoE model; {model.label} is dense")
        if E and E % e:
            raise InputError("--ep", f"EP={e} does not divide the {E} experts of {model.label}")
    _check_tp_cols(model, space)


def _check_tp_cols(model, space) -> None:
    """Each 2D TP column count must divide some TP size the search tries and the sequence."""
    tps = [t for t in range(1, model.n_heads + 1) if model.n_heads % t == 0 and t <= (space.max_tp or t)]
    for c in space.tp_c:
        if c > 1 and (model.seq_len % c or not any(t % c == 0 for t in tps)):
            raise InputError(
                "--tp-cols",
                f"{c} columns divide no TP size of {model.label} (TP divides its {model.n_heads} heads"
                + (f", TP <= {space.max_tp}" if space.max_tp else "")
                + f") or not its sequence {model.seq_len}",
            )
