"""Pipeline stages of unequal size: layers not divisible by the stages (126 over 16).

With L layers over p stages, r = L mod p stages hold ceil(L / p) layers and the others
floor(L / p).  The placement stated here (a default, as Megatron-LM's uneven
``--decoder-first/last-pipeline-num-layers`` leave it to the user): the extra layers go
to the first r stages, so the last stage -- which also runs the LM head -- holds
floor(L / p) when r > 0.  The embedding lookup on the first stage is a gather (no
matmul) and adds memory, not time: every stage is charged the embedding's parameters
(:func:`analytic.shape_terms.stage_params`), the conservative bound.

In 1F1B the slowest stage sets the pace.  Per micro-batch, a full stage takes
n_max * t_layer and the last n_last * t_layer + t_head, so

    slowest = max(n_max * t_layer, n_last * t_layer + t_head)
            = n_max * t_layer + max(0, t_head - (n_max - n_last) * t_layer)

which :func:`analytic.bubble.pipeline_time_s` receives as a stage of n_max layers plus
the *excess* of the last stage (:func:`head_excess_s`).  When p divides L this is the
even model exactly (n_max = n_last = L / p, excess = t_head).  Memory and gradient
shards follow the largest stage (n_max layers).

**Interleaved** (v virtual stages per GPU, p v in all; Llama 3, Dubey et al. 2024
arXiv:2407.21783 sec. 3.3.2: 126 layers on 16 stages, one layer taken off the first and
the last stage, interleaved).  The same rule on the p v virtual stages: with
r = L mod p v the first r virtual stages hold c = ceil(L / p v) layers, the others
c - 1 (when r > 0).  Virtual stage g runs on GPU g mod p, so GPU q holds
(c - 1) v + floor(r / p) + [q < r mod p] layers: the busiest GPU (q = 0) ceil(L / p)
and the last floor(L / p) -- the per-GPU counts of the non-interleaved rule, so the
steady state (m micro-batches through the busiest GPU, plus the head's excess on the
last) and the memory are unchanged.  What interleaving changes is the bubble: during
warm-up and cool-down a micro-batch crosses the p GPUs one virtual stage at a time,
and the **slowest virtual stage** (c layers) sets the pace of each of those p - 1 hops:

    bubble = (p - 1) (c t_layer + 2 t_p2p)       (F + B of one virtual stage)

which is (p - 1) t_stage / v when p v divides L (Narayanan et al. SC21 sec. 2.2.2).
Llama 3 405B, L = 126, p = 16, v = 8: r = 126, c = 1 -- the first 126 virtual stages
hold one layer, the last two none (the paper puts its two empty chunks at the two ends:
embedding only and head only; the time model charges the embedding nothing and lets the
head overlap the lighter last GPU, so both placements give the same times); GPU 0 holds
8 layers, GPU 15 7 + the LM head, and each warm-up hop is one layer.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def stage_layers(n_layers: ArrayLike, pp: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """(layers of the largest stage, layers of the last stage) for L layers over p stages."""
    L = np.asarray(n_layers, dtype=float)
    p = np.asarray(pp, dtype=float)
    n_max = np.ceil(L / p)
    n_last = np.where(np.mod(L, p) > 0, np.floor(L / p), L / p)
    return n_max, n_last


def head_excess_s(
    head_s: ArrayLike, layer_s: ArrayLike, n_max: ArrayLike, n_last: ArrayLike, schedule: ArrayLike = 0
) -> np.ndarray:
    """What the last stage (n_last layers + LM head) adds over a full stage of n_max layers,
    per micro-batch.  DualPipe (DeepSeek-V3 sec. 3.2.1, Fig. 5) puts stages i and p - 1 - i
    on GPU i and runs each direction's half of the micro-batches: the last stage shares a GPU
    with the first, so per micro-batch the pace is (first + last) / 2 against a full stage and
    the excess is halved."""
    from calib.analytic.bubble import DUALPIPE

    head = np.asarray(head_s, dtype=float)
    gap = (np.asarray(n_max, dtype=float) - np.asarray(n_last, dtype=float)) * np.asarray(
        layer_s, dtype=float
    )
    excess = np.maximum(0.0, head - gap)
    return np.where(np.asarray(schedule) == DUALPIPE, 0.5 * excess, excess)


def chunk_layers(n_layers: ArrayLike, pp: ArrayLike, interleave: ArrayLike) -> np.ndarray:
    """Layers of the largest virtual stage: ceil(L / (p v)) (module docstring)."""
    L, p, v = (np.asarray(x, dtype=float) for x in (n_layers, pp, interleave))
    return np.ceil(L / (p * v))
