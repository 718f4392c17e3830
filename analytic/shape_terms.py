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
    ZeRO-3 gathers whole (analytic.memory).  Dense: (attention + mats d ffn) / t
    (formulas.layer_matrix_params; GPT 12 d^2 / t); MoE: (attention + n_sh mats d f_e + d E) / t
    + E / ep routed experts of mats d f_e, whole (expert TP 1), as moe.params_split counts them.
    Attention: :func:`attention_proj_params` (MLA's low-rank projections where set).  An MTP
    depth (analytic.mla) is one more layer of the last kind with its 2d x d projection,
    gathered as one unit (Megatron-Core's MultiTokenPredictionLayer holds both), split over TP."""
    from calib.analytic import mla as MLA
    from calib.analytic import moe as MOE

    ffn, kv_frac, mats, _ = shape_terms(model)
    d, t = np.asarray(model.d_model, dtype=float), np.asarray(t, dtype=float)
    attn = attention_proj_params(model)
    dense = F.layer_matrix_params(d, ffn, kv_frac, mats, attn) / t
    mtp = 2.0 * d * d / t if MLA.depths(model) else None  # the MTP projection
    if not MOE.is_moe(model):
        return dense if mtp is None else dense + mtp
    m = MOE.terms(model)
    one = MOE.expert_params(d, m["f_e"], mats)
    moe = (attn + m["n_sh"] * one + d * m["E"]) / t + m["E"] / np.asarray(ep, dtype=float) * one
    moe = moe if mtp is None else moe + mtp  # the MTP block is a MoE layer: the largest of that kind
    return np.maximum(moe, dense) if m["L_moe"] < float(model.n_layers) else moe
