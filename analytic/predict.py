"""Predict one strategy at several GPU counts: breakdown, memory, throughput, scaling.

Scaling is reported against the smallest configuration g two ways:

* ``speedup`` = tokens/s at n over tokens/s at g, and ``scaling_eff`` = speedup * g / n;
* ``speedup_comm_model``: seed 004's formula from g's time shares and the communication
  efficiency eff_{g->n} = t_comm(g) / t_comm(n):
  (tokens per iteration ratio) * (r_compute + r_comm) / (r_compute + r_comm / eff_{g->n}),
  which equals ``speedup`` whenever the per-GPU compute does not change with n (weak
  scaling, the default: the global batch grows with DP); it is left empty (NaN) for
  configurations whose work per GPU differs from g's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from calib.analytic import formulas as F
from calib.analytic.device_path import compiled_view
from calib.analytic.interval import iter_interval
from calib.analytic.memory import overflow_term
from calib.analytic.modern import check_modern, stack_notes
from calib.analytic.specs import ModelSpec
from calib.analytic.strategy import Strategies, check_config
from calib.analytic.timemodel import TIME_KEYS, System, evaluate
from calib.calibrate.params import DEFAULT

GB = 1e9


@dataclass(frozen=True)
class Plan:
    """The knobs held fixed while the GPU count varies (see ``calib predict --help``)."""

    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1
    global_batch: int | None = None  # None: weak scaling, micro_batch x DP sequences
    recompute: int = F.NONE
    seq_parallel: bool = False
    interleave: int = 1
    dp_overlap: bool = False
    flash_attention: bool = False
    cp: int = 1  # context-parallel size
    ep: int = 1  # expert-parallel size
    cp_kind: int = 0  # 0 ring attention, 1 Ulysses
    fp8: bool = False
    schedule: int = 0  # 0 1F1B / interleaved, 1 ZB-H1, 2 DualPipe
    dist_opt: bool = False
    tp_overlap: bool = False
    master: int = 0  # master weights: 0 fp32, 1 bf16
    tp_c: int = 1  # 2D TP (seed 002, analytic.tp2d): columns of the tp_r x tp_c grid; 1 = 1D TP
    tp2d_kind: int = 0  # 0 seed 002's 2D table, 1 SUMMA
    fused_layers: bool = False  # fused element-wise layers (Calculon's knob, seed 000)
    compiled: bool = False  # torch.compile'd training (the device model's compiled family)
    shard: int = 0  # hybrid sharding: ZeRO-2/3 shard group size (analytic.hybrid); 0 = the DP group
    zero_impl: int = 0  # ZeRO as 0 DeepSpeed or 1 PyTorch FSDP runs it (analytic.dp_exposure)


def _check_tp2d(model: ModelSpec, plan: Plan) -> None:
    """A 2D TP grid's columns divide TP and the sequence, and its rows run sequence parallel."""
    from calib.core.errors import InputError

    c = plan.tp_c
    if c < 1:
        raise InputError("tp_c", f"must be a positive integer, got {c}")
    if c > 1 and (plan.tp % c or model.seq_len % c):
        raise InputError(
            "tp_c",
            f"{c} columns divide not TP={plan.tp} or not the sequence {model.seq_len} of {model.label}",
        )
    if c > 1 and not plan.seq_parallel:
        raise InputError(
            "tp_c", "a 2D TP grid splits the sequence: its rows run sequence parallel (seq_parallel)"
        )
    if plan.tp2d_kind not in (0, 1):
        raise InputError("tp2d_kind", f"0 (2D table) or 1 (SUMMA), got {plan.tp2d_kind}")


@dataclass(frozen=True)
class Prediction:
    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def predict(model: ModelSpec, system: System, gpus: list[int], plan: Plan) -> Prediction:
    """Evaluate ``plan`` at every GPU count; raise InputError on the first invalid one."""
    if not gpus:
        from calib.core.errors import InputError

        raise InputError("gpus", "give at least one GPU count")
    gpus = sorted(set(gpus))
    _check_tp2d(model, plan)
    system, compile_notes = compiled_view(system, model, plan.compiled)
    dps, batches = [], []
    for n in gpus:
        B = plan.global_batch or plan.micro_batch * (n // (plan.tp * plan.cp * plan.pp) or 1)
        dps.append(check_config(model, n, plan.tp, plan.pp, plan.micro_batch, B, plan.interleave, plan.zero,
                                plan.recompute, plan.seq_parallel, plan.cp, plan.shard, plan.zero_impl))  # fmt: skip
        batches.append(B)
    st = Strategies.of(
        tp=np.full(len(gpus), plan.tp), pp=np.full(len(gpus), plan.pp), dp=np.array(dps),
        micro_batch=np.full(len(gpus), plan.micro_batch), global_batch=np.array(batches),
        interleave=plan.interleave, zero=plan.zero, recompute=plan.recompute,
        seq_parallel=plan.seq_parallel, dp_overlap=plan.dp_overlap, flash_attention=plan.flash_attention,
        cp=plan.cp, ep=plan.ep, cp_kind=plan.cp_kind, fp8=plan.fp8, schedule=plan.schedule,
        dist_opt=plan.dist_opt, tp_overlap=plan.tp_overlap, master=plan.master,
        tp_c=plan.tp_c, tp2d_kind=plan.tp2d_kind, fused_layers=plan.fused_layers, shard=plan.shard,
        zero_impl=plan.zero_impl,
    )  # fmt: skip
    for i in range(len(gpus)):
        check_modern(model, system.hw, st, i)
    r = evaluate(model, system, st)
    n = np.array(gpus, dtype=float)
    df = pd.DataFrame({
        "gpus": gpus, "tp": plan.tp, "cp": plan.cp, "ep": plan.ep, "pp": plan.pp, "dp": dps, "zero": plan.zero,
        "micro_batch": plan.micro_batch, "microbatches": r["microbatches"].astype(int), "global_batch": batches,
        "iter_s": r["iter_s"],
    })  # fmt: skip
    for k in (*TIME_KEYS, "ep_cp_s", "dp_allreduce_s", "dp_allgather_s", "dp_reducescatter_s", "compute_s", "comm_s",
              "comm_exposed_s", "comm_overlapped_s"):  # fmt: skip
        df[k] = np.broadcast_to(r[k], n.shape)
    for k in ("weights", "grads", "optimizer", "activations", "total"):
        df[f"mem_{k}_gb"] = np.broadcast_to(r[f"mem_{k}_bytes"], n.shape) / GB
    df["hbm_gb"] = system.hw.hbm_bytes / GB  # capacity in the memory columns' GB (1e9 bytes)
    df["oom"] = np.broadcast_to(r["oom"], n.shape)
    df["oom_term"] = np.broadcast_to(overflow_term(r, system.hw.hbm_bytes), n.shape)
    df["tokens_per_s"] = r["tokens_per_s"]
    df["tflops_per_gpu"] = r["model_tflops_per_gpu"]
    df["hw_tflops_per_gpu"] = r["hw_tflops_per_gpu"]
    df["mfu"] = r["mfu"]
    df = df.assign(**scaling(df))
    notes = [f"scaling relative to {gpus[0]} GPUs", *compile_notes, *stack_notes(model, plan, system)]
    labels = [f"{g} GPUs" for g in gpus]

    def iter_at(other: System) -> np.ndarray:  # the same strategies on a variant of the machine
        return evaluate(model, other, st)["iter_s"]

    notes += attention_note(model, plan.flash_attention) + network_note(
        system, plan.zero, sharded_span(plan.tp, plan.cp, np.array(dps), plan.shard), labels, iter_at
    )
    notes += host_note(gpus, r, system)
    if plan.flash_attention:
        notes += attention_spread_note(system, r["iter_s"], labels, iter_at)
    if plan.fused_layers and system.device_model is not None:
        notes.append(
            "fused layers: not applied -- the device model's layer terms are fitted on the traced kernels"
        )
    band = iter_interval(model, system, st, df["iter_s"].to_numpy())
    if band is not None:
        df.insert(df.columns.get_loc("iter_s") + 1, "iter_s_lo", band[0])
        df.insert(df.columns.get_loc("iter_s") + 2, "iter_s_hi", band[1])
        if (df["comm_exposed_s"] > 0).any():
            band[2].append("the interval does not hold the communication model's error")
        notes.extend(band[2])
    if plan.global_batch is None:
        notes.append(
            f"weak scaling: global batch = micro-batch {plan.micro_batch} x DP (one micro-batch per GPU)"
        )
    if df["oom"].any():
        notes.append(
            "OOM: "
            + ", ".join(
                f"{g} GPUs ({t} the largest term)" for g, t in df.loc[df["oom"], ["gpus", "oom_term"]].values
            )
            + " exceed device memory"
        )
    return Prediction(df, notes)


def scaling(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """Speedup and efficiency against the first (smallest) row; seed 004's formula alongside."""
    n = df["gpus"].to_numpy(dtype=float)
    tok = df["tokens_per_s"].to_numpy()
    it = df["iter_s"].to_numpy()
    comm = df["comm_exposed_s"].to_numpy()
    speedup = tok / tok[0]
    r_comm = comm[0] / it[0]
    r_comp = 1.0 - r_comm
    batch = df["global_batch"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = np.where(comm > 0, comm[0] / comm, 1.0)
        seed = (batch / batch[0]) / (r_comp + r_comm / eff)
    # the seed's formula holds compute fixed: defined only when the work per GPU is unchanged
    weak = np.isclose(batch / n, batch[0] / n[0])
    seed = np.where(weak, seed, np.nan)
    return {
        "speedup": speedup,
        "scaling_eff": speedup * n[0] / n,
        "eff_comm": eff,
        "speedup_comm_model": seed,
    }


def host_note(gpus: list[int], r: dict, system: System) -> list[str]:
    """Where the host's kernel issue, not the device, sets the step (device model only): a
    faster GPU does not shorten it, and the per-operator host cost is the traced machine's --
    on another host CPU (a transfer to other hardware keeps it) the step moves with that CPU,
    which nothing here measures."""
    host = np.broadcast_to(np.asarray(r.get("host_issue_s", 0.0), dtype=float), (len(gpus),))
    it = np.broadcast_to(np.asarray(r["iter_s"], dtype=float), (len(gpus),))
    bound = (host > 0) & (host >= it * (1.0 - 1e-9))
    if not bound.any():
        return []
    where = ", ".join(f"{g} GPUs ({h * 1e3:.4g} ms)" for g, h in zip(np.asarray(gpus)[bound], host[bound]))
    moved = "transferred_from" in (system.cal.provenance or {})
    return [
        f"host-bound: the step is the host's kernel-issue time at {where}, not the device's work; a faster "
        "GPU does not shorten it, and the per-operator host cost is the traced machine's"
        + ("; it is kept on the target hardware, whose host CPU is not measured" if moved else "")
    ]


def attention_note(model, flash_attention: bool) -> list[str]:
    """A note when attention runs unfused: at long sequences the s x s scores it keeps and
    moves dominate, and every stack since FlashAttention (2022) fuses them."""
    if flash_attention:
        return []
    return [
        f"attention unfused (the s x s scores kept and moved, as Megatron ran GPT-3 in 2021); at s = "
        f"{model.seq_len} a stack with fused attention (FlashAttention, cuDNN / PyTorch SDPA) wants the "
        "flash-attention option"
    ]


#: the attention core's efficiency over the GEMMs' (System.attn_eff_ratio) that the stacks
#: fitted in this repository reached: llm-foundry's BF16 FlashAttention tables by validation
#: fits (stop 27, leave-one-out and every-third: H100 0.50-0.55, A100 0.77-0.78) and
#: cuDNN's SDPA in the H100 traces (the device model's fused attention at head width 128
#: against the spec path's count: 17.6 / 12.75 fs per b a s^2 h' = 1.38).  Reported, not a
#: default: the default stays 1 (the GEMMs' efficiency)
ATTN_RATIO_SEEN = (0.5, 1.38)
#: the smallest spread of the step (relative) worth a note
ATTN_SPREAD_NOTE_MIN = 0.1


def attention_spread_note(system: System, iter_s, labels, iter_at) -> list[str]:
    """With fused attention on the spec path (no device model) at the stated default
    efficiency, the step between the attention efficiencies fitted stacks reached
    (:data:`ATTN_RATIO_SEEN`), where that moves it by 10 % or more: at long sequences the
    attention core is most of the work and its efficiency is the stack's, not the GPU's.
    ``iter_at(system)``: the same strategies' iteration seconds on another system (the
    caller's evaluation); ``labels`` name them.  The caller checks that attention is fused."""
    from dataclasses import replace

    from calib.analytic.timemodel import ATTN_EFF_RATIO

    if system.device_model is not None or system.attn_eff_ratio != ATTN_EFF_RATIO:
        return []
    slow, fast = (iter_at(replace(system, attn_eff_ratio=x)) for x in ATTN_RATIO_SEEN)
    if not np.any(
        np.asarray(slow, dtype=float) >= (1.0 + ATTN_SPREAD_NOTE_MIN) * np.asarray(iter_s, dtype=float)
    ):
        return []
    at = _span_text(labels, fast, slow)
    lo, hi = ATTN_RATIO_SEEN
    return [
        "attention core at the GEMMs' efficiency (a stated default); the stacks fitted here ran it at "
        f"{lo:g}-{hi:g} x that (FlashAttention in llm-foundry's H100/A100 tables 0.5-0.78, cuDNN SDPA in the "
        f"H100 traces 1.38), which puts the step at {at}: calibrate on traces or long-sequence rows of your stack"
    ]


def _span_text(labels, fast, slow) -> str:
    """'label fast-slow s' per configuration, for the notes that give a step's span."""
    return ", ".join(f"{name} {float(f):.4g}-{float(sl):.4g} s" for name, f, sl in zip(labels, fast, slow))


#: what the published tables whose rows identify it put sharded data parallelism at, as a
#: fraction of the stated inter-node busbw (validation's network fit; docs/analytic.md)
SHARDED_DP_SCALES = (0.15, 0.4)
SHARDED_DP_SCALE_SEEN = f"{SHARDED_DP_SCALES[0]:g}-{SHARDED_DP_SCALES[1]:g}"


def sharded_span(tp, cp, dp, shard) -> np.ndarray:
    """GPUs one ZeRO group's members spread over with ranks numbered TP innermost, then CP, DP
    (analytic.placement): its members are tp apart, over the CP x DP ranks or, with hybrid
    sharding, over one shard group of ``shard`` of them."""
    tp, cp, dp, shard = (np.asarray(x, dtype=float) for x in (tp, cp, dp, shard))
    return tp * np.where(shard > 0, shard, cp * dp)


def network_note(system: System, zero_stages, span_gpus, labels=None, iter_at=None) -> list[str]:
    """A note when a ZeRO-3 group spans nodes (``span_gpus``, :func:`sharded_span`) over the
    machine's stated (default) inter-node busbw: every published table that identifies the
    bandwidth sharded data parallelism reached put it well below the stated one, so such
    times are likely optimistic.  With ``iter_at(system)`` (the same strategies' iteration
    seconds on another system) and their ``labels``, the note gives the step with the
    inter-node busbw at the ends of :data:`SHARDED_DP_SCALES`."""
    z3, span = np.broadcast_arrays(np.asarray(zero_stages) == 3, np.asarray(span_gpus, dtype=float))
    if not np.any(z3 & (span > system.gpus_per_node)):
        return []
    across = [c for c in system.cal.collectives if c.n_nodes > 1]
    if not across or any(c.busbw_gbps.status != DEFAULT for c in across):
        return []  # measured (calib fit) or fitted to measured rows
    from calib.analytic.machine import default_calibration

    stated = max(
        (c.busbw_gbps.value for c in default_calibration(system.hw).collectives if c.n_nodes > 1), default=0.0
    )
    if max(c.busbw_gbps.value for c in across) < 0.9 * stated:
        return []  # a fitted fraction carried to this machine (a transfer)
    at = ""
    if iter_at is not None:
        from calib.analytic.vfit import scaled_network

        slow, fast = (iter_at(scaled_network(system, x)) for x in SHARDED_DP_SCALES)
        at = ", which puts the step at " + _span_text(labels, fast, slow)
    return [
        "ZeRO-3 across nodes is timed at the machine's stated inter-node bus bandwidth (a default, not a "
        f"measurement); the published tables that identify it put sharded data parallelism at {SHARDED_DP_SCALE_SEEN} "
        f"of it (validation's network fit){at}, so these times may be optimistic: calibrate on measured runs of "
        "your stack (a validation fit saved as a calibration, or nccl-tests logs)"
    ]
