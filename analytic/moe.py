"""Mixture of experts: parameters, FLOPs, expert-parallel all-to-all, grouped expert GEMMs.

A MoE layer replaces the dense MLP by ``E`` routed experts of hidden size ``f_e`` (each
token goes to ``k`` of them) plus ``n_sh`` shared experts every token passes through
(DeepSeekMoE's fine-grained + shared experts, Dai et al. 2024, arXiv:2401.06066; DeepSeek-V3
report arXiv:2412.19437 sec. 2.1.2) and a router of d x E weights.  The first
``dense_layers`` layers keep a dense MLP (DeepSeek-V3: 3 of 61).

    expert weights       mats d f_e                      (mats = 3 SwiGLU, 2 GeLU)
    total parameters     attention + dense MLPs + L_moe (E + n_sh) mats d f_e + L_moe d E + embeddings
    active parameters    the same with k + n_sh experts in place of E + n_sh
    FLOPs per token      2 x active matrix parameters + 4 s d per layer  (forward; x 3 for training)

Checks (tests/test_analytic_moe.py): Mixtral 8x7B 46.7 B total / 12.9 B active (Jiang et al.
2024, arXiv:2401.04088 sec. 2); DeepSeek-V3 671 B / 37 B (arXiv:2412.19437 abstract).

Expert parallelism (EP, Lepikhin et al. 2020 GShard; Megatron-Core's ``alltoall`` token
dispatcher with expert tensor parallelism 1): the E experts are split over ``ep`` ranks
drawn from the TP x CP x DP ranks (EP x EDP = TP x CP x DP, Megatron-Core's MoE
parallel folding); tokens are split over the TP ranks (sequence parallelism), so each GPU
routes T = b s / (cp t) tokens.  Per MoE layer and micro-batch each GPU sends
T k d values in the dispatch all-to-all and receives as many back in the combine; the
backward repeats both.  A capacity factor C (token dropping, Fedus et al. 2021 Switch
Transformer) pads every expert to C T k ep / E tokens; ``None`` is dropless: the slowest
EP rank sets the pace, and even a perfectly balanced router leaves it
:func:`max_load_factor` times the mean load (the statistical floor).

A learned router is not balanced (GShard and Switch report a per-expert load spread that
their auxiliary losses only reduce; DeepSeek-V3 sec. 2.1.2 balances without one).  The
model's ``router_imbalance`` r >= 1 (stated default 1.0: balanced) is the busiest EP rank's
expected load over the mean from that skew, composed with the floor (:func:`load_factor`):

    load = r x (1 + z_ep sqrt((1 - 1/ep) / (T k)))     dropless, ep > 1 (1 at ep = 1)
    load = 1                                            capacity factor C: padded to C

The load multiplies, on the critical rank, the grouped expert GEMMs' seconds and their
token-permutation and FP8-cast traffic (analytic.modern.moe_layer_s), the all-to-all
bytes it receives in the dispatch and sends back in the combine (both directions,
analytic.modern.comm_extra), and -- by r alone, the floor apart as before -- the routed
activations it keeps for backward (:func:`activation_bytes_layer`).  With C, the busiest
expert group drops 1 - C / r of its tokens when r > C (:func:`router_note`: a note, not a
time).  r is one number for every ep > 1 (the skew seen at a rank averages over its E / ep
experts and is not rescaled with ep).

The experts of one GPU run as a grouped GEMM: E / ep GEMMs of M = ep T k C / E tokens
each in one launch.  Until stop 33 their efficiency followed the per-expert FLOPs 2 M d f_e,
as if each expert were a GEMM of its own.  Now it is one GEMM of all their rows, times the
grouping law measured on grouped kernels (calibrate.grouped_gemm, :func:`grouped_gemm`).  Every
expert reads its own weights, so few rows per expert (small EP, many experts) are bound by
those reads; each expert's rows are also padded to a tile.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

DISPATCH_PASSES = 8.0  # HBM passes over the routed tokens: permute + unpermute, fwd (2 x 2) and bwd (2 x 2)
DENSE_MLP_ACT = 19.0  # Korthikanti et al. 2022 sec. 4.1: the MLP's share of the 34 s b d bytes per layer


def is_moe(model) -> bool:
    return int(getattr(model, "n_experts", 0) or 0) > 0


def terms(model) -> dict[str, float]:
    """The MoE shape of a model (zeros for a dense one)."""
    if not is_moe(model):
        return {"E": 0.0, "k": 0.0, "f_e": 0.0, "n_sh": 0.0, "L_moe": 0.0, "cap": 1.0, "imb": 1.0}
    cap = model.capacity_factor
    return {
        "imb": float(getattr(model, "router_imbalance", 1.0)),
        "E": float(model.n_experts),
        "k": float(model.top_k),
        "f_e": float(model.expert_ffn or model.ffn_size),
        "n_sh": float(model.shared_experts),
        "L_moe": float(model.n_layers - model.dense_layers),
        "cap": float(cap) if cap else 1.0,
    }


def dense_ffn_avg(model, ffn: ArrayLike) -> np.ndarray:
    """The dense MLP width averaged over all layers (MoE layers have none)."""
    ffn = np.asarray(ffn, dtype=float)
    if not is_moe(model):
        return ffn
    return ffn * float(model.dense_layers) / float(model.n_layers)


def expert_params(d: ArrayLike, f_e: ArrayLike, mats: ArrayLike) -> np.ndarray:
    """Weights of one expert: mats d f_e."""
    return np.asarray(mats, dtype=float) * np.asarray(d, dtype=float) * np.asarray(f_e, dtype=float)


def params_split(model, d, t, p, ep, mats) -> tuple[np.ndarray, np.ndarray]:
    """(replicated MoE weights per GPU: shared experts + router over TP,
    expert weights per GPU: the stage's E / ep routed experts) of one pipeline stage, plus
    a multi-token-prediction module's (analytic.mla.mtp_stage_params; zero without one)."""
    from calib.analytic.mla import mtp_stage_params

    m = terms(model)
    mtp_sh, mtp_r = mtp_stage_params(model, d, t, ep, mats)  # on the charged stage (analytic.mla)
    if m["E"] == 0:
        z = np.zeros(np.broadcast_shapes(np.shape(t), np.shape(p), np.shape(ep)))
        return z + mtp_sh, z + mtp_r
    one = expert_params(d, m["f_e"], mats)
    lps = np.ceil(m["L_moe"] / np.asarray(p, dtype=float))  # the largest stage (analytic.uneven)
    shared = lps * (m["n_sh"] * one + np.asarray(d, dtype=float) * m["E"]) / np.asarray(t, dtype=float)
    routed = lps * (m["E"] / np.asarray(ep, dtype=float)) * one
    return shared + mtp_sh, routed + mtp_r


def total_and_active_params(model) -> tuple[float, float]:
    """(total, active) parameters of the main model (embeddings and LM head included; a
    multi-token-prediction module apart: analytic.mla.mtp_params)."""
    from calib.analytic.mla import attention_proj_params

    d, L = float(model.d_model), float(model.n_layers)
    mats = 3.0 if model.mlp == "swiglu" else 2.0
    attn = float(attention_proj_params(model))  # (2 + 2 kv/a) d^2, or MLA's projections
    emb = float(model.vocab) * d * (1.0 if model.tied_embeddings else 2.0)
    m = terms(model)
    L_dense = L - m["L_moe"]
    dense = L * attn + L_dense * mats * d * float(model.ffn_size) + emb
    if m["E"] == 0:
        return dense, dense
    layer_total, layer_active, _ = layer_mlp_params(model, mats)
    return dense + m["L_moe"] * layer_total, dense + m["L_moe"] * layer_active


def layer_mlp_params(model, mats: float) -> tuple[float, float, float]:
    """(total, active, one routed expert's) MLP weights of one MoE layer -- routed and shared
    experts and the router -- or of one dense layer's MLP (no experts: its own, 0)."""
    d = float(model.d_model)
    m = terms(model)
    if m["E"] == 0:
        dense = mats * d * float(model.ffn_size)
        return dense, dense, 0.0
    one = float(expert_params(d, m["f_e"], mats))
    router = d * m["E"]
    return (m["E"] + m["n_sh"]) * one + router, (m["k"] + m["n_sh"]) * one + router, one


def forward_flops_per_token(model) -> float:
    """Forward matmul FLOPs per token: 2 x active matrix parameters (Kaplan et al. 2020 sec. 2.1;
    embedding lookup excluded, LM head included) + the attention core 4 s d per layer (QK^T
    and AV over the whole sequence, the convention of Narayanan et al. 2021 eq. 3)."""
    total, active = total_and_active_params(model)
    d = float(model.d_model)
    lookup = float(model.vocab) * d if not model.tied_embeddings else 0.0
    return 2.0 * (active - lookup) + 4.0 * float(model.seq_len) * d * float(model.n_layers)


# ---- per GPU, per MoE layer, per micro-batch -------------------------------------------
def tokens_per_gpu(b: ArrayLike, s: ArrayLike, cp: ArrayLike, t: ArrayLike) -> np.ndarray:
    """T = b s / (cp t): the tokens one GPU routes (sequence parallel over TP, CP shards)."""
    b, s, cp, t = (np.asarray(x, dtype=float) for x in (b, s, cp, t))
    return b * s / (cp * t)


def max_load_factor(T: ArrayLike, k: float, ep: ArrayLike) -> np.ndarray:
    """Expected load of the busiest of ``ep`` ranks over the mean, routing balanced.

    Each of the ep T k token-to-expert assignments of an EP group lands on a given rank
    with probability 1/ep, so a rank's load is Binomial(ep T k, 1/ep): mean T k, standard
    deviation sqrt(T k (1 - 1/ep)).  The expected largest of ep such loads is the mean plus
    z_ep deviations, z_ep = Phi^-1((ep - 0.375) / (ep + 0.25)) (Blom 1958, the expected
    maximum of ep normal samples): 1 + z_ep sqrt((1 - 1/ep) / (T k)).  Mixtral 8x7B, EP 8,
    4096 tokens per GPU, top-2: 1 + 1.434 x 0.01034 = 1.0148.
    """
    from scipy.special import ndtri

    ep = np.asarray(ep, dtype=float)
    Tk = np.maximum(np.asarray(T, dtype=float) * k, 1.0)
    z = ndtri((ep - 0.375) / (ep + 0.25))
    return 1.0 + np.where(ep > 1, z * np.sqrt(np.maximum(1.0 - 1.0 / ep, 0.0) / Tk), 0.0)


def load_factor(model, T: ArrayLike, ep: ArrayLike) -> np.ndarray:
    """The busiest EP rank's load over the mean: router_imbalance x :func:`max_load_factor`
    when dropless (1 at ep = 1: one rank holds every expert), 1 with a capacity factor
    (every expert is padded to its capacity).  Mixtral 8x7B, EP 8, 4096 tokens, top-2,
    router_imbalance 1.2: 1.2 x 1.0148 = 1.2178."""
    m = terms(model)
    if not m["E"] or model.capacity_factor:
        return np.ones(np.broadcast_shapes(np.shape(T), np.shape(ep)))
    floor = max_load_factor(T, m["k"], ep)  # 1 at ep = 1
    return np.where(np.asarray(ep) > 1, m["imb"] * floor, floor)


def routed_act_factor(model, ep: ArrayLike = 1.0) -> np.ndarray:
    """The busiest EP rank's routed copies kept for backward over the mean: router_imbalance
    when dropless and ep > 1, else 1 (the statistical floor is not charged to memory)."""
    m = terms(model)
    dropless = m["E"] and not model.capacity_factor
    return np.where(np.asarray(ep, dtype=float) > 1, m["imb"] if dropless else 1.0, 1.0)


def dropped_fraction(model) -> float:
    """With a capacity factor C, the busiest expert group's dropped tokens: 1 - C / r when
    router_imbalance r > C (0 otherwise, and 0 dropless)."""
    m = terms(model)
    cap = model.capacity_factor if m["E"] else None
    return max(0.0, 1.0 - float(cap) / m["imb"]) if cap else 0.0


def router_note(model) -> str:
    """One line on the router a MoE prediction assumes: the imbalance (labelled when it is the
    default) and, with a capacity factor, the tokens the busiest expert group drops."""
    r = terms(model)["imb"]
    text = f"router_imbalance {r:g}" + (" (stated default: a balanced router)" if r == 1.0 else " (given)")
    if not model.capacity_factor:
        return f"the busiest EP rank carries {text} x its statistical load (dropless)"
    out = f"capacity factor {model.capacity_factor:g} pads every expert; {text}"
    drop = dropped_fraction(model)
    if drop > 0:
        out += f"; the busiest expert group drops 1 - C/r = {drop:.1%} of its tokens (not a time)"
    return out


def dispatch_bytes(T: ArrayLike, k: float, d: ArrayLike, cap: float = 1.0, bytes_per_value: ArrayLike = 2.0):
    """The all-to-all buffer one GPU sends in one dispatch: C T k d values (nccl-tests size);
    (ep - 1) / ep of it leaves the GPU."""
    return cap * np.asarray(T, dtype=float) * k * np.asarray(d, dtype=float) * np.asarray(bytes_per_value)


def a2a_count(recompute_full: ArrayLike) -> np.ndarray:
    """All-to-alls per MoE layer and micro-batch: dispatch + combine forward, their two
    gradients backward, two more when full recompute re-runs the forward."""
    return np.where(np.asarray(recompute_full, dtype=bool), 6.0, 4.0)


def expert_gemm_flops(T, k, cap, ep, E, d, f_e) -> np.ndarray:
    """FLOPs of one routed expert's first matmul: 2 M d f_e with M = C ep T k / E tokens."""
    M = cap * np.asarray(ep, dtype=float) * np.asarray(T, dtype=float) * k / E
    return 2.0 * M * np.asarray(d, dtype=float) * f_e


def grouped_gemm(T, mo: dict, ep, d, mats, peak, hbm_tbps) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs of one GEMM of the GPU's routed rows, the grouping law's factor for its E / ep
    experts; calibrate.grouped_gemm): the up (d -> (mats - 1) f_e) and down (f_e -> d)
    projections' factors weighted by their FLOPs.  ``mo``: :func:`terms`."""
    from calib.calibrate.grouped_gemm import expert_factors

    local = mo["E"] / np.asarray(ep, dtype=float)
    x_all = local * expert_gemm_flops(T, mo["k"], mo["cap"], ep, mo["E"], d, mo["f_e"])
    rows = x_all / (2.0 * np.asarray(d, dtype=float) * mo["f_e"])
    up, down = expert_factors(local, rows, d, mo["f_e"], mats, np.asarray(peak, dtype=float) / 1e12, hbm_tbps)
    return x_all, ((mats - 1.0) * up + down) / mats


def layer_flops(model, T, t, mats, passes_fwd) -> dict[str, np.ndarray]:
    """Training FLOPs of one MoE layer's expert part on one GPU: routed (grouped GEMMs) and
    shared experts + router (TP-split dense GEMMs).  ``passes_fwd``: 3 (fwd + 2 bwd), + 1
    with full recompute."""
    m = terms(model)
    T = np.asarray(T, dtype=float)
    one = 2.0 * mats  # FLOPs per token per (d x f_e) weight pair
    routed = passes_fwd * m["cap"] * T * m["k"] * one * m["f_e"]
    d = np.asarray(model.d_model, dtype=float)
    shared = passes_fwd * T * (m["n_sh"] * one * m["f_e"] + 2.0 * m["E"]) * d  # T already / t
    return {"routed": routed * d, "shared": shared}


def activation_bytes_layer(model, T, d, mats, bytes_per_value=2.0, ep=1.0) -> np.ndarray:
    """Bytes one MoE layer keeps for backward on one GPU beyond attention: every routed copy
    keeps its permuted expert input (d, the fc1 weight-gradient operand), the MLP's
    intermediates (mats f_e: SwiGLU gate, up and product; GeLU input and output) and its
    expert output (d, for the probability-weighted combine's backward); on the busiest EP
    rank x :func:`routed_act_factor`."""
    m = terms(model)
    T = np.asarray(T, dtype=float)
    per_token = np.asarray(d, dtype=float) * 2.0 + mats * m["f_e"]
    routed = m["cap"] * T * m["k"] * per_token * routed_act_factor(model, ep)
    shared = T * m["n_sh"] * (np.asarray(d, dtype=float) + mats * m["f_e"])
    return bytes_per_value * (routed + shared)
