"""Model-shape terms shared by the time, memory, energy, offload and placement models: the
parameters one GPU holds and the (ffn, kv/a, MLP matrices, tied) of a spec or of table rows."""

from __future__ import annotations

import numpy as np
from calib.analytic import formulas as F
from calib.analytic import uneven as U


def stage_params(d, L, s, V, t, p, ffn=None, kv_frac=1.0, mlp_mats=2.0, tied=True, attn=None) -> np.ndarray:
    """Parameters one GPU holds: its stage's layers plus the embedding (and an untied LM
    head on a single stage), over TP.  ``attn``: attention projection weights per layer
    (:func:`attention_proj_params`; None: (2 + 2 kv/a) d^2)."""
    emb = V * d * np.where(np.asarray(tied, dtype=bool) | (np.asarray(p) > 1), 1.0, 2.0)
    n_max = U.stage_layers(L, p)[0]  # the largest stage when p does not divide L (analytic.uneven)
    return (n_max * (F.layer_matrix_params(d, ffn, kv_frac, mlp_mats, attn) + 13.0 * d) + emb + s * d) / t


def attention_proj_params(model) -> np.ndarray:
    """Attention projection weights per layer before TP, the one count every parameter, FLOP
    and weight-byte site uses: (2 + 2 kv/a) d^2, or multi-head latent attention's low-rank
    projections where the model sets them (analytic.mla)."""
    from calib.analytic.mla import attention_proj_params as proj

    return proj(model)


def shape_terms(model) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """(ffn, kv / a, MLP matrices, tied) of a model spec or per-row columns.  ``kv / a`` is the
    full-head K/V share; with multi-head latent attention weights and FLOPs take
    :func:`attention_proj_params`, kept activations, op-level SAC, CP's K/V bytes and FP8 casts
    analytic.mla (attention_kept_coeffs, op_sac_terms, head_widths, linear_io)."""
    ex = model.shape_extras
    kv_frac = np.asarray(ex["kv"], dtype=float) / np.asarray(model.n_heads, dtype=float)
    return (
        np.asarray(ex["ffn"], dtype=float),
        kv_frac,
        3.0 if ex["mlp"] == "swiglu" else 2.0,
        bool(ex["tied"]),
    )


def attention_dims_factor(model) -> float:
    """The attention core's FLOPs over the 4 b s^2 d the formulas count: a (d_qk + d_v) / (2 d)
    with the model's per-head widths (1 when they are d / a; DeepSeek-V3's multi-head latent
    attention, 128 heads of 192 and 128: 2.857)."""
    ex = model.shape_extras
    hq, hv = ex.get("qk_head_dim"), ex.get("v_head_dim")
    if not hq and not hv:
        return 1.0
    d, a = float(np.asarray(model.d_model)), float(np.asarray(model.n_heads))
    return a * ((hq or d / a) + (hv or d / a)) / (2.0 * d)


def layer_params_gpu(model, t, ep=1.0) -> np.ndarray:
    """Weights of one layer on one GPU, the largest kind where dense and MoE layers mix: what
    ZeRO-3 gathers whole (analytic.memory) -- the sum of the matrices DeepSpeed gathers one by
    one (analytic.zero_overlap.layer_matrices: attention, MLA's low-rank projections where set;
    a dense MLP, or a MoE layer's E / ep routed experts whole plus shared experts and router),
    each over TP where it is split.  An MTP depth (analytic.mla) is a block of the last kind with
    its 2d x d projection, gathered as one unit (zero_overlap.mtp_matrices: Megatron-Core's
    MultiTokenPredictionLayer holds both), and stands for that kind."""
    from calib.analytic import moe as MOE
    from calib.analytic import zero_overlap as ZO

    ffn, kv_frac, mats, _ = shape_terms(model)
    t = np.asarray(t, dtype=float)

    def on_gpu(matrices) -> np.ndarray:
        return sum(count * elems / np.where(split, t, 1.0) for elems, count, split in matrices)

    def kind(share):  # share of MoE layers the counts stand for: 1.0 a MoE layer, 0.0 a dense one
        return on_gpu(ZO.layer_matrices(model.d_model, ffn, kv_frac, mats, model, ep, share))

    moe = MOE.is_moe(model)
    mtp = ZO.mtp_matrices(model.d_model, ffn, kv_frac, mats, model, ep)
    last = on_gpu(mtp) if mtp else kind(1.0 if moe else None)
    if moe and MOE.terms(model)["L_moe"] < float(model.n_layers):
        return np.maximum(last, kind(0.0))  # the leading dense layers may be the larger kind
    return last
