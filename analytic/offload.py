"""Weight, activation and optimizer offload to host / CPU memory (seeds 000 and 001, Calculon).

Calculon's tensor offloading (seed 001, "How tensor offloading works"): fast memory (HBM)
keeps only the few transformer blocks in use -- the layer computing and the one being
prefetched, ``RESIDENT_LAYERS`` = 2 -- and the rest lives in slower offload memory of
capacity ``offload_gb`` and bandwidth ``offload_gbps`` per GPU *in each direction* (full
duplex).  There is "no overhead if enough time to prefetch tensors for the next layer and
offload tensors for the previous layer during the current layer's compute".  Per layer
and micro-batch, with W the layer's fp16 weight bytes per GPU, G its gradient bytes, A the
activation bytes it keeps:

    forward   in: W (weights)            out: A (activations)
    backward  in: W + G + A              out: G
    exposed = max(0, max(in, out) / bw - t_phase)   for each phase

t_phase is the layer's forward or backward compute time.  Optimizer offload keeps the
12 bytes/parameter Adam states in offload memory; the step streams them in and out
(2 + 12 bytes/parameter each way: states with gradients in, states with weights out), not
hidden.  Bandwidth to hide everything: max(in, out) / t_phase of the larger phase.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from calib.analytic import formulas as F
from calib.analytic.mla import attention_kept_coeffs, op_sac_terms
from calib.analytic.timemodel import attention_proj_params, shape_terms

RESIDENT_LAYERS = 2.0
OPT_STREAM_BYTES_PER_PARAM = 14.0  # Adam states (12) + gradients in / weights out (2), each way
KNOBS = ("weight_offload", "activation_offload", "optimizer_offload")


@dataclass(frozen=True)
class Offload:
    """The three Calculon offload knobs (broadcastable bool arrays)."""

    weight_offload: np.ndarray
    activation_offload: np.ndarray
    optimizer_offload: np.ndarray

    @classmethod
    def of(cls, weights=False, activations=False, optimizer=False) -> Offload:
        return cls(*(np.asarray(x, dtype=bool) for x in (weights, activations, optimizer)))

    @classmethod
    def grid(cls, ndim: int) -> Offload:
        """All 8 combinations along a new last axis (after ``ndim`` leading axes)."""
        k = np.arange(8)
        shape = (1,) * ndim + (8,)
        return cls(*((((k >> i) & 1) == 1).reshape(shape) for i in range(3)))


def offload_terms(model, st, r: dict, off: Offload, hw, trailing: bool = False) -> dict[str, np.ndarray]:
    """HBM kept, offload memory needed, traffic, bandwidth to hide it, and exposed seconds per iteration.

    ``r`` is a full :func:`~calib.analytic.timemodel.evaluate` result for ``st``; arrays
    broadcast with ``off``; ``trailing``: ``off`` adds a last axis (:meth:`Offload.grid`).
    """
    d, L, a, s = (
        np.asarray(x, dtype=float) for x in (model.d_model, model.n_layers, model.n_heads, model.seq_len)
    )
    t, p, dp, b = (x.astype(float) for x in (st.tp, st.pp, st.dp, st.micro_batch))
    m = st.global_batch / (dp * b)
    lps = L / p

    def ex(x):
        return np.asarray(x, dtype=float)[..., None] if trailing else np.asarray(x, dtype=float)

    ffn, kv, mats, _ = shape_terms(model)
    aw = attention_proj_params(model)  # attention projection weights per layer (MLA: low rank)
    layer_w = ex(F.BYTES_PER_VALUE * F.layer_matrix_params(d, ffn, kv, mats, aw) / t)
    layer_a = ex(F.activation_bytes_layer(b, s, d, a, t, st.seq_parallel, st.recompute, st.flash_attention,
                                          ffn / d, kv, mats, model.shape_extras.get("dropout", True), attention_kept_coeffs(model), op_sac_terms(model)))  # fmt: skip
    f_fwd = F.forward_flops_layer(b, s, d, ffn, kv, mats, aw)
    f_all = F.training_flops_layers(b, s, d, 1.0, st.recompute, ffn, kv, mats, aw, op_sac_terms(model))
    t_layer = ex(r["compute_s"] / (m * lps))
    t_f, t_b = t_layer * ex(f_fwd / f_all), t_layer * ex(1.0 - f_fwd / f_all)
    wo, ao, oo = off.weight_offload, off.activation_offload, off.optimizer_offload
    keep = np.minimum(1.0, RESIDENT_LAYERS / ex(lps))
    w_b, g_b, o_b, a_b = (ex(r[f"mem_{k}_bytes"]) for k in ("weights", "grads", "optimizer", "activations"))
    a_keep = np.minimum(a_b, RESIDENT_LAYERS * layer_a)
    hbm = (
        np.where(wo, (w_b + g_b) * keep, w_b + g_b)
        + np.where(oo, 0.0, o_b)
        + np.where(ao, a_keep, a_b)
        + hw.runtime_reserve_gb * 1e9
    )
    offload = (
        np.where(wo, (w_b + g_b) * (1.0 - keep), 0.0)
        + np.where(oo, o_b, 0.0)
        + np.where(ao, a_b - a_keep, 0.0)
    )
    fwd_in, fwd_out = np.where(wo, layer_w, 0.0), np.where(ao, layer_a, 0.0)
    bwd_in = np.where(wo, 2.0 * layer_w, 0.0) + np.where(ao, layer_a, 0.0)
    bwd_out = np.where(wo, layer_w, 0.0)
    need_f, need_b = np.maximum(fwd_in, fwd_out), np.maximum(bwd_in, bwd_out)
    bw = hw.offload_gbps * 1e9 if hw.offload_gbps > 0 else np.inf
    per_mb = np.maximum(0.0, need_f / bw - t_f) + np.maximum(0.0, need_b / bw - t_b)
    opt_params = o_b / 12.0
    opt_s = np.where(oo, OPT_STREAM_BYTES_PER_PARAM * opt_params / bw, 0.0)
    exposed = ex(m * lps) * per_mb + opt_s
    required = np.maximum(need_f / np.maximum(t_f, 1e-30), need_b / np.maximum(t_b, 1e-30))
    return {
        "hbm_bytes": hbm,
        "offload_bytes": offload,
        "offload_exposed_s": exposed,
        "offload_required_gbps": required / 1e9,
        "iter_offload_s": ex(r["iter_s"]) + exposed,
        "fits": (hbm <= hw.hbm_bytes) & (offload <= hw.offload_gb * 1e9),
    }


def efficiency_vs_bandwidth(model, st, r, off: Offload, hw, gbps) -> np.ndarray:
    """Seed 001's 'relative efficiency of offload memory compared to the infinite bandwidth case'."""
    from dataclasses import replace

    base = offload_terms(model, st, r, off, replace(hw, offload_gbps=0.0))["iter_offload_s"]
    return np.array([base / offload_terms(model, st, r, off, replace(hw, offload_gbps=float(g)))["iter_offload_s"]
                     for g in np.atleast_1d(gbps)])  # fmt: skip


def offload_search(model, system, gpus, global_batch: int, space, top: int = 10, allow=None, knob_axes=True):
    """The search with Calculon's knobs as more axes: every layout x option x offload
    combination (x TP overlap none/pipe/ring x TP redo, :mod:`analytic.knobs`, with
    ``knob_axes``), ranked by iteration time including exposed offload traffic; feasible where
    the resident part fits in HBM and the rest in ``hw.offload_gb``.  ``allow``: the offload
    combinations (codes 0-7, bit 0 weights, 1 activations, 2 optimizer) to consider."""
    import pandas as pd
    from calib.analytic.knobs import TP_OVERLAP, knob_terms
    from calib.analytic.search import OPTION_AXES, _strategies, layouts, option_mask, options
    from calib.analytic.timemodel import evaluate

    gpus = [gpus] if isinstance(gpus, (int, np.integer)) else list(gpus)
    lay, opt = layouts(model, gpus, global_batch, space), options(space)
    off_codes = np.array(sorted(allow) if allow is not None else range(8))
    ovs, redos = (
        (np.arange(3), np.array([False, True])) if knob_axes else (np.zeros(1, int), np.ones(1, bool))
    )
    combo = np.stack(np.meshgrid(off_codes, ovs, redos, indexing="ij"), -1).reshape(-1, 3)
    codes = combo[:, 0]
    nd = 1 + len(OPTION_AXES)
    shape = (1,) * nd + (-1,)
    off = Offload(*((((codes >> i) & 1) == 1).reshape(shape) for i in range(3)))
    n_opt = int(np.prod([opt[k].size for k in OPTION_AXES])) * codes.size
    step = max(1, (1 << 17) // n_opt)
    rows, n_valid, n_fit = [], 0, 0
    keys = ("iter_s", "mfu", "mem_total_bytes")
    for lo in range(0, lay["tp"].size, step):
        sl = {k: v[lo : lo + step] for k, v in lay.items()}
        sts = _strategies(sl, opt, global_batch, space)
        r = evaluate(model, system, sts)
        o = offload_terms(model, sts, r, off, system.hw, trailing=True)
        if knob_axes:
            kt = knob_terms(model, sts, r, combo[:, 1].reshape(shape), combo[:, 2].reshape(shape) == 1, True)
            o["iter_offload_s"] = o["iter_offload_s"] + kt["d_iter_s"]
            o["hbm_bytes"] = o["hbm_bytes"] + kt["d_mem_bytes"]
            o["fits"] = (o["hbm_bytes"] <= system.hw.hbm_bytes) & (
                o["offload_bytes"] <= system.hw.offload_gb * 1e9
            )
        grid = (sl["tp"].size, *(opt[k].size for k in OPTION_AXES), codes.size)
        mask = option_mask(sl, opt)[..., None]
        if knob_axes:  # no duplicates: overlap and redo only where there is TP (redo: with SP) to change
            ov, rd = combo[:, 1].reshape(shape), combo[:, 2].reshape(shape) == 1
            tp1 = sl["tp"].reshape((-1,) + (1,) * nd) > 1
            mask = mask & (tp1 | ((ov == 0) & ~rd)) & (opt["seq_parallel"][..., None] | ~rd)
        mask = np.broadcast_to(mask, grid)
        score = np.where(mask & o["fits"], o["iter_offload_s"], np.inf)
        score = np.broadcast_to(score, grid)
        n_valid += int(mask.sum())
        n_fit += int(np.isfinite(score).sum())
        flat = score.ravel()
        k = min(top, flat.size)
        best = np.argpartition(flat, k - 1)[:k]
        best = best[np.isfinite(flat[best])]
        idx = np.unravel_index(best, grid)
        row = {k2: sl[k2][idx[0]] for k2 in sl}
        row |= {k2: opt[k2].ravel()[idx[a]] for a, k2 in enumerate(OPTION_AXES, 1)}
        row |= {KNOBS[i]: ((codes[idx[-1]] >> i) & 1) == 1 for i in range(3)}
        if knob_axes:
            row["tp_overlap"] = np.array(TP_OVERLAP)[combo[idx[-1], 1]]
            row["tp_redo"] = combo[idx[-1], 2] == 1
        for k2 in keys:
            row[k2] = np.broadcast_to(np.asarray(r[k2])[..., None], grid)[idx]
        for k2, v in o.items():
            row[k2] = np.broadcast_to(v, grid)[idx]
        rows.append(pd.DataFrame(row))
    df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    if df.empty:
        return df, n_valid, n_fit
    df["gpus"] = df["tp"] * df.get("cp", 1) * df["pp"] * df["dp"]  # CP: analytic.modern
    df["mfu_offload"] = df["mfu"] * df["iter_s"] / df["iter_offload_s"]
    df["hbm_gb"] = df.pop("hbm_bytes") / 1e9
    df["offload_gib"] = df.pop("offload_bytes") / 2**30
    df = df.sort_values("iter_offload_s", kind="stable").head(top).reset_index(drop=True)
    return df, n_valid, n_fit
