"""The time model's terms for today's stacks: MoE/EP, context parallelism, FP8, schedules,
the distributed optimizer and TP overlap (used by :mod:`analytic.timemodel`).

Layout (Megatron-Core rank order TP, CP, DP, PP; MoE parallel folding): gpus = t c p d;
the dense weights are replicated over the d c ranks of a stage and their gradients
reduced there; the routed experts are split over ``ep`` ranks (expert tensor parallel
1, EP ranks adjacent) and replicated over EDP = t c d / ep ranks.  Per layer and
micro-batch every GPU holds s / c tokens of its b sequences.  Every term is a broadcast
numpy expression; a dense bf16 1F1B strategy gets exactly the terms it had before.
"""

from __future__ import annotations

import numpy as np
from calib.analytic import context as CP
from calib.analytic import formulas as F
from calib.analytic import hybrid as HY
from calib.analytic import mla as MLA
from calib.analytic import moe as MOE
from calib.analytic import overlap as OV
from calib.analytic import precision as PR
from calib.analytic.bubble import DUALPIPE, ZB_H1, in_flight_scale, param_copies
from calib.analytic.comm import group_time_s, members_per_node
from calib.analytic.shape_terms import layer_params_gpu  # noqa: F401 (timemodel's too)

from calib.core.collective_names import ALLGATHER, ALLREDUCE, ALLTOALL, REDUCESCATTER, SENDRECV
from calib.core.errors import InputError


def _f(x) -> np.ndarray:
    return np.asarray(x, dtype=float)


# ---- validity ---------------------------------------------------------------------------
def valid_mask_modern(model, st, m) -> np.ndarray:
    """CP / EP / schedule rules over a strategy grid (see :func:`check_modern`)."""
    s, a = np.asarray(model.seq_len), np.asarray(model.n_heads)
    cp, ep, t, p, dp, v, sch = st.cp, st.ep, st.tp, st.pp, st.dp, st.interleave, st.schedule
    ok = (ep >= 1) & ((cp == 1) | (s % (2 * cp) == 0))
    ok &= (st.cp_kind != CP.ULYSSES) | (a % (t * cp) == 0)
    E = int(getattr(model, "n_experts", 0) or 0)
    if E:
        ok &= (E % ep == 0) & ((t * cp * dp) % ep == 0) & (st.seq_parallel | (t == 1))
    else:
        ok &= ep == 1
    ok &= (sch == 0) | (v == 1)
    ok &= (sch != ZB_H1) | ((p > 1) & (m >= p))
    ok &= (sch != DUALPIPE) | ((p > 1) & (p % 2 == 0) & (m >= 2 * p))
    ok &= ~st.dist_opt | (st.zero == 1)
    return ok


def check_modern(model, hw, st, i: int = 0) -> None:
    """Strategy ``i`` of ``st``: raise InputError naming the first broken rule."""
    r = st.row(i)
    cp, ep, t, p, dp, sch = r["cp"], r["ep"], r["tp"], r["pp"], r["dp"], r["schedule"]
    m = int(np.broadcast_to(st.microbatches, st.shape).ravel()[i])
    E = int(getattr(model, "n_experts", 0) or 0)
    if cp > 1 and model.seq_len % (2 * cp):
        raise InputError(
            "cp", f"CP={cp} needs the sequence {model.seq_len} divisible by 2 x CP (load-balanced chunks)"
        )
    if cp > 1 and r["cp_kind"] == CP.ULYSSES and model.n_heads % (t * cp):
        raise InputError("cp", f"Ulysses needs TP x CP = {t * cp} to divide the {model.n_heads} heads")
    if ep > 1 and not E:
        raise InputError("ep", f"expert parallelism needs a MoE model; {model.label} is dense")
    if E and E % ep:
        raise InputError("ep", f"EP={ep} does not divide the {E} experts of {model.label}")
    if E and (t * cp * dp) % ep:
        raise InputError("ep", f"EP={ep} must divide TP x CP x DP = {t * cp * dp} (MoE parallel folding)")
    if E and t > 1 and not r["seq_parallel"]:
        raise InputError("seq_parallel", "MoE with TP > 1 needs sequence parallelism (tokens split over TP)")
    if sch and r["interleave"] > 1:
        raise InputError("schedule", "ZB-H1 and DualPipe run without interleaving (v = 1)")
    if sch and p < 2:  # name the condition that fails (was one message for both)
        raise InputError(
            "schedule", f"{('', 'ZB-H1', 'DualPipe')[sch]} needs pipeline parallelism (PP > 1), got PP={p}"
        )
    if sch == ZB_H1 and m < p:
        raise InputError("schedule", f"ZB-H1 needs micro-batches ({m}) >= PP={p}")
    if sch == DUALPIPE and (p % 2 or m < 2 * p):
        raise InputError(
            "schedule", f"DualPipe needs an even PP (got {p}) and micro-batches ({m}) >= 2 x PP={2 * p}"
        )
    if r["dist_opt"] and r["zero"] != 1:
        raise InputError("zero", "the distributed optimizer is ZeRO-1 (give ZeRO stage 1)")
    if r["fp8"] and not hw.peak_fp8_tflops:
        raise InputError("fp8", f"hardware {hw.name} states no peak_fp8_tflops")


# ---- shapes and parameters ----------------------------------------------------------------
def local_shape(model, st, s, ffn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s / c tokens per GPU, dense MLP width averaged over layers, flash attention)."""
    return s / st.cp.astype(float), MOE.dense_ffn_avg(model, ffn), st.flash_attention | (st.cp > 1)


def moe_params(model, d, t, p, ep, mats) -> tuple[np.ndarray, np.ndarray]:
    """(shared experts + router per GPU, routed experts per GPU) of one stage."""
    return MOE.params_split(model, d, t, p, ep, mats)


def full_groups(st) -> tuple[np.ndarray, np.ndarray]:
    """(dense gradient group d c, expert gradient group t c d / ep)."""
    t, cp, dp, ep = (x.astype(float) for x in (st.tp, st.cp, st.dp, st.ep))
    return dp * cp, t * cp * dp / ep


def groups(st) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) groups the ZeRO states are sharded over: the full groups, or their
    shard groups under hybrid sharding (analytic.hybrid)."""
    g_dense, g_exp = full_groups(st)
    if not np.any(HY.is_hybrid(st)):
        return g_dense, g_exp
    return HY.shard_sizes(st, g_dense, g_exp)


def _many(cal, coll, *parts) -> list[np.ndarray]:
    """``group_time_s`` of several (bytes, n, k) triples of one collective in one call
    (stacked: one contract call over their distinct pairs)."""
    arrs = np.broadcast_arrays(*(np.asarray(x, dtype=float) for part in parts for x in part))
    shape = arrs[0].shape
    stack = [np.stack(arrs[i::3]) for i in range(3)]
    out = group_time_s(cal, coll, *stack)
    return [np.reshape(out[j], shape) for j in range(len(parts))]


def dp_time_s(cal, gpn, coll, dense_bytes, expert_bytes, st) -> np.ndarray:
    """One DP collective over the dense buffer (d c ranks, t apart) and, for MoE, the expert
    buffer (EDP ranks, ep apart); under hybrid sharding over the shard groups."""
    g_dense, g_exp = groups(st)
    t, ep = st.tp.astype(float), st.ep.astype(float)
    dense = (dense_bytes, g_dense, members_per_node(g_dense, t, gpn))
    if not np.any(np.asarray(expert_bytes) > 0):
        return group_time_s(cal, coll, *dense)
    a, b = _many(cal, coll, dense, (expert_bytes, g_exp, members_per_node(g_exp, ep, gpn)))
    return a + b


def replica_allreduce_s(cal, gpn, dense_bytes, expert_bytes, st) -> np.ndarray:
    """Hybrid sharding: the all-reduce of each rank's 1 / g_s gradient shard across the
    r = g / g_s replicas (ranks g_s apart); zero where the state is sharded over the whole
    group (analytic.hybrid)."""
    if not np.any(HY.is_hybrid(st)):
        return np.zeros(np.broadcast_shapes(np.shape(dense_bytes), st.shape))
    (f_dense, f_exp), (s_dense, s_exp) = full_groups(st), groups(st)
    t, ep = st.tp.astype(float), st.ep.astype(float)
    r_dense, r_exp = f_dense / s_dense, f_exp / s_exp
    dense = (np.asarray(dense_bytes) / s_dense, r_dense, members_per_node(r_dense, t * s_dense, gpn))
    if not np.any(np.asarray(expert_bytes) > 0):
        return group_time_s(cal, ALLREDUCE, *dense)
    exp = (np.asarray(expert_bytes) / s_exp, r_exp, members_per_node(r_exp, ep * s_exp, gpn))
    a, b = _many(cal, ALLREDUCE, dense, exp)
    return a + b


# ---- communication of one layer -----------------------------------------------------------
def comm_extra(model, cal, gpn, st, b, s, d, kv_frac) -> dict[str, np.ndarray]:
    """Seconds of one EP dispatch / combine and one CP exchange (layout-level, cached)."""
    t, cp, ep = (x.astype(float) for x in (st.tp, st.cp, st.ep))
    out = {}
    mo = MOE.terms(model)
    if mo["E"] and np.any(ep > 1):
        T = MOE.tokens_per_gpu(b, s, cp, t)
        k_ep = members_per_node(ep, 1, gpn)
        bpv = np.where(st.fp8, PR.DISPATCH_FP8_BYTES, F.BYTES_PER_VALUE)
        load = MOE.load_factor(model, T, ep)  # the busiest rank receives that many more
        disp = load * MOE.dispatch_bytes(T, mo["k"], d, mo["cap"], bpv)
        comb = load * MOE.dispatch_bytes(T, mo["k"], d, mo["cap"], F.BYTES_PER_VALUE)
        out["ep_dispatch_s"], out["ep_combine_s"] = _many(cal, ALLTOALL, (disp, ep, k_ep), (comb, ep, k_ep))
    if np.any(cp > 1):  # MLA: its up-projected K and V (analytic.context)
        k_cp, w = members_per_node(cp, t, gpn), MLA.head_widths(model)
        step = CP.ring_step_bytes(b, s, d, kv_frac, cp, t, widths=w)
        out["cp_ring_step_s"], out["cp_ring_step_bwd_s"] = _ring_step_s(cal, step, cp, k_cp)
        qkv, o = CP.ulysses_buffer_bytes(b, s, d, kv_frac, cp, t, widths=w)
        a, b_ = _many(cal, ALLTOALL, (qkv, cp, k_cp), (o, cp, k_cp))
        out["cp_a2a_s"] = a + b_
        kv = CP.allgather_kv_bytes(b, s, d, kv_frac, t, widths=w)
        out["cp_ag_s"] = group_time_s(cal, ALLGATHER, kv, cp, k_cp)
        out["cp_rs_s"] = group_time_s(cal, REDUCESCATTER, kv, cp, k_cp)
    return out


def _ring_step_s(cal, step, cp, k_cp) -> tuple[np.ndarray, np.ndarray]:
    """One ring step, forward (``step`` bytes) and backward (twice): every GPU sends to its
    neighbour at once.  Inside a node a send/recv pair; a ring over nodes also crosses each
    node boundary once per group, so a node's NICs carry one message per CP group with
    members on it (gpus_per_node / k)."""
    two = np.where(cp > 1, 2.0, 1.0)
    per = step / np.maximum(k_cp, 1.0)
    i1, i2, c1, c2 = _many(
        cal, SENDRECV, (step, two, two), (2 * step, two, two), (per, two, 1.0), (2 * per, two, 1.0)
    )
    inside = k_cp >= cp
    return np.where(inside, i1, np.maximum(i1, c1)), np.where(inside, i2, np.maximum(i2, c2))


def layer_comm(model, st, c, rc, window_s, attn_s) -> tuple[np.ndarray, np.ndarray]:
    """(EP + CP seconds per layer and micro-batch averaged over layers, exposed part)."""
    full = np.asarray(rc) == F.FULL
    total = exposed = 0.0
    mo = MOE.terms(model)
    if "ep_dispatch_s" in c:
        ep_s = (c["ep_dispatch_s"] + c["ep_combine_s"]) * np.where(full, 2.0, 1.0) + 2.0 * c["ep_combine_s"]
        frac = np.where(st.schedule == DUALPIPE, OV.EP_OVERLAP_DUALPIPE, OV.EP_OVERLAP_1F1B)
        share = mo["L_moe"] / float(model.n_layers)
        total = total + share * ep_s
        exposed = exposed + share * OV.exposed(ep_s, window_s, frac)
    if "cp_ring_step_s" in c:
        steps = st.cp.astype(float) - 1.0
        ring = steps * (c["cp_ring_step_s"] * np.where(full, 2.0, 1.0) + c["cp_ring_step_bwd_s"])
        uly = c["cp_a2a_s"] * np.where(full, 3.0, 2.0)
        agkv = c["cp_ag_s"] * np.where(full, 2.0, 1.0) + c["cp_rs_s"]
        is_ring = st.cp_kind == CP.RING
        other = np.where(st.cp_kind == CP.ULYSSES, uly, agkv)
        total = total + np.where(is_ring, ring, other)
        exposed = exposed + np.where(is_ring, OV.exposed(ring, attn_s, OV.CP_RING_OVERLAP), other)
    return np.asarray(total, dtype=float), np.asarray(exposed, dtype=float)


# ---- compute of one layer -------------------------------------------------------------------
def attn_fwd_flops(b, s_loc, d, t) -> np.ndarray:
    """Forward attention-core FLOPs per GPU as timemodel counts them: 4 b (s/c)^2 d / t."""
    return 4.0 * b * s_loc * s_loc * d / t


def cp_attention_extra_flops(b, s_loc, d, t, cp, rc) -> np.ndarray:
    """Attention FLOPs the local-sequence count misses under CP: the GPU's queries meet all s
    keys, 4 b (s/c) s d / t forward (load-balanced), not 4 b (s/c)^2 d / t."""
    # CP attention runs blockwise (flash): its backward recomputes the scores (context.py)
    passes = 1.0 + CP.FLASH_BWD_OVER_FWD + F.attention_recomputed(rc)
    return passes * attn_fwd_flops(b, s_loc, d, t) * (_f(cp) - 1.0)


def moe_layer_s(model, system, st, b, s_loc, d, t, mats, rc, eff_fn, peak) -> np.ndarray:
    """Seconds of one MoE layer's experts on one GPU per micro-batch (kernel time, before k1 k2):
    grouped routed GEMMs at their own efficiency (a device model: device_path.moe_device_s),
    shared experts and router, token permutation traffic, FP8 casts."""
    mo = MOE.terms(model)
    T = b * s_loc / t
    passes = 3.0 + (np.asarray(rc) == F.FULL)
    fl = MOE.layer_flops(model, T, t, mats, passes)
    lin_peak = np.where(st.fp8, peak * PR.fp8_speedup(system.hw), peak)
    x_sh = 2.0 * T * d * mo["f_e"]
    load = MOE.load_factor(model, T, st.ep)  # the busiest EP rank sets the pace (dropless)
    shared = fl["shared"] / (lin_peak * eff_fn(np.maximum(x_sh, 1.0)))
    routed_tok = load * mo["cap"] * T * mo["k"]
    cast = PR.CAST_IN_BYTES * (d + mo["f_e"]) + PR.CAST_GRAD_BYTES * ((mats - 1.0) * mo["f_e"] + d)
    casts = np.where(st.fp8, routed_tok * cast, 0.0)
    if system.device_model is not None:  # the routed part on the device model's roofline
        from calib.analytic.device_path import moe_device_s

        sh_tw = T * mo["n_sh"] * mo["f_e"]  # the shared experts' element-wise work (dense MLPs)
        return shared + moe_device_s(
            system, model, st, routed_tok, d, mo["f_e"], mats, passes - 2.0, casts, sh_tw
        )
    # the GPU's E / ep experts: one GEMM of their rows x the grouping law (analytic.moe)
    x_all, factor = MOE.grouped_gemm(T, mo, st.ep.astype(float), d, mats, lin_peak, system.hw.hbm_tbps)
    routed = load * fl["routed"] / (lin_peak * eff_fn(x_all)) * factor
    nbytes = MOE.DISPATCH_PASSES * routed_tok * d * F.BYTES_PER_VALUE
    return routed + shared + (nbytes + casts) / (system.hw.hbm_tbps * 1e12)


def gemm_and_casts(st, hw, f_train, attn_fwd, rc, peak, eff, T, d, ffn, kv_frac, mats, t, attn_extra=0.0, attn_ratio=1.0, attn_io=None):  # fmt: skip
    """(GEMM seconds of a layer, FP8 cast bytes): linear GEMMs precision.fp8_speedup x faster under ``fp8``.
    ``attn_extra``: attention FLOPs beyond ``f_train`` (a flash backward's recomputed scores);
    the attention core runs at ``attn_ratio`` x the GEMM efficiency (System.attn_eff_ratio);
    ``attn_io``: MLA's projections' inputs and outputs for the casts (analytic.mla.linear_io)."""
    attn_in = attn_fwd * (3.0 + F.attention_recomputed(rc))  # the attention core inside f_train
    linear, attn_tr = f_train - attn_in, (attn_in + attn_extra) / attn_ratio
    if not st.is_modern:
        return (linear + attn_tr) / (peak * eff), 0.0
    peak8 = peak * PR.fp8_speedup(hw)
    gemm = PR.gemm_time_s(linear, attn_tr, peak, peak8, eff, st.fp8)
    casts = PR.cast_bytes_layer(
        T, d, ffn, kv_frac, mats, t, np.where(np.asarray(rc) == F.FULL, 2.0, 1.0), attn_io
    )
    return gemm, np.where(st.fp8, casts, 0.0)


def extra_compute_s(model, system, st, b, s_loc, d, t, mats, rc, attn_x, eff, peak, attn_ratio=1.0):
    """Seconds per layer and micro-batch beyond the dense local-sequence layer: CP's attention
    over all keys and, for MoE, the average layer's experts (kernel time, before k1 k2)."""
    cal = system.cal
    out = attn_x / (peak * eff * attn_ratio)
    if MOE.is_moe(model):
        eff_fn = cal.gemm_efficiency if cal.gemm_efficiency_curve is not None else (lambda x_: eff)
        out = out + moe_share(model) * moe_layer_s(model, system, st, b, s_loc, d, t, mats, rc, eff_fn, peak)
    return out


def moe_share(model) -> float:
    return MOE.terms(model)["L_moe"] / float(model.n_layers)


def schedule_shares(f_fwd, f_train, attn_fwd) -> tuple[np.ndarray, np.ndarray]:
    """(F, W) over a stage's F + B: forward and weight-gradient (linear layers only) shares."""
    f_train = np.maximum(f_train, 1e-30)
    return f_fwd / f_train, np.maximum(f_fwd - attn_fwd, 0.0) / f_train


def tp_exposed(tp_layer, window, st) -> np.ndarray:
    """TP seconds per layer on the critical path: the exposed part of overlapped collectives plus
    the SM-sharing slowdown of the compute they hide under (analytic.overlap)."""
    return np.where(st.tp_overlap, OV.exposed_with_sharing(tp_layer, window, OV.TP_OVERLAP), tp_layer)


def dist_opt_exposed(st, rs, ag, bwd_window, fwd_window) -> tuple[np.ndarray, np.ndarray]:
    """(reduce-scatter, all-gather) exposed seconds of the distributed optimizer."""
    ov = st.dp_overlap
    rs_e = np.where(ov, OV.exposed(rs, bwd_window, OV.DP_RS_OVERLAP), rs)
    ag_e = np.where(ov, OV.exposed(ag, fwd_window, OV.DP_AG_OVERLAP), ag)
    return rs_e, ag_e


# ---- memory --------------------------------------------------------------------------------
def memory(model, st, dense_p, expert_p, acts, d, t, p, m, b, s_loc, mats, rc, reserve_bytes, logits=0.0,
           largest_matrix=0.0, embed_p=0.0):  # fmt: skip
    """Weights, gradients, optimizer states (dense over d c, experts over EDP), activations.
    ``largest_matrix``: the largest weight matrix on this TP rank (DeepSpeed's ZeRO-3 cap,
    zero_overlap.live_gathered_params); ``embed_p``: embedding + LM head, no FP8 copy."""
    from calib.analytic.memory import BYTES_GRAD, BYTES_WEIGHT, gathered_bytes, stages_in_flight

    z = st.zero
    g_dense, g_exp = groups(st)
    copies = param_copies(st.schedule)
    opt_b = PR.optimizer_bytes_per_param(st.master)
    w_b = BYTES_WEIGHT + np.where(st.fp8, PR.FP8_WEIGHT_COPY_BYTES, 0.0)

    def states(P, g):
        return (w_b * P / np.where(z == 3, g, 1.0), BYTES_GRAD * P / np.where(z >= 2, g, 1.0),
                opt_b * P / np.where(z >= 1, g, 1.0))  # fmt: skip

    wd, gd, od = states(dense_p, g_dense)
    wd = wd - np.where(st.fp8, PR.FP8_WEIGHT_COPY_BYTES, 0.0) * embed_p / np.where(z == 3, g_dense, 1.0)
    we, ge, oe = states(expert_p, g_exp)
    layer = layer_params_gpu(model, t, st.ep)  # the model's own layer, MoE experts E / ep (shape_terms)
    gathered = gathered_bytes(layer, z, (largest_matrix, np.asarray(st.zero_impl) == 0))  # 0: DeepSpeed
    weights = copies * (wd + we) + gathered
    grads, optim = copies * (gd + ge), copies * (od + oe)
    keep = np.asarray(rc) != F.FULL
    in_flight = stages_in_flight(p, m, st.interleave)  # as the layers' own activations (memory.py)
    sbd = s_loc * b * d / t
    L_stage = np.ceil(np.asarray(model.n_layers, dtype=float) / p)
    extra = -np.where(st.fp8, PR.FP8_SAVED_SBD * sbd, 0.0) * L_stage
    if MOE.is_moe(model):
        T = b * s_loc / t
        per = (
            MOE.activation_bytes_layer(model, T, d, mats, ep=st.ep)
            - F.mlp_kept_coeff(
                MOE.dense_ffn_avg(model, model.shape_extras["ffn"]) / d,
                mats,
                model.shape_extras.get("dropout", True),
            )
            * sbd
        )
        extra = extra + per * np.ceil(MOE.terms(model)["L_moe"] / p)
    acts = (acts + np.where(keep, extra * in_flight, 0.0)) * in_flight_scale(p, st.schedule) + logits
    return {
        "mem_weights_bytes": weights,
        "mem_grads_bytes": grads,
        "mem_optimizer_bytes": optim,
        "mem_activations_bytes": acts,  # with the logits, also given on their own (analytic.memory)
        "mem_logits_bytes": np.asarray(logits, dtype=float),
        "mem_total_bytes": weights + grads + optim + acts + reserve_bytes,
    }


def opt_params(st, dense_p, expert_p) -> np.ndarray:
    """Parameters whose optimizer step a GPU runs (sharded under ZeRO >= 1)."""
    g_dense, g_exp = groups(st)
    z1 = st.zero >= 1
    return dense_p / np.where(z1, g_dense, 1.0) + expert_p / np.where(z1, g_exp, 1.0)


def moe_model_flops(model, B, s) -> np.ndarray:
    """Training FLOPs of the experts per iteration (B sequences of s tokens, no recompute)."""
    if not MOE.is_moe(model):
        return np.zeros(())
    mats = 3.0 if model.mlp == "swiglu" else 2.0
    fl = MOE.layer_flops(model, _f(B) * _f(s), 1.0, mats, 3.0)
    mo = MOE.terms(model)
    # model FLOPs count routed tokens once (no capacity padding)
    return mo["L_moe"] * (fl["routed"] / mo["cap"] + fl["shared"])


def stack_notes(model, plan, system=None) -> list[str]:
    """One line per stated default a prediction of ``plan`` relies on."""
    from calib.analytic import overlap as OV

    out = []
    if plan.fp8 and system is not None and system.device_model is not None:
        dm = system.device_model
        sp, cb = dm.fp8_gemm_speedup, dm.fp8_cast_bytes_per_elem
        gemm = (
            f"at the traced FP8 speed-up x{sp.value:.3g} of its bf16 rate"
            if sp is not None
            else f"at {PR.fp8_rate_text(system.hw)}, no FP8 GEMM traced"
        )
        casts = (
            f"the traced {cb.value:.3g} B per GEMM operand element"
            if cb is not None
            else f"Transformer Engine's fused casts, {PR.CAST_IN_BYTES:g} B per input and {PR.CAST_GRAD_BYTES:g} per "
            "gradient element (stated default: no eager FP8 run traced; unfused per-op amax, scale and cast "
            "kernels stream several times more and can make FP8 slower than bf16)"
        )
        out.append(
            f"FP8: the device model's linear GEMMs {gemm}; casts {casts}, at its streaming bandwidth; "
            "attention and LM head bf16"
        )
    elif plan.fp8 and system is not None:  # the spec path: the preset's measured FP8 rate or the datasheet's
        out.append(
            f"FP8: linear GEMMs at {PR.fp8_rate_text(system.hw)}; Transformer Engine's fused casts ({PR.CAST_IN_BYTES:g} B per input, "
            f"{PR.CAST_GRAD_BYTES:g} per gradient element, stated default); attention and LM head bf16"
        )
    if MOE.is_moe(model):
        from calib.analytic.mla import params_note

        note = params_note(model, *MOE.total_and_active_params(model))  # MTP module apart (analytic.mla)
        out.append(f"{note}; {MOE.router_note(model)}")
        dm = system.device_model if system is not None else None
        if dm is not None and (dm.moe is None or dm.moe.grouping_law):
            out.append(
                "MoE expert GEMMs: one GEMM of the routed rows on the fitted roofline x the grouping law "
                "(calibrate.grouped_gemm: each expert reads its own weights, its rows padded to 128-row tiles; "
                "constants fitted on 1,940 grouped_mm kernels of an H100)"
            )
        if dm is not None and dm.moe is not None:
            out.append(f"MoE routing: the traced implementation's, measured on {', '.join(dm.moe.runs)}")
        elif dm is not None:  # the hand count on a fitted device: say how far it was from HF's experts
            out.append(
                "MoE routing: hand count (a fused permutation, eight 2-byte passes of the routed rows; stated "
                "default: no MoE run traced on this system); HF transformers' grouped experts ran 20-40 % "
                "slower than it on an H100 and an H200 -- trace one MoE run to measure yours"
            )
    out.extend(MLA.device_notes(model, system.device_model if system is not None else None))
    if plan.tp_overlap:
        out.append(
            f"TP communication overlap: fraction {OV.TP_OVERLAP} of it hides under the layer (stated default)"
        )
    if plan.cp > 1 and plan.cp_kind == CP.RING:
        out.append(
            f"ring attention: fraction {OV.CP_RING_OVERLAP} of K/V exchange hides under attention (stated default)"
        )
    if plan.ep > 1:
        f = OV.EP_OVERLAP_DUALPIPE if plan.schedule == DUALPIPE else OV.EP_OVERLAP_1F1B
        out.append(f"EP all-to-all overlap fraction {f} (stated default)")
    if plan.dist_opt and plan.dp_overlap:
        out.append(f"distributed optimizer: reduce-scatter / all-gather overlap fractions {OV.DP_RS_OVERLAP} / "
                   f"{OV.DP_AG_OVERLAP} (stated defaults)")  # fmt: skip
    return out
