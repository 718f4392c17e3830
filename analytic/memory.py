"""Memory per GPU: model states under ZeRO and activations under TP/SP/PP/recompute.

Mixed-precision Adam keeps 16 bytes per parameter (Rajbhandari et al., ZeRO): fp16
weights (2) and gradients (2), fp32 master weights, momentum and variance (12).  Over a
data-parallel group of size d, ZeRO-1 shards the 12, ZeRO-2 also the gradients, ZeRO-3
everything:

    ZeRO-0  16 P        ZeRO-1  4 P + 12 P / d
    ZeRO-2  2 P + 14 P / d      ZeRO-3  16 P / d   (+ the gathered parameters in flight:
    FSDP two layers; DeepSpeed at most stage3_max_live_parameters, analytic.zero_overlap)

A gathered layer is the model's own (shape_terms.layer_params_gpu, the largest kind): its
attention projections ((2 + 2 kv/a) d^2, or MLA's low-rank ones) and MLP (mats d ffn), or a
MoE layer's E / ep local experts, shared experts and router -- 12 d^2 / t only for GPT's.

Activations: Korthikanti et al.'s bytes per layer, generalised to the layer's MLP width,
K/V heads and MLP kind (formulas.activation_bytes_layer; multi-head latent attention's own
tensors, analytic.mla.attention_kept_coeffs), for
the layers of one stage, times the micro-batches the first stage holds in flight under
1F1B, min(p, m), times (1 + (p - 1) / (p v)) with interleaving, at most m
(:func:`stages_in_flight`); full recompute adds one
layer's full activations (the layer being recomputed); a single-stage model also keeps
the fp32 logits of its micro-batch (inside ``activations`` and also given as ``logits``).

An out-of-memory verdict names the term that overflows (:func:`overflow_term`).
"""

from __future__ import annotations

import numpy as np
from calib.analytic import formulas as F
from calib.analytic.zero_overlap import live_gathered_params
from numpy.typing import ArrayLike

BYTES_WEIGHT, BYTES_GRAD, BYTES_OPTIMIZER = 2.0, 2.0, 12.0
LOGITS_BYTES = 4.0  # fp32 logits kept for the cross-entropy backward
GATHERED_LAYERS = 2.0  # ZeRO-3: the layer computing and the one being prefetched


def zero_states_bytes(
    params: ArrayLike, dp: ArrayLike, zero: ArrayLike
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, gradients, optimizer states) bytes per GPU for ``params`` per model replica."""
    P = np.asarray(params, dtype=float)
    d = np.asarray(dp, dtype=float)
    z = np.asarray(zero)
    weights = BYTES_WEIGHT * P / np.where(z == 3, d, 1.0)
    grads = BYTES_GRAD * P / np.where(z >= 2, d, 1.0)
    optim = BYTES_OPTIMIZER * P / np.where(z >= 1, d, 1.0)
    return weights, grads, optim


def activations_bytes(
    b: ArrayLike, s: ArrayLike, d: ArrayLike, a: ArrayLike, L: ArrayLike, V: ArrayLike,
    t: ArrayLike, p: ArrayLike, m: ArrayLike, v: ArrayLike,
    recompute: ArrayLike = F.NONE, seq_parallel: ArrayLike = False, flash: ArrayLike = False,
    logits: bool = True, shape: tuple = (4.0, 1.0, 2.0),
) -> np.ndarray:  # fmt: skip
    """Activation bytes on the first pipeline stage (the one holding the most); with
    ``logits`` the single-stage model's fp32 logits (:func:`logits_bytes`) are included.
    ``shape``: (ffn / d, kv / a, MLP matrices[, dropout[, MLA's kept coefficients]]) of the layer
    (GPT's by default; analytic.mla.attention_kept_coeffs)."""
    b, s, d, a, L, V, t, p, m, v = (np.asarray(x, dtype=float) for x in (b, s, d, a, L, V, t, p, m, v))
    rc = np.asarray(recompute)
    per_layer = F.activation_bytes_layer(b, s, d, a, t, seq_parallel, rc, flash, *shape)
    acts = per_layer * np.ceil(L / p) * stages_in_flight(p, m, v)  # the largest stage (analytic.uneven)
    acts = acts + np.where(
        rc == F.FULL, F.activation_bytes_layer(b, s, d, a, t, seq_parallel, F.NONE, flash, *shape), 0.0
    )
    return acts + (logits_bytes(b, s, V, t, p) if logits else 0.0)


def stages_in_flight(p: ArrayLike, m: ArrayLike, v: ArrayLike = 1) -> np.ndarray:
    """Micro-batches' worth of its stage's activations the first pipeline stage holds at its
    peak: min(p, m) under 1F1B; p + (p - 1) / v with interleaving (Megatron's warm-up of
    2 (p - 1) + (v - 1) p forwards plus the one in flight, each a chunk of 1 / v of the
    stage; Narayanan et al. SC21 sec. 2.2.2) -- but never more than the iteration's m
    micro-batches: with m = p Megatron runs every forward first (``all_warmup_microbatches``
    in megatron/core/pipeline_parallel/schedules.py) and holds exactly m."""
    p, m, v = (np.asarray(x, dtype=float) for x in (p, m, v))
    return np.minimum(np.minimum(p, m) * np.where(v > 1, 1.0 + (p - 1.0) / (p * v), 1.0), m)


def logits_bytes(b: ArrayLike, s: ArrayLike, V: ArrayLike, t: ArrayLike, p: ArrayLike) -> np.ndarray:
    """fp32 logits of one micro-batch kept for the cross-entropy backward (single-stage models)."""
    b, s, V, t, p = (np.asarray(x, dtype=float) for x in (b, s, V, t, p))
    return np.where(p == 1, LOGITS_BYTES * b * s * V / t, 0.0)


def gathered_bytes(
    layer_params: ArrayLike, zero: ArrayLike, deepspeed_live: tuple | None = None
) -> np.ndarray:
    """ZeRO-3's gathered fp16 parameters in flight per GPU (0 below ZeRO-3): GATHERED_LAYERS
    layers of ``layer_params`` each (shape_terms.layer_params_gpu), or with ``deepspeed_live``
    = (largest matrix, is DeepSpeed) DeepSpeed's live-parameter cap
    (:func:`analytic.zero_overlap.live_gathered_params`)."""
    two = GATHERED_LAYERS * np.asarray(layer_params, dtype=float)
    live = two if deepspeed_live is None else live_gathered_params(two, *deepspeed_live)
    return np.where(np.asarray(zero) == 3, BYTES_WEIGHT * live, 0.0)


def memory_per_gpu(
    params: ArrayLike, layer_params: ArrayLike, dp: ArrayLike, zero: ArrayLike,
    activations: ArrayLike, reserve_bytes: float, logits: ArrayLike | None = None,
    deepspeed_live: tuple | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Weights, gradients, optimizer states, activations (and, given separately, logits) and
    their total (with the reserve).  ZeRO-3 also holds the gathered layers of ``layer_params``
    weights each on this GPU (:func:`gathered_bytes`; GPT: 12 d^2 / t)."""
    weights, grads, optim = zero_states_bytes(params, dp, zero)
    weights = weights + gathered_bytes(layer_params, zero, deepspeed_live)
    lg = np.asarray(0.0 if logits is None else logits, dtype=float)
    acts = np.asarray(activations, dtype=float) + lg
    out = {
        "mem_weights_bytes": weights,
        "mem_grads_bytes": grads,
        "mem_optimizer_bytes": optim,
        "mem_activations_bytes": acts,  # with the logits, which are also given on their own
        "mem_total_bytes": weights + grads + optim + acts + reserve_bytes,
    }
    if logits is not None:
        out["mem_logits_bytes"] = lg
    return out


#: memory terms a verdict can name, in the order of the output columns
MEMORY_TERMS = ("weights", "grads", "optimizer", "activations", "logits")


def overflow_term(mem: dict, capacity_bytes: float) -> np.ndarray:
    """Per strategy, the term that overflows device memory ('' where everything fits).

    The named term is the largest of :data:`MEMORY_TERMS` present in ``mem`` (the one whose
    reduction -- sharding, recompute, smaller micro-batch -- buys the most); the caller
    prints it with the total and the capacity.
    """
    total = np.asarray(mem["mem_total_bytes"], dtype=float) + np.asarray(mem.get("mem_reserve_bytes", 0.0))
    terms = {
        t: np.asarray(mem[f"mem_{t}_bytes"], dtype=float) for t in MEMORY_TERMS if f"mem_{t}_bytes" in mem
    }
    if "logits" in terms:  # activations include the logits: compare the rest with them
        terms["activations"] = terms["activations"] - terms["logits"]
    names = list(terms)
    shape = np.broadcast_shapes(total.shape, *(v.shape for v in terms.values()))
    vals = np.stack([np.broadcast_to(v, shape) for v in terms.values()])
    largest = np.asarray(names, dtype=object)[np.argmax(vals, axis=0)]
    return np.where(np.broadcast_to(total, shape) > capacity_bytes, largest, "").astype(str)
