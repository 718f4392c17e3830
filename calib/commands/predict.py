"""``calib predict``: iteration time, memory and scaling of one strategy at several GPU counts."""

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
    apply_moe,
    energy_options,
    moe_model_options,
    pop_moe,
    pop_stack,
    stack_label,
    stack_options,
    zero_impl_code,
    zero_impl_option,
)
from calib.core.errors import InputError


def parse_gpus(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError("--gpus", f"expected comma-separated integers like 8,16,32, got '{text}'") from None
    if not out or min(out) < 1:
        raise InputError("--gpus", f"GPU counts must be positive integers, got '{text}'")
    return out


@click.command(
    epilog=MACHINE_HELP,
    help="""Predict iteration time, memory and scaling of one parallel strategy at each GPU count.

\b
Per configuration: iteration time (s) split into kernel execution, intra/inter-op
dispatch, exposed TP / PP / DP all-reduce, all-gather, reduce-scatter communication,
pipeline bubble and optimizer step; overlapped communication (s); memory per GPU (GB:
weights, gradients, optimizer states, activations) with an out-of-memory verdict;
tokens/s, model TFLOP/s per GPU, MFU; speedup and scaling efficiency against the
smallest GPU count (with seed 004's speedup formula alongside).

\b
Example:
  calib predict --hardware polaris --model gpt-13b --gpus 8,64,512 --zero 3
  calib predict --hardware dgx-h100 --model mixtral-8x7b --gpus 64 --ep 8 --pp 4 --s 4096 \\
      --zero 1 --distributed-optimizer --schedule dualpipe --precision fp8 --global-batch 512
""",
)
@machine_options
@model_options
@moe_model_options
@stack_options
@click.option("--gpus", help="Comma-separated GPU counts, e.g. 8,16,32,64 (required).")
@click.option("--zero", type=Int(0, 3), default=0, show_default=True, help="ZeRO stage 0-3 (0 = plain DDP).")
@click.option("--tp", type=Int(1), default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=Int(1), default=1, show_default=True, help="Pipeline-parallel size.")
@click.option(
    "--interleave", type=Int(1), default=1, show_default=True, help="Virtual pipeline stages per GPU (v)."
)
@click.option(
    "--micro-batch", type=Int(1), default=1, show_default=True, help="Sequences per micro-batch (b)."
)
@click.option(
    "--global-batch",
    type=Int(1),
    help="Sequences per iteration (B); default micro-batch x DP (weak scaling).",
)
@click.option(
    "--recompute",
    type=Choice(("none", "selective", "full", "op")),
    default="none",
    show_default=True,
    help="Activation recomputation: selective = the attention core (Korthikanti et al.); op = "
    "torchtitan's op-level selective AC (matmul and attention outputs saved but every second matmul).",
)
@click.option(
    "--seq-parallel",
    is_flag=True,
    help="Sequence parallelism (TP all-reduces become reduce-scatter + all-gather).",
)
@click.option(
    "--dp-overlap/--no-dp-overlap",
    default=None,
    help="Overlap DP/ZeRO collectives with backward (and ZeRO-3 forward) compute, or not.  Default: on "
    "for ZeRO-3 (DeepSpeed stage 3 and FSDP prefetch by default), off otherwise; a note says so.",
)
@click.option(
    "--flash-attention/--no-flash-attention",
    default=None,
    help="Fused attention (no s x s activations kept or moved), or Megatron's 2021 unfused attention.  "
    "Default: fused for SwiGLU, grouped-query, MoE or latent-attention models, s >= 4096 or FP8-capable "
    "hardware (the fused-attention generation), unfused otherwise; a note says which.",
)
@zero_impl_option
@click.option("--shard-group", "shard", type=Int(0), default=0, show_default=True,
              help="Hybrid sharding (FSDP HYBRID_SHARD, MiCS): ZeRO-2/3 states sharded over this many DP "
              "ranks, replicated across groups (0 = the whole DP group; 8 = one DGX node).")  # fmt: skip
@click.option("--fused-layers", is_flag=True,
              help="Fused element-wise layers (Calculon's knob): 3 of the 5 activation passes remain.")  # fmt: skip
@click.option("--tp-cols", "tp_cols", type=Int(1), default=1, show_default=True,
              help="2D tensor parallelism (seed 002): columns tp_c of the tp_r x tp_c TP grid (1 = 1D TP; "
              "must divide TP and the sequence; needs --seq-parallel).")  # fmt: skip
@click.option("--tp2d-kind", type=Choice(("2d", "summa")), default="2d", show_default=True,
              help="2D TP grid: seed 002's 2D table (weights over the rows) or SUMMA (weights over the grid).")  # fmt: skip
@click.option(
    "--ranks-per-node",
    type=Int(1),
    help="Ranks launched per node (default: one per device, the calibration's GPUs per node); more ranks "
    "than the node's compute slots (e.g. 4 gloo ranks on a 2-core host) time-share it.",
)
@click.option(
    "--energy",
    is_flag=True,
    help="Also energy and power per iteration, the energy-optimal SM clock (DVFS), and with --tokens the "
    "energy, time and GPU-hours to solution (docs/energy.md).",
)
@click.option("--tokens", type=float, help="Training tokens to solution (with --energy).")
@click.option(
    "--price-per-gpu-hour", type=float, help="Price of one GPU-hour (with --energy --tokens): cost."
)
@energy_options("--energy")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (every column, units in the names).")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (one row per GPU count).")
@click.option(
    "-o",
    "--out",
    metavar="FILE",
    help="Write the output to this file (atomically) instead of stdout.",
)
def predict(system, calibration, hardware, store, model_name, d_model, n_layers, n_heads, seq_len, vocab, gpus, zero,
            tp, pp, interleave, micro_batch, global_batch, recompute, seq_parallel, dp_overlap, flash_attention,
            zero_impl, shard, fused_layers, tp_cols, tp2d_kind, ranks_per_node, energy, tokens, price_per_gpu_hour, dtype, power_file, as_json, as_csv, out,
            **shape):  # fmt: skip
    from calib.analytic.formulas import recompute_code
    from calib.analytic.predict import Plan
    from calib.analytic.predict import predict as run_predict
    from calib.commands import output
    from calib.resolve import attention_default, overlap_default, resolve_system

    if as_json and as_csv:
        raise InputError("--json", "give either --json or --csv")
    moe, stack = pop_moe(shape), pop_stack(shape)
    model = apply_moe(resolve_model(model_name, d_model, n_layers, n_heads, seq_len, vocab, **shape), **moe)
    _check_tp_cols(model, tp, tp_cols, seq_parallel)
    machine, notes = resolve_system(system, calibration, hardware, store, ranks_per_node=ranks_per_node)
    flash_attention, fnotes = attention_default(flash_attention, model, machine.hw)
    dp_overlap, onotes = overlap_default(dp_overlap, zero)
    notes = notes + fnotes + onotes
    plan = Plan(tp=tp, pp=pp, zero=zero, micro_batch=micro_batch, global_batch=global_batch,
                recompute=recompute_code(recompute), seq_parallel=seq_parallel, interleave=interleave,
                dp_overlap=dp_overlap, flash_attention=flash_attention, fused_layers=fused_layers, tp_c=tp_cols,
                tp2d_kind=("2d", "summa").index(tp2d_kind), shard=shard,
                zero_impl=zero_impl_code(zero_impl), **stack)  # fmt: skip
    result = run_predict(model, machine, parse_gpus(require(gpus, "--gpus")), plan)
    notes = notes + result.notes
    if energy:
        from calib.commands.energy_cli import add_energy

        result, enotes = add_energy(model, machine, result, plan, system, store, tokens, price_per_gpu_hour,
                                    dtype, power_file)  # fmt: skip
        notes = notes + enotes
    elif tokens is not None or price_per_gpu_hour is not None:
        raise InputError("--tokens", "--tokens and --price-per-gpu-hour need --energy")
    elif power_file is not None:  # was silently ignored
        raise InputError("--power", "a power fit is used only with --energy")
    if as_json:
        text = output.dumps({
            "model": model.__dict__, "hardware": machine.hw.__dict__, "calibration": machine.cal.system,
            "plan": plan.__dict__ | {"recompute": recompute}, "notes": notes, "configs": output.records(result.table),
        })  # fmt: skip
    elif as_csv:
        text = result.table.to_csv(index=False)
    else:
        header = [
            f"model {model.label}: d={model.d_model} l={model.n_layers} a={model.n_heads} s={model.seq_len} V={model.vocab}",
            f"machine {machine.hw.name} ({machine.hw.device}, {machine.hw.gpus_per_node} GPUs/node, "
            f"{machine.hw.peak_tflops:g} TFLOP/s peak, {machine.hw.hbm_gb:g} GB HBM); calibration {machine.cal.system}",
            f"strategy ZeRO-{zero} TP={tp} PP={pp} v={interleave} micro-batch={micro_batch} recompute={recompute}"
            + (" +SP" if seq_parallel else "")
            + (" +DP-overlap" if dp_overlap else "")
            + (" +flash" if flash_attention else "")
            + (" +fused-layers" if fused_layers else "")
            + (f" shard-group={shard}" if shard else "")
            + (" (FSDP)" if zero_impl == "fsdp" else "")
            + (f" TP grid {tp // tp_cols}x{tp_cols} ({tp2d_kind})" if tp_cols > 1 else "")
            + stack_label(stack),
        ]
        text = output.predict_text(result.table, header, notes)
        if energy:
            from calib.commands.energy_cli import energy_text

            text = text.rstrip("\n") + "\n\n" + energy_text(result.table)
    text = output.emit(text, out)
    if text is not None:
        click.echo(text, nl=False)


def _check_tp_cols(model, tp: int, cols: int, seq_parallel: bool) -> None:
    """The 2D TP grid's columns, refused as ``calib search`` refuses them (naming --tp-cols)."""
    if cols > 1 and (model.seq_len % cols or tp % cols):
        raise InputError(
            "--tp-cols",
            f"{cols} columns divide not TP={tp} or not the sequence {model.seq_len} of {model.label}",
        )
    if cols > 1 and not seq_parallel:
        raise InputError(
            "--tp-cols",
            "a 2D TP grid splits the sequence: its rows run sequence parallel; add --seq-parallel",
        )
