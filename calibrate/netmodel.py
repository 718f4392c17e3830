"""The physical scale model behind eff_{g->n}: per-step latency over a fixed NIC bandwidth.

A pipelined ring collective over n GPUs takes

    t(n, S) = alpha_g + lambda * k * (n - g) + t_bw(g, S) * V(n) / V(g)

where ``alpha_g`` and ``t_bw(g, S)`` are the latency and bandwidth parts measured at the
base scale g, ``k`` the ring steps per rank (2 for all-reduce: reduce-scatter then
all-gather; 1 for all-gather, reduce-scatter and the n-1 peers of all-to-all),
``lambda`` the latency of one step (fitted across scales), and ``V`` the bytes each
node's NICs carry per byte of message: (n-1)/n for ring collectives (the nccl-tests bus
factor, so their bus bandwidth is the NIC bandwidth whatever n), and
gpus_per_node * (n - gpus_per_node) / n for all-to-all (everything leaving the node).

All-reduce can also run as NCCL's double binary tree, whose latency grows with the tree
depth log2(nodes) rather than with n, at a bandwidth ``tree_eff`` times the ring's
(NCCL's own tuner uses 0.9); NCCL's tuner picks the faster, so the model takes the
minimum.  At the measured scales (a few nodes) the ring always wins for large messages,
so ``tree_eff`` cannot be fitted from them: it is a fixed, documented constant.

eff_{g->n} is the ratio of the model's bus bandwidths at the reference message size.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import ArrayLike

from calib.core.collective_names import ALLREDUCE, ALLTOALL

FORM = "ring_tree"
#: NCCL's tuner: tree bus bandwidth = 0.9 x ring (src/graph/tuning.cc, "busBw*.9")
NCCL_TREE_EFF = 0.9


def steps_per_rank(collective: str) -> float:
    return 2.0 if collective == ALLREDUCE else 1.0


def nic_volume(collective: str, n: ArrayLike, gpus_per_node: float) -> np.ndarray:
    """Bytes each node's NICs carry per message byte, up to a constant factor."""
    n = np.asarray(n, dtype=float)
    if collective == ALLTOALL:
        return gpus_per_node * np.maximum(n - gpus_per_node, 0.0) / n
    return (n - 1.0) / n


def scaled_time_s(
    lat_s: ArrayLike, bw_s: ArrayLike, n: ArrayLike, g: float, p: Mapping[str, float]
) -> np.ndarray:
    """Time at n GPUs of a collective whose latency and bandwidth parts at g GPUs are given.

    ``p`` holds the form's parameters (see :func:`form_params`); arrays broadcast.
    """
    n = np.asarray(n, dtype=float)
    lat_s, bw_s = np.asarray(lat_s, dtype=float), np.asarray(bw_s, dtype=float)
    gpn, k, lam = p["gpus_per_node"], p["steps_per_rank"], p["lambda_s"]
    if p.get("nic_volume", 0.0) >= 0.5:
        vol = (np.maximum(n - gpn, 0.0) / n) / ((g - gpn) / g)
    else:
        vol = ((n - 1.0) / n) / ((g - 1.0) / g)
    t = lat_s + lam * k * (n - g) + bw_s * vol
    tree_eff = p.get("tree_eff", 0.0)
    if tree_eff > 0:
        depth = np.log2(np.maximum(n / gpn, 1.0)) - np.log2(max(g / gpn, 1.0))
        t_tree = lat_s + lam * k * gpn * depth + bw_s * vol / tree_eff
        t = np.minimum(t, t_tree)
    return t


def form_ring_tree(r: np.ndarray, p: Mapping[str, float]) -> np.ndarray:
    """eff_{g->n} at the reference size: busbw(n) / busbw(g), capped at 1."""
    g = p["g_gpus"]
    n = np.asarray(r, dtype=float) * g
    t_g = p["lat_ref_s"] + p["bw_time_ref_s"]
    t_n = scaled_time_s(p["lat_ref_s"], p["bw_time_ref_s"], n, g, p)
    f_ratio = ((n - 1.0) / n) / ((g - 1.0) / g)
    return np.minimum(1.0, f_ratio * t_g / t_n)


def algorithm_at(p: Mapping[str, float], n: ArrayLike) -> np.ndarray:
    """Which algorithm the model uses at the reference size: "ring" or "tree"."""
    g = p["g_gpus"]
    n = np.asarray(n, dtype=float)
    ring = dict(p, tree_eff=0.0)
    t_ring = scaled_time_s(p["lat_ref_s"], p["bw_time_ref_s"], n, g, ring)
    t_best = scaled_time_s(p["lat_ref_s"], p["bw_time_ref_s"], n, g, p)
    return np.where(t_best < t_ring * (1 - 1e-12), "tree", "ring")
