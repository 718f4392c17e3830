"""Context parallelism: ring attention and Ulysses all-to-all over a CP group of c GPUs.

Each of the c GPUs holds s / c tokens of every sequence (Megatron-Core context
parallelism; the linear layers, their activations and FLOPs simply shrink by c).  The
attention core needs every key and value:

* **ring** (Liu et al. 2023, "Ring Attention with Blockwise Transformers",
  arXiv:2310.01889 sec. 3; Megatron-Core's P2P CP): c - 1 steps; in each a GPU sends its
  current K and V block, 2 b (s / c) d_kv values (d_kv = d kv/a / t per TP rank), to the
  next GPU while it computes attention on the block it holds.  Forward c - 1 sends;
  backward sends K, V and their gradients dK, dV (twice the bytes).  The send of a step
  overlaps that step's block compute (a modelled fraction, see :mod:`analytic.overlap`).
  Causal load balance: the sequence is cut into 2c chunks and GPU i takes chunks i and
  2c - 1 - i, so every GPU computes 1/c of the causal attention; without it the last GPU
  computes (2c - 1) / c^2 of it (the ratio to 1/c is the ``imbalance`` below).
* **ulysses** (Jacobs et al. 2023, "DeepSpeed Ulysses", arXiv:2309.14509 sec. 3.1-3.2):
  an all-to-all turns the sequence-sharded Q, K, V into head-sharded ones and another
  turns the attention output back; the aggregate volume per GPU is 4 N h / P for
  multi-head attention (N = b s tokens, h = d, P = c), (2 + 2 kv/a) N h / P with
  grouped-query attention; backward the same.  Needs a / t divisible by c.
* **allgather** (Llama 3, Dubey et al. 2024 arXiv:2407.21783 sec. 3.3.2: "all-gather
  based" CP): the K and V of the whole sequence are all-gathered (2 b s d_kv values per
  GPU after the gather) before the local queries' attention; backward reduce-scatters dK
  and dV.  With grouped-query attention K and V are small, which is why Llama 3 chose it;
  not overlapped.

**Multi-head latent attention** (analytic.mla): what crosses the CP group is the up-projected
K (a h_qk per token: the nope part from kv_b and the shared RoPE key broadcast to every head)
and V (a h_v), not the kv latent: Megatron-Core's MLASelfAttention
(megatron/core/transformer/multi_latent_attention.py, ``get_query_key_value_tensors``)
up-projects each CP rank's own tokens through ``linear_kv_up_proj`` and hands per-head query,
key and value to the context-parallel core attention (Transformer Engine), which exchanges K
and V as for any attention.  DeepSeek-V3 (128 heads of 192 and 128): 40,960 values per token
where 2 d kv/a said 14,336.  Ulysses' all-to-alls carry q, k, v (a (2 h_qk + h_v)) and the
output (a h_v); Llama 3's all-gather the same K and V.

Attention FLOPs of one layer, forward, whole sequence: 4 b s^2 d (QK^T and AV, the
convention of Narayanan et al. 2021 eq. 3; a causal kernel computes about half,
``causal_fraction``).  Per GPU under CP: 4 b s^2 d / (c t) with load balance.  A fused
(flash) kernel's backward does 2.5x its forward's matmul work, a standard one 2x
(:data:`FLASH_BWD_OVER_FWD`); the time model counts that, the reported model FLOPs do not.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

RING, ULYSSES, ALLGATHER_KV = 0, 1, 2

#: FlashAttention keeps no s x s probabilities, so its backward recomputes the scores
#: S = Q K^T from the saved softmax statistics: five matmuls (S, dP = dO V^T, dV = P^T dO,
#: dQ = dS K, dK = dS^T Q) against the forward's two -- 2.5x the forward, where a backward
#: from stored probabilities does four (2x).  Dao et al. 2022, arXiv:2205.14135 Algorithm 4
#: (backward: "Compute S_ij = Q_i K_j^T"); Dao 2023, arXiv:2307.08691 sec. 3.1.2.
FLASH_BWD_OVER_FWD = 2.5
CP_KINDS = ("ring", "ulysses", "allgather")


def cp_kind_code(name: str) -> int:
    from calib.core.errors import InputError

    try:
        return CP_KINDS.index(name.strip().lower())
    except ValueError:
        raise InputError("cp_kind", f"unknown context-parallel kind '{name}' (ring, ulysses)") from None


def attention_flops(b: ArrayLike, s: ArrayLike, d: ArrayLike, causal: bool = False) -> np.ndarray:
    """Forward attention-core FLOPs of one layer over whole sequences: 4 b s^2 d (x (s+1)/(2s) causal)."""
    b, s, d = (np.asarray(x, dtype=float) for x in (b, s, d))
    full = 4.0 * b * s * s * d
    return full * (s + 1.0) / (2.0 * s) if causal else full


def flash_backward_extra_flops(attn_fwd: ArrayLike, flash: ArrayLike) -> np.ndarray:
    """Matmul FLOPs a fused attention backward adds to the standard 2x forward: its
    recomputed scores, (FLASH_BWD_OVER_FWD - 2) x the forward where ``flash``."""
    return np.where(
        np.asarray(flash, dtype=bool), (FLASH_BWD_OVER_FWD - 2.0) * np.asarray(attn_fwd, dtype=float), 0.0
    )


def causal_imbalance(cp: ArrayLike, balanced: bool = True) -> np.ndarray:
    """Busiest GPU's causal attention work over the mean (1/c): 1 balanced, (2c - 1)/c naive."""
    c = np.asarray(cp, dtype=float)
    return np.ones_like(c) if balanced else (2.0 * c - 1.0) / c


def attention_flops_per_gpu(b, s, d, cp, t) -> np.ndarray:
    """Forward attention FLOPs one GPU computes under load-balanced CP: 4 b s^2 d / (c t)."""
    return attention_flops(b, s, d) / (np.asarray(cp, dtype=float) * np.asarray(t, dtype=float))


def ring_step_bytes(b, s, d, kv_frac, cp, t, bytes_per_value=2.0, widths=None) -> np.ndarray:
    """Bytes one GPU sends per ring step in forward: K and V of its s / c tokens.  ``widths``:
    (q, k, v, attention output) values per token of other heads (MLA, module docstring)."""
    b, s, d, kv_frac, cp, t = (np.asarray(x, dtype=float) for x in (b, s, d, kv_frac, cp, t))
    if widths is not None:
        return b * (s / cp) * (widths[1] + widths[2]) / t * bytes_per_value
    return 2.0 * b * (s / cp) * d * kv_frac / t * bytes_per_value


def ring_bytes_layer(
    b, s, d, kv_frac, cp, t, recompute_full=False, bytes_per_value=2.0, widths=None
) -> np.ndarray:
    """Bytes one GPU sends per layer and micro-batch: (c - 1) steps forward, 2 (c - 1)
    backward (K, V and dK, dV), (c - 1) more with full recompute."""
    c = np.asarray(cp, dtype=float)
    steps = (c - 1.0) * np.where(np.asarray(recompute_full, dtype=bool), 4.0, 3.0)
    return steps * ring_step_bytes(b, s, d, kv_frac, cp, t, bytes_per_value, widths)


def ulysses_buffer_bytes(b, s, d, kv_frac, cp, t, bytes_per_value=2.0, widths=None) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(Q K V all-to-all buffer, output all-to-all buffer) per GPU, forward, one layer:
    (1 + 2 kv/a) b (s / c) d / t and b (s / c) d / t values; with ``widths``
    (:func:`ring_step_bytes`) (q + k + v) b (s / c) / t and o b (s / c) / t."""
    b, s, d, kv_frac, cp, t = (np.asarray(x, dtype=float) for x in (b, s, d, kv_frac, cp, t))
    if widths is not None:
        tok = b * (s / cp) / t * bytes_per_value
        return (widths[0] + widths[1] + widths[2]) * tok, widths[3] * tok
    tok = b * (s / cp) * d / t * bytes_per_value
    return (1.0 + 2.0 * kv_frac) * tok, tok


def allgather_kv_bytes(b, s, d, kv_frac, t, bytes_per_value=2.0, widths=None) -> np.ndarray:
    """All-gather buffer (nccl-tests size: the gathered output) of K and V per layer and GPU:
    2 b s d kv/a / t values (with ``widths``, :func:`ring_step_bytes`: b s (k + v) / t); each
    GPU contributes 1/c of it."""
    b, s, d, kv_frac, t = (np.asarray(x, dtype=float) for x in (b, s, d, kv_frac, t))
    if widths is not None:
        return b * s * (widths[1] + widths[2]) / t * bytes_per_value
    return 2.0 * b * s * d * kv_frac / t * bytes_per_value


def ulysses_volume_elements(N, h, P, kv_frac=1.0) -> np.ndarray:
    """The paper's aggregate all-to-all volume per GPU, forward, one layer: (2 + 2 kv/a) N h / P
    (4 N h / P for multi-head attention)."""
    N, h, P, kv_frac = (np.asarray(x, dtype=float) for x in (N, h, P, kv_frac))
    return (2.0 + 2.0 * kv_frac) * N * h / P
