"""2D tensor parallelism (seed 002, NERSC): communication volumes against 1D TP, and the
science-transformer regime (long sequences, attention-dominated FLOPs).

Seed 002's tables, per layer and forward pass, for activations X: (b, seq, e) (batch, sequence,
embedding), h heads, MLP width f, in elements (``Vol`` column = the collective's buffer):

* 1D TP over n_t GPUs (Megatron with sequence parallelism): AG b seq e before attention and
  MLP, RS b seq e after them -- 4 collectives of b seq e in the n_t group.
* 2D TP over an n1 x n2 grid (heads / MLP columns over n1, sequence over n2): AG and RS of
  b (seq/n2) e in the n1 group (4 of them), and AG of K and V, b seq e / n1 each, in the n2 group.
* 2D TP with SUMMA: LN all-reduces of b (seq/n2) e (2, n1 group), the projections as SUMMA
  broadcasts V1 = b seq e / n2 + e^2 / n1 (Q), V2 = b seq e / n2 + e f / n1 (MLP up),
  V3 = b seq f / n2 + f e / n1 (MLP down), K/V all-gathers b seq e / n1 (n2 group) and the W_P
  reduce-scatter b (seq/n2) e.  V2 and V3 are written by analogy with V1 (the seed's table names
  them without formulas).

Per-GPU traffic of a ring collective of buffer V over n ranks: (n - 1) / n V for AG / RS,
2 (n - 1) / n V for AR; a SUMMA broadcast panel total V reaches every rank once: (n - 1) / n V.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

BYTES = 2.0  # bf16
KIND_2D, KIND_SUMMA = 0, 1
KINDS = ("2d", "summa")


def _ring(n):
    n = np.asarray(n, dtype=float)
    return (n - 1.0) / n


def traffic_1d(b, seq, e, nt) -> np.ndarray:
    """Per-GPU bytes of 1D TP per layer (forward): 4 AG/RS of b seq e."""
    b, seq, e = (np.asarray(x, dtype=float) for x in (b, seq, e))
    return BYTES * 4.0 * b * seq * e * _ring(nt)


def traffic_2d(b, seq, e, n1, n2) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU bytes of 2D TP per layer (forward): (in the n1 group, in the n2 group)."""
    b, seq, e, n1, n2 = (np.asarray(x, dtype=float) for x in (b, seq, e, n1, n2))
    return BYTES * 4.0 * b * seq / n2 * e * _ring(n1), BYTES * 2.0 * b * seq * e / n1 * _ring(n2)


def traffic_summa(b, seq, e, f, n1, n2) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU bytes of 2D TP with SUMMA per layer (forward): (n1 group, n2 group).

    Row broadcasts of activation panels travel in the n1 group, column broadcasts of weight
    panels in the n2 group (SUMMA: A_i^k along process rows, B_j^k along columns).
    """
    b, seq, e, f, n1, n2 = (np.asarray(x, dtype=float) for x in (b, seq, e, f, n1, n2))
    act = 2.0 * 2.0 * b * seq / n2 * e * _ring(n1)  # LN all-reduces
    act += (b * seq * e / n2 + b * seq * e / n2 + b * seq * f / n2) * _ring(n1)  # SUMMA activation panels
    act += b * seq / n2 * e * _ring(n1)  # W_P reduce-scatter
    wts = (e * e / n1 + e * f / n1 + f * e / n1) * _ring(n2)  # SUMMA weight panels
    wts += 2.0 * b * seq * e / n1 * _ring(n2)  # K, V all-gathers
    return BYTES * act, BYTES * wts


def time_1d(b, seq, e, nt, bw_gbps) -> np.ndarray:
    return traffic_1d(b, seq, e, nt) / (np.asarray(bw_gbps, dtype=float) * 1e9)


def time_2d(b, seq, e, n1, n2, bw1_gbps, bw2_gbps) -> np.ndarray:
    t1, t2 = traffic_2d(b, seq, e, n1, n2)
    return t1 / (np.asarray(bw1_gbps, dtype=float) * 1e9) + t2 / (np.asarray(bw2_gbps, dtype=float) * 1e9)


def best_grid(b, seq, e, n: int, bw_in_gbps: float, bw_out_gbps: float, domain: int) -> dict:
    """The fastest n1 x n2 = n factorisation (n1 inside the NVLink domain when it fits),
    against 1D TP over n (its bandwidth: inside the domain if n <= domain)."""
    n1 = np.array([k for k in range(1, n + 1) if n % k == 0], dtype=float)
    n2 = n / n1
    bw1 = np.where(n1 <= domain, bw_in_gbps, bw_out_gbps)
    bw2 = np.where(n1 * n2 <= domain, bw_in_gbps, bw_out_gbps)
    t = time_2d(b, seq, e, n1, n2, bw1, bw2)
    k = int(np.argmin(t))
    t1 = float(time_1d(b, seq, e, n, bw_in_gbps if n <= domain else bw_out_gbps))
    return {
        "n1": int(n1[k]),
        "n2": int(n2[k]),
        "time_2d_s": float(t[k]),
        "time_1d_s": t1,
        "speedup": t1 / float(t[k]),
    }


# ---- 2D TP as a strategy axis: collectives of one layer's forward pass ------------------
def collectives(b, seq, e, f, kv_frac, n1, n2, kind) -> list[tuple[str, np.ndarray, str]]:
    """(collective, buffer bytes, group 'r' = the n1 row group or 'c' = the n2 column group)
    of one layer's forward pass -- the tables above as collectives the calibration can time.

    The sum over them of ring factor x buffer is :func:`traffic_2d` / :func:`traffic_summa`
    (with ``kv_frac`` = 1: grouped-query attention scales the K, V gathers by kv heads / heads).
    SUMMA's broadcast panels are timed as all-gathers (each rank receives (n - 1) / n of the panel).
    """
    b, seq, e, f, kv, n1, n2 = (np.asarray(x, dtype=float) for x in (b, seq, e, f, kv_frac, n1, n2))
    act = BYTES * b * seq / n2 * e  # b (seq / n2) e
    kvg = BYTES * b * seq * e * kv / n1  # one gathered K or V
    if kind == KIND_SUMMA:
        panels = BYTES * (2.0 * b * seq * e + b * seq * f) / n2  # V1, V2, V3 activation panels
        weights = BYTES * (e * e + 2.0 * e * f) / n1  # V1, V2, V3 weight panels
        return [("allreduce", 2.0 * act, "r"), ("allgather", panels, "r"), ("reducescatter", act, "r"),
                ("allgather", weights, "c"), ("allgather", 2.0 * kvg, "c")]  # fmt: skip
    return [("allgather", 2.0 * act, "r"), ("reducescatter", 2.0 * act, "r"), ("allgather", 2.0 * kvg, "c")]


def weight_split(tp, tp_c, kind) -> np.ndarray:
    """GPUs one layer's weights are split over: n1 = tp / tp_c for the 2D table (weights
    replicated over the sequence group n2), all tp for SUMMA and 1D."""
    tp, tp_c = np.asarray(tp, dtype=float), np.asarray(tp_c, dtype=float)
    return np.where((np.asarray(kind) == KIND_2D) & (tp_c > 1), tp / tp_c, tp)


def comm_times_2d(cal, gpn, st, b, s_loc, d, ffn, kv_frac, params_bytes) -> dict[str, np.ndarray]:
    """Per-layer TP seconds of 2D / SUMMA grids (tp = tp_r x tp_c, rows innermost), as the time
    model's ``tp_ag_s`` / ``tp_rs_s`` (each a quarter of the forward pass: the model charges
    4 (AG + RS) per layer for forward + backward, the backward mirroring the forward), and
    ``tp2d_grad_s``: the all-reduce of the weight gradients over the n2 group where the 2D
    table replicates the weights (once per iteration, not overlapped -- a stated simplification)."""
    from calib.analytic.comm import group_time_s, members_per_node

    tp, tc = st.tp.astype(float), st.tp_c.astype(float)
    n1, n2 = tp / tc, tc
    k1, k2 = members_per_node(n1, 1, gpn), members_per_node(n2, n1, gpn)
    kind = np.asarray(st.tp2d_kind)
    fwd = 0.0
    for k in (KIND_2D, KIND_SUMMA):
        if not np.any(kind == k):
            continue
        part = 0.0
        for coll, nbytes, grp in collectives(b, s_loc, d, ffn, kv_frac, n1, n2, k):
            n, kk = (n1, k1) if grp == "r" else (n2, k2)
            part = part + np.where(n > 1, group_time_s(cal, coll, nbytes, np.maximum(n, 2.0), kk), 0.0)
        fwd = np.where(kind == k, part, fwd)
    grad = group_time_s(cal, "allreduce", params_bytes, np.maximum(n2, 2.0), k2)
    grad = np.where((kind == KIND_2D) & (n2 > 1), grad, 0.0)
    return {"tp_ag_s": fwd / 4.0, "tp_rs_s": fwd / 4.0, "tp2d_grad_s": grad}


# ---- the science-transformer regime --------------------------------------------------
def attention_flop_share(seq: ArrayLike, e: ArrayLike) -> np.ndarray:
    """Share of a layer's FLOPs in the score and context matmuls: 4 b seq^2 e of 24 b seq e^2 + 4 b seq^2 e."""
    seq, e = np.asarray(seq, dtype=float), np.asarray(e, dtype=float)
    return 4.0 * seq * seq * e / (24.0 * seq * e * e + 4.0 * seq * seq * e)


def flops_per_token(params: ArrayLike, layers: ArrayLike, seq: ArrayLike, e: ArrayLike) -> np.ndarray:
    """Training FLOPs per token: 6 P + 12 L seq e (the attention scores, forward and backward)."""
    P, L, seq, e = (np.asarray(x, dtype=float) for x in (params, layers, seq, e))
    return 6.0 * P + 12.0 * L * seq * e


def min_model_parallel(b, seq, e, layers, hbm_gb: float, bytes_per_value: float = 34.0) -> np.ndarray:
    """Smallest model-parallel group that holds one sample's activations (Korthikanti's 34 b seq e
    bytes per layer with sequence parallelism and flash attention; 1F1B keeps all layers' worth)."""
    b, seq, e, L = (np.asarray(x, dtype=float) for x in (b, seq, e, layers))
    return np.ceil(bytes_per_value * b * seq * e * L / (hbm_gb * 1e9))
