"""Compute and memory terms of a strategy grid from a fitted device model.

When the calibration holds a :class:`~calib.calibrate.device_model.DeviceModel` (fitted
from GPU traces), the time model takes its per-layer GEMM, attention and memory-bound
times, the LM head, optimizer and host issue time, and its memory terms from it, in
place of seed 004's k1/k2 characterisation (which reports still derive from the same
numbers: k1 = kernel / compute time, k2 = GEMM + attention / kernel time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from calib.analytic import formulas as F
from calib.analytic import precision as PR
from calib.analytic.memory import stages_in_flight
from calib.analytic.mla import linear_io, op_sac_attention
from calib.calibrate import device_step as D
from calib.calibrate.device_model import DeviceModel, Family


@dataclass(frozen=True)
class Shape:
    """Per-strategy shape arrays the device model needs (broadcast with the grid)."""

    d: np.ndarray
    L: np.ndarray
    a: np.ndarray
    s: np.ndarray
    V: np.ndarray
    ffn: np.ndarray
    kv: np.ndarray
    mlp: str
    tied: bool
    attn: tuple | None = None  # MLA's projections (analytic.mla.attention_linears); None: Q, K, V, O


def shape_of(model) -> Shape:
    from calib.analytic.mla import attention_linears

    ex = model.shape_extras
    f = lambda x: np.asarray(x, dtype=float)  # noqa: E731
    return Shape(f(model.d_model), f(model.n_layers), f(model.n_heads), f(model.seq_len), f(model.vocab),
                 f(ex["ffn"]), f(ex["kv"]), str(ex["mlp"]), bool(ex["tied"]), attention_linears(model))  # fmt: skip


def fp8_speedup(dm: DeviceModel, hw) -> float:
    """FP8 GEMMs' speed over BF16: the system's traced FP8 GEMMs where it has some (1.78
    on the H200 runs, fixtures/traces/h200), else the hardware's (precision.fp8_speedup:
    its preset's measured ratio or the datasheet peak ratio); 1 without FP8 units."""
    if not hw.peak_fp8_tflops:
        return 1.0
    if dm.fp8_gemm_speedup is not None:
        return float(dm.fp8_gemm_speedup.value)
    return PR.fp8_speedup(hw)


def layer_terms(
    dm: DeviceModel, fam: Family, sh: Shape, b, t, sp, rc, flash, fp8=False, fp8_scale=1.0, attn_scale=1.0
) -> dict[str, np.ndarray]:
    """Seconds of one layer per micro-batch: GEMMs + attention (transformer) and streamed.

    ``fp8`` (Transformer Engine style): the linear GEMMs run at the fitted bf16 rate times
    ``fp8_scale`` (the FP8 over the bf16 peak: the same fraction of the FP8 peak, the rule a
    BF16-only calibration predicted the llm-foundry FP8 section with, docs/analytic.md) and
    their casts stream at the fitted bandwidth (the traced bytes per operand element where
    eager FP8 runs were fitted, device_fp8; else Transformer Engine's fused casts);
    attention and the LM head stay bf16.
    ``attn_scale``: the attention core's FLOPs over a d / a-wide one (MLA's head widths,
    shape_terms.attention_dims_factor)."""
    from calib.analytic import precision as PR

    T = np.asarray(b, dtype=float) * sh.s
    rc = np.asarray(rc)
    passes = np.where(rc == F.FULL, 2.0, 1.0)
    # op-level SAC re-runs every second matmul (a share of the linear forward) and every
    # element-wise op (as full recompute does)
    # (MLA: the real projections' even matmuls, analytic.mla.op_sac_attention)
    lin_fwd = 2.0 * T * D.layer_params(sh.d, sh.a, sh.kv, sh.ffn, sh.mlp, sh.attn)
    mats, op_attn = 3.0 if sh.mlp == "swiglu" else 2.0, op_sac_attention(sh.attn, sh.d)
    op_fl = F.op_sac_recompute_flops(
        np.asarray(b, dtype=float), sh.s, sh.d, sh.ffn, sh.kv / sh.a, op_attn, mats
    )
    op_share = op_fl / lin_fwd
    gemm_passes = np.where(rc == F.OP, 1.0 + op_share, passes)
    stream_passes = np.where(rc == F.OP, 2.0, passes)
    fp8 = np.asarray(fp8, dtype=bool)
    scale = np.where(fp8, fp8_scale, 1.0)
    gemm = D.gemm_layer_s(dm, T, sh.d, sh.a, sh.kv, sh.ffn, t, sh.mlp, gemm_passes, scale, sh.attn)
    attn = D.attention_layer_s(dm, b, sh.s, sh.d, sh.a, t, flash, passes)
    selective = np.asarray(rc) == F.SELECTIVE
    attn = attn_scale * attn * np.where(selective, 4.5 / 3.5, 1.0)  # selective: the core's forward once more
    attn = D.attn_factor(fam) * attn  # torch.compile's traced attention (device_compile)
    stream = D.stream_layer_s(dm, fam, T, sh.d, sh.ffn, t, sp, stream_passes) + mla_stream_s(
        dm, fam, sh, T, t, sp, stream_passes
    )
    if np.any(fp8):
        if dm.fp8_cast_bytes_per_elem is not None:  # the traced implementation's casts
            casts = dm.fp8_cast_bytes_per_elem.value * D.fp8_operand_elems_layer(
                T, sh.d, sh.a, sh.kv, sh.ffn, t, sh.mlp, passes, sh.attn
            )
        else:  # Transformer Engine's fused casts, as the spec path
            casts = PR.cast_bytes_layer(T, sh.d, sh.ffn, sh.kv / sh.a, mats, t, passes, linear_io(sh.attn))
        if fam.cast_fusion is not None:  # torch.compile fuses the casts as it fuses the rest (stated)
            casts = casts * fam.cast_fusion.value
        stream = stream + np.where(fp8, casts / (D._bw(dm, fam) * 1e12), 0.0)
    return {"transformer": gemm + attn, "stream": stream}


def mla_stream_s(dm: DeviceModel, fam: Family, sh: Shape, T, t, sp, passes_fwd) -> np.ndarray | float:
    """Multi-head latent attention's memory-bound work beyond the dense family's, per layer
    and micro-batch: the traced implementation's bytes per token-layer per unit of d and
    kernels per layer (``dm.mla``, calibrate.device_mla), split over TP as the family's
    d-wide work is (stated); 0 for a model without MLA or a system without a dense MLA run."""
    mt = dm.mla
    if mt is None or sh.attn is None:
        return 0.0
    fuse_bytes, fuse_kernels, _ = compile_fusion(dm, fam)
    nbytes = max(mt.bytes_d.value, 0.0) * fuse_bytes * np.asarray(T, dtype=float) * D.d_part(sh.d, t, sp)
    return D.streamed_s(dm, fam, nbytes, max(mt.kernels_layer.value, 0.0) * fuse_kernels, passes_fwd)


def compile_fusion(dm: DeviceModel, fam: Family) -> tuple[float, float, float]:
    """What torch.compile leaves of the MoE routing's memory-bound work: the compiled
    family's streamed bytes, memory-bound kernels and host operators per layer over the
    eager family's (1 for an eager family).  Stated: Inductor fuses the routing's
    element-wise work, gathers and copies as it fuses the dense layer's (HF Mixtral on the
    H100: those kernels took 34.4 ms eager and 8.2 compiled, x0.24; the dense Llama x0.23)."""
    if not fam.compiled:
        return 1.0, 1.0, 1.0
    eager, _ = dm.family(fam.mlp, fam.weights, compiled=False)

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else 1.0

    return (
        fam.cast_fusion.value if fam.cast_fusion is not None else 1.0,
        ratio(fam.kernels_layer.value, eager.kernels_layer.value),
        ratio(fam.host_ops_layer.value, eager.host_ops_layer.value),
    )


def moe_routed_s(dm: DeviceModel, fam: Family, routed, d, f_e, mats, passes_fwd, scale=1.0, shared_tw=0.0, experts=1.0) -> np.ndarray:  # fmt: skip
    """Seconds of one MoE layer's routed experts per micro-batch: the expert GEMMs on the
    fitted roofline (one GEMM of the ``routed`` rows, times the grouping factor of its
    ``experts`` groups, calibrate.grouped_gemm, times the traced grouped kernels' measured
    slowdown beyond that where an MoE run was traced),
    and the routing work at the family's bandwidth -- the traced implementation's
    (``dm.moe``, calibrate.device_moe) or, untraced, the hand count (analytic.moe: eight
    2-byte passes over the routed rows of width d) plus the dense family's ffn bytes on the
    routed rows, a stated default.  ``shared_tw``: tokens x total width of the shared
    experts, dense MLPs whose element-wise work streams the family's ffn bytes (their GEMMs
    are analytic.modern.moe_layer_s's)."""
    from calib.analytic.moe import DISPATCH_PASSES
    from calib.calibrate.grouped_gemm import expert_factors

    R, d, f_e = (np.asarray(x, dtype=float) for x in (routed, d, f_e))
    mt = dm.moe
    # a calibration from before the law holds the grouping in its scale
    up, down = (
        expert_factors(experts, R, d, f_e, mats, dm.peak_tflops * np.asarray(scale, dtype=float), dm.hbm_tbps)
        if mt is None or mt.grouping_law
        else (1.0, 1.0)
    )
    lin = [(d, f_e, up)] * (int(mats) - 1) + [(f_e, d, down)]  # gate (and up), down
    g = dm.gemm
    gemm = sum(
        (passes_fwd * g.time_s(R, o, i, scale=scale) + g.time_s(R, i, o, scale=scale) + g.time_s(o, i, R, scale=scale)) * fac
        for i, o, fac in lin
    )  # fmt: skip
    if mt is not None and mt.grouped_gemm_scale is not None:  # the traced grouped kernels' speed
        gemm = gemm * mt.grouped_gemm_scale.value
    per_row = (
        mt.bytes_d.value * d + mt.bytes_ffn.value * f_e
        if mt is not None
        else DISPATCH_PASSES * F.BYTES_PER_VALUE * d + fam.bytes_ffn.value * f_e
    )
    # a measured excess below the dense family's (noise, or a family fitted on the MoE runs
    # themselves) is held at none
    fuse_bytes, fuse_kernels, _ = compile_fusion(dm, fam) if mt is not None else (1.0, 1.0, 1.0)
    per_row = np.maximum(per_row, 0.0) * fuse_bytes
    kernels = max(mt.kernels_layer.value, 0.0) * fuse_kernels if mt is not None else 0.0
    stream = D.streamed_s(dm, fam, R * per_row + fam.bytes_ffn.value * shared_tw, kernels, passes_fwd)
    return gemm + stream


def moe_device_s(
    system, model, st, routed, d, f_e, mats, passes_fwd, cast_bytes, shared_tw=0.0
) -> np.ndarray:
    """:func:`moe_routed_s` for ``model`` on ``system``'s device model, FP8 GEMMs at the
    traced (or datasheet) speed-up, and the experts' FP8 casts at the family's bandwidth."""
    dm = system.device_model
    fam, _ = dm.family(str(model.shape_extras["mlp"]))
    r8 = np.where(st.fp8, fp8_speedup(dm, system.hw), 1.0)
    local = float(model.n_experts) / np.asarray(st.ep, dtype=float)  # the GPU's experts, one group each
    routed_s = moe_routed_s(dm, fam, routed, d, f_e, mats, passes_fwd, r8, shared_tw, local)
    return routed_s + cast_bytes / (D._bw(dm, fam) * 1e12)


def host_s(dm: DeviceModel, fam: Family, layers, microbatches, moe_share=0.0, mla=False) -> np.ndarray:
    """The step's host issue time (device_step.host_s) plus the traced MoE implementation's
    operators on the MoE share of the layers (device_moe) and, for a model with multi-head
    latent attention (``mla``), the traced MLA's on every layer (device_mla)."""
    extra = max(dm.moe.host_ops_layer.value, 0.0) * moe_share if dm.moe is not None else 0.0
    extra = extra + (max(dm.mla.host_ops_layer.value, 0.0) if mla and dm.mla is not None else 0.0)
    extra = extra * compile_fusion(dm, fam)[2] if extra else extra
    return D.host_s(dm, fam, layers, microbatches, extra)


def head_terms(dm: DeviceModel, fam: Family, sh: Shape, b, t) -> dict[str, np.ndarray]:
    T = np.asarray(b, dtype=float) * sh.s
    return {
        "transformer": D.head_gemm_s(dm, T, sh.d, sh.V, t),
        "stream": D.head_stream_s(dm, fam, T, sh.V, t),
    }


def memory(
    dm: DeviceModel, fam: Family, sh: Shape, params_gpu, b, t, p, dp, zero, m, v, rc, sp, reserve_bytes
):
    """Memory per GPU with ZeRO sharding, pipeline micro-batches in flight and recompute."""
    z = np.asarray(zero)
    dp = np.asarray(dp, dtype=float)
    P = np.asarray(params_gpu, dtype=float)
    p_w = P / np.where(z == 3, dp, 1.0)
    p_opt = P / np.where(z >= 1, dp, 1.0)
    p_grad = P / np.where(z >= 2, dp, 1.0)
    p_, m_, v_ = (np.asarray(x, dtype=float) for x in (p, m, v))
    in_flight = stages_in_flight(p_, m_, v_)
    rc = np.asarray(rc)
    # full recompute keeps each layer's input (2 bytes per value) plus one layer's full set
    per_layer = D.act_layer_bytes(fam, sh.d, sh.kv / sh.a, sh.ffn)
    full_scale = (2.0 * sh.d / per_layer) + 1.0 / np.maximum(np.ceil(sh.L / p_), 1.0)
    # op-level SAC keeps what it saves (formulas.op_sac_kept_coeff) of the no-recompute set
    op_scale = (
        F.op_sac_kept_coeff(
            sh.ffn / sh.d, sh.kv / sh.a, 3.0 if sh.mlp == "swiglu" else 2.0, op_sac_attention(sh.attn, sh.d)
        )
        * sh.d
        / per_layer
    )
    scale = np.where(rc == F.FULL, full_scale, np.where(rc == F.OP, op_scale, 1.0)) * in_flight
    t_acts = D.act_split(t, sp)  # replicated activations without SP
    T = np.asarray(b, dtype=float) * sh.s
    V_eff = np.where(p_ == 1, sh.V, 0.0)  # logits live on the last stage only
    mem = D.memory_bytes(dm, fam, p_w, p_opt, p_grad, T, np.ceil(sh.L / p_), sh.d, V_eff, t_acts, scale,
                         ffn=sh.ffn, kv_frac=sh.kv / sh.a)  # fmt: skip
    mem = {f"mem_{k}_bytes": np.asarray(v_, dtype=float) for k, v_ in mem.items()}
    # the total is what the framework allocates at its peak (torch.cuda.max_memory_allocated);
    # the runtime's own reserve (context, allocator slack) counts only against device memory
    mem["mem_reserve_bytes"] = np.full_like(mem["mem_total_bytes"], float(reserve_bytes))
    return mem


def moe_act_bytes_layer(model, fam: Family, T, d, ep) -> np.ndarray:
    """Bytes one MoE layer keeps for backward beyond the dense family's attention side, in
    the traced family's own count (device_model.ACT_COUNT, times its measured scale): each
    routed copy keeps its permuted input and its expert output (2 d values) and the expert
    MLP's kept intermediates at the family's bytes per unit of width (HF's eager SwiGLU:
    gate, silu(gate), up and their product, 8 bytes per unit of f_e, where analytic.moe
    counts Megatron's fused three); shared experts their input and intermediates.  On the
    H200 Mixtral run: 4 d + 8 f_e = 18,432 bytes per routed token-layer, against 18,315
    measured (peak memory less the dense part, tests/test_device_moe.py)."""
    from calib.analytic import moe as MOE
    from calib.calibrate.device_model import act_count

    mo = MOE.terms(model)
    c_ffn = float(act_count(fam.key, 0.0, 0.0, 1.0))  # bytes per token per unit of MLP width
    d = np.asarray(d, dtype=float)
    T = np.asarray(T, dtype=float)
    routed = (
        mo["cap"]
        * T
        * mo["k"]
        * MOE.routed_act_factor(model, ep)
        * (2.0 * F.BYTES_PER_VALUE * d + c_ffn * mo["f_e"])
    )
    shared = T * mo["n_sh"] * (F.BYTES_PER_VALUE * d + c_ffn * mo["f_e"])
    return fam.act_scale.value * (routed + shared)


def mla_act_bytes_layer(model, fam: Family, tokens, d, t, sp) -> np.ndarray:
    """Bytes one layer of multi-head latent attention keeps beyond the full heads the traced
    family's count holds (device_model.ACT_COUNT: q and output 4 d, k and v 4 d kv/a): the
    latents and their norms and the up-projected q, k, v and output
    (analytic.mla.attention_kept_coeffs, the spec path's count), times the family's fitted
    scale; 0 without MLA.  Split over TP as the dense count is (replicated without SP)."""
    from calib.analytic.mla import attention_kept_coeffs

    kept = attention_kept_coeffs(model)
    if kept is None:
        return np.zeros(np.shape(t))
    t_acts = D.act_split(t, sp)
    full = 4.0 + 4.0 * float(model.shape_extras["kv"]) / float(model.n_heads)
    d = np.asarray(d, dtype=float)
    # torch.compile's partitioner recomputes element-wise work (the norms' casts) rather than keep it
    split, repl = hf_mla_kept_extra(model) if not fam.compiled else (0.0, 0.0)
    count = (
        kept[0] * d / np.asarray(t, dtype=float) + (kept[1] - full) * d / t_acts
        + split / np.asarray(t, dtype=float) + repl / t_acts
    ) * np.asarray(tokens, dtype=float)  # fmt: skip
    return fam.act_scale.value * count


def hf_mla_kept_extra(model) -> tuple[float, float]:
    """Bytes per token HF's DeepseekV3Attention (transformers 5.17, the traced family) keeps
    for backward beyond analytic.mla's count, read from its code: each latent's RMSNorm
    keeps its fp32 input and bf16 cast besides its output (4 more bytes per latent value,
    as the family's own norms, device_model.ACT_COUNT); the rotary key is rotated from a
    view and saves nothing (-2 r); the value is a view of kv_b's whole output, which sdpa
    keeps alive (2 a nope more).  (split over TP, replicated); 0 for a model without MLA."""
    from calib.analytic.mla import MLA_FIELDS, uses_mla

    if not uses_mla(model):
        return 0.0, 0.0
    q_r, kv_r, rope = (float(getattr(model, f) or 0) for f in MLA_FIELDS)
    h_qk = float(model.shape_extras.get("qk_head_dim") or 0) or float(model.d_model) / float(model.n_heads)
    nope = max(h_qk - rope, 0.0) if kv_r else 0.0
    return 2.0 * float(model.n_heads) * nope, 4.0 * q_r + (4.0 * kv_r - 2.0 * rope if kv_r else 0.0)


def adjust_dm_memory(mem, model, st, linear_p, expert_p, d, t, p, m, b, s_loc, mats, rc, fam):
    """A fitted device model's memory of the dense part (``mem``, :func:`memory`), plus what
    the new axes add: the routed experts' weights, optimizer states and gradients (ZeRO-
    sharded over EDP) in the traced family's precision (device_step.state_bytes_per_param:
    until stop 25 the spec path's fp32 master and moments, 12 bytes where HF's bf16 runs
    keep 4), the FP8 weight copy of the dense ``linear_p`` and the experts (the embedding and
    LM head stay bf16; none under torch.compile, which keeps FP8 linear inputs
    instead: precision.compiled_fp8_saved_bytes), DualPipe's second parameter copy and
    p + 1 micro-batches, the MoE layers' activations (:func:`moe_act_bytes_layer`) and multi-
    head latent attention's (:func:`mla_act_bytes_layer`).
    The peak is the device model's: the larger of the forward peak (states, activations,
    logits) and the end of backward (states, gradients) -- until stop 25 the experts'
    gradients were added to the forward peak, an upper bound."""
    from calib.analytic import moe as MOE
    from calib.analytic import precision as PR
    from calib.analytic.bubble import in_flight_scale, param_copies
    from calib.analytic.modern import groups

    z = st.zero
    g_dense, g_exp = groups(st)
    copies = param_copies(st.schedule)
    w_b, o_b, g_b = D.state_bytes_per_param(fam.weights)
    w = mem["mem_weights_bytes"] + w_b * expert_p / np.where(z == 3, g_exp, 1.0)
    fp8_copy = PR.FP8_WEIGHT_COPY_BYTES * (
        linear_p / np.where(z == 3, g_dense, 1.0) + expert_p / np.where(z == 3, g_exp, 1.0)
    )
    # torch.compile casts the weights again in the backward: no FP8 copy is kept
    fp8 = np.asarray(st.fp8, dtype=bool)
    compiled_fp8 = fp8 & bool(fam.compiled)
    w = copies * (w + np.where(fp8 & ~compiled_fp8, fp8_copy, 0.0))
    o = copies * (mem["mem_optimizer_bytes"] + o_b * expert_p / np.where(z >= 1, g_exp, 1.0))
    g = copies * (mem["mem_grads_all_bytes"] + g_b * expert_p / np.where(z >= 2, g_exp, 1.0))
    # activations the new axes add per stage and micro-batch in flight (none kept under full
    # recompute): the MoE layers' routed rows, and compiled FP8's linear inputs on the dense layers
    L_moe = MOE.terms(model)["L_moe"] if MOE.is_moe(model) else 0
    stage = 0.0
    if L_moe:
        stage = moe_act_bytes_layer(model, fam, b * s_loc / t, d, st.ep) * np.ceil(L_moe / p)
    if np.any(compiled_fp8):  # precision.compiled_fp8_saved_bytes
        t_acts = D.act_split(t, st.seq_parallel)
        per_layer = PR.compiled_fp8_saved_bytes(d, model.ffn_size) * b * s_loc / t_acts
        stage = stage + np.where(compiled_fp8, per_layer * np.ceil((model.n_layers - L_moe) / p), 0.0)
    stage = stage + mla_act_bytes_layer(model, fam, b * s_loc, d, t, st.seq_parallel) * np.ceil(
        model.n_layers / p
    )
    in_flight = stages_in_flight(p, m, st.interleave)
    acts = mem["mem_activations_all_bytes"] + np.where(np.asarray(rc) != F.FULL, stage * in_flight, 0.0)
    acts = acts * in_flight_scale(p, st.schedule)
    fwd = acts >= g  # the forward peak (states + activations) is the larger
    out = dict(mem)
    out.update(mem_weights_bytes=w, mem_optimizer_bytes=o, mem_grads_bytes=np.where(fwd, 0.0, g),
               mem_activations_bytes=np.where(fwd, acts, 0.0), mem_total_bytes=w + o + np.maximum(acts, g),
               mem_grads_all_bytes=g, mem_activations_all_bytes=acts)  # fmt: skip
    return out


def compiled_view(system, model, compiled: bool):
    """The system predicting torch.compile'd training (``compiled``): its device model's
    torch.compile family (calibrate.device_compile) where one was fitted for the model's
    MLP kind; the eager terms otherwise, with a note.  Returns (system, notes)."""
    from dataclasses import replace

    if not compiled:
        return system, []
    dm = system.cal.device_model
    if dm is None or not dm.families:
        return system, ["torch.compile: not modelled without a device model fitted from GPU traces "
                        "(the datasheet path prices eager kernels): predicted as eager"]  # fmt: skip
    mlp = str(model.shape_extras["mlp"])
    fam, note = dm.family(mlp, compiled=True)
    if note is not None:
        return system, [f"torch.compile: {note}"]
    view = replace(system, cal=replace(system.cal, device_model=replace(dm, compiled=True)))
    attn = f"attention x{fam.attn_scale.value:.2f} and " if fam.attn_scale is not None else ""
    fused = (
        f"streamed bytes x{fam.cast_fusion.value:.2f}"
        if fam.cast_fusion is not None
        else "its streamed bytes"
    )
    return view, [f"torch.compile: the {fam.key} family fitted on {', '.join(fam.runs)} ({attn}{fused} of the eager model's)"]  # fmt: skip
