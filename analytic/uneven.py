"""Pipeline stages of unequal size: layers not divisible by the stages (126 over 16).

With L layers over p stages, r = L mod p stages hold ceil(L / p) layers and the others
floor(L / p).  The placement stated here (a default, as Megatron-LM's uneven
``--decoder-first/last-pipeline-num-layers`` leave it to the user): the extra layers go
to the first r stages, so the last stage -- which also runs the LM head -- holds
floor(L / p) when r > 0.  The embedding lookup on the first stage is a gather (no
matmul) and adds memory, not time: every stage is charged the embedding's parameters
(:func:`analytic.timemodel.stage_params`), the conservative bound.

In 1F1B the slowest stage sets the pace.  Per micro-batch, a full stage takes
n_max * t_layer and the last n_last * t_layer + t_head, so

    slowest = max(n_max * t_layer, n_last * t_layer + t_head)
            = n_max * t_layer + max(0, t_head - (n_max - n_last) * t_layer)

which :func:`analytic.bubble.pipeline_time_s` receives as a stage of n_max layers plus
the *excess* of the last stage (:func:`head_excess_s`).  When p divides L this is the
even model exactly (n_max = n_last = L / p, excess = t_head).  Memory and gradient
shards follow the largest stage (n_max layers).
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


def head_excess_s(head_s: ArrayLike, layer_s: ArrayLike, n_max: ArrayLike, n_last: ArrayLike) -> np.ndarray:
    """What the last stage (n_last layers + LM head) adds over a full stage of n_max layers."""
    head = np.asarray(head_s, dtype=float)
    gap = (np.asarray(n_max, dtype=float) - np.asarray(n_last, dtype=float)) * np.asarray(
        layer_s, dtype=float
    )
    return np.maximum(0.0, head - gap)
