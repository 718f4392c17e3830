"""Closed-form transformer counts: parameters, FLOPs, activation bytes.

All functions broadcast over numpy arrays (the search passes whole strategy grids).
Notation as in seed 004: hidden d, layers l, heads a, sequence s, micro-batch b,
vocabulary V, tensor-parallel size t.

* parameters          P = 12 l d^2                       (seed 004)
                      exact: 12 l d^2 + 13 l d + (V + s) d  (Narayanan et al. SC21 sec. 5.1)
* training FLOPs      b (72 s d^2 + 12 s^2 d) l           (seed 004; = 3 x forward)
  LM head             + 6 b s d V                          (Narayanan et al. eq. 3)
  full recompute      one more forward: x 4/3 on the layers (eq. 3's 96 = 4 x 24)
  selective recompute one more attention-core forward: + 4 b s^2 d l (Korthikanti et al.)
* activations/layer   s b d (34 + 5 a s / d) bytes         (Korthikanti et al. eq. 1;
                      seed 004's b(34 s d + 5 a s^2) l)
  with TP t           s b d (10 + 24/t + 5 a s/(d t))      (eq. 2)
  TP + SP             s b d (34 + 5 a s / d) / t           (eq. 4)
  selective           drops the 5 a s / d term (sec. 4.2)
  full recompute      2 s b d (the layer input only; / t with SP) (sec. 4.3)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

NONE, SELECTIVE, FULL, OP = 0, 1, 2, 3
#: none; selective (Korthikanti: the attention core); full; op (torchtitan's op-level
#: selective AC: matmul and attention outputs saved except every second matmul)
RECOMPUTE_NAMES = ("none", "selective", "full", "op")
BYTES_PER_VALUE = 2  # fp16 / bf16 activations and gradients


def recompute_code(name: str) -> int:
    from calib.core.errors import InputError

    try:
        return RECOMPUTE_NAMES.index(name.strip().lower())
    except ValueError:
        raise InputError(
            "recompute", f"unknown recompute mode '{name}' (none, selective, full, op)"
        ) from None


def attention_recomputed(recompute: ArrayLike) -> np.ndarray:
    """Whether the attention core's forward runs again in backward: selective and full
    recompute (op-level SAC saves the attention output)."""
    rc = np.asarray(recompute)
    return (rc == SELECTIVE) | (rc == FULL)


def op_sac_recompute_flops(b: ArrayLike, s: ArrayLike, d: ArrayLike, ffn: ArrayLike | None = None,
                           kv_frac: ArrayLike = 1.0, attn_op: tuple | None = None, mats: ArrayLike = 2.0) -> np.ndarray:  # fmt: skip
    """Forward FLOPs op-level SAC re-runs per layer: every second matmul of the block
    (torchtitan ``_custom_policy``: "Saves output of all compute ops, except every second
    mm"; order wq, wk, wv, wo, w1, [w3,] w2), i.e. wk, wo and the MLP's second matrix:
    2 b s (d^2 kv/a + d^2 + d f).  ``attn_op``: (re-run weights, kept bytes per s b d, matmul
    count) of other attention projections (analytic.mla.op_sac_attention); after an odd count
    the MLP's first matmul is an even one: w1 and w2 re-run with SwiGLU, w1 with GeLU,
    2 b s (re-run weights + (mats - 1) d f)."""
    b, s, d = (np.asarray(x, dtype=float) for x in (b, s, d))
    f = 4.0 * d if ffn is None else np.asarray(ffn, dtype=float)
    if attn_op is not None:
        mlp = (np.asarray(mats, dtype=float) - 1.0) if attn_op[2] % 2 else 1.0
        return 2.0 * b * s * (attn_op[0] + mlp * d * f)
    return 2.0 * b * s * (d * d * np.asarray(kv_frac, dtype=float) + d * d + d * f)


def op_sac_kept_coeff(ffn_over_d: ArrayLike, kv_frac: ArrayLike, mats: ArrayLike, attn_op: tuple | None = None) -> np.ndarray:  # fmt: skip
    """Bytes per s b d op-level SAC keeps per layer: the block input, wq's and wv's outputs
    (1 + kv/a), the attention output, w1's output (f/d) and, with SwiGLU, w2's (the saved
    matmuls are the odd ones of wq, wk, wv, wo, w1, [w3,] w2), 2 bytes each.  ``attn_op``
    (:func:`op_sac_recompute_flops`): the block input + its attention bytes + after an odd
    count w3's output (f/d) with SwiGLU, w2's (1) with GeLU."""
    f, kv, mt = (np.asarray(x, dtype=float) for x in (ffn_over_d, kv_frac, mats))
    if attn_op is not None:
        mlp = np.where(mt >= 3.0, f, 1.0) if attn_op[2] % 2 else f + np.where(mt >= 3.0, 1.0, 0.0)
        return 2.0 * (1.0 + mlp) + attn_op[1]
    return 2.0 * (1.0 + 1.0 + kv + 1.0 + f + np.where(mt >= 3.0, 1.0, 0.0))


# ---- parameters ----------------------------------------------------------------------
def params_layers(d: ArrayLike, L: ArrayLike) -> np.ndarray:
    """12 l d^2: the transformer blocks' weights (seed 004's P)."""
    d = np.asarray(d, dtype=float)
    return 12.0 * np.asarray(L, dtype=float) * d * d


def params_total(
    d: ArrayLike, L: ArrayLike, V: ArrayLike = 0, s: ArrayLike = 0, exact: bool = False
) -> np.ndarray:
    """P = 12 l d^2 + V d; with ``exact`` also biases/layer norms 13 l d and positions s d."""
    d = np.asarray(d, dtype=float)
    p = params_layers(d, L) + np.asarray(V, dtype=float) * d
    if exact:
        p = p + 13.0 * np.asarray(L, dtype=float) * d + np.asarray(s, dtype=float) * d
    return p


def attention_matrix_params(d: ArrayLike, kv_frac: ArrayLike = 1.0) -> np.ndarray:
    """Weights of one layer's attention projections with full-rank heads of d / a:
    Q and O d^2 each, K and V d^2 kv/a each, (2 + 2 kv/a) d^2."""
    d = np.asarray(d, dtype=float)
    return (2.0 + 2.0 * np.asarray(kv_frac, dtype=float)) * d * d


def layer_matrix_params(d: ArrayLike, ffn: ArrayLike | None = None, kv_frac: ArrayLike = 1.0,
                        mlp_mats: ArrayLike = 2.0, attn: ArrayLike | None = None) -> np.ndarray:  # fmt: skip
    """Weights of one layer's matrices: attention (2 + 2 kv/a) d^2, MLP mlp_mats d ffn.

    GPT (ffn = 4d, kv = a, two MLP matrices): 12 d^2.  Llama: SwiGLU's three matrices,
    grouped-query attention with kv/a of the key/value heads.  ``attn``: the attention
    projections' weights where they are not (2 + 2 kv/a) d^2 (multi-head latent attention,
    analytic.mla.attention_proj_params); None = :func:`attention_matrix_params`.
    """
    d = np.asarray(d, dtype=float)
    ffn = 4.0 * d if ffn is None else np.asarray(ffn, dtype=float)
    attn = attention_matrix_params(d, kv_frac) if attn is None else np.asarray(attn, dtype=float)
    return attn + np.asarray(mlp_mats, dtype=float) * d * ffn


# ---- FLOPs ---------------------------------------------------------------------------
def forward_flops_layer(b: ArrayLike, s: ArrayLike, d: ArrayLike, ffn: ArrayLike | None = None,
                        kv_frac: ArrayLike = 1.0, mlp_mats: ArrayLike = 2.0, attn=None) -> np.ndarray:  # fmt: skip
    """Forward FLOPs of one layer for b sequences: 2 b s (matrix params) + 4 b s^2 d.

    GPT shape: 24 b s d^2 + 4 b s^2 d.
    """
    b, s, d = (np.asarray(x, dtype=float) for x in (b, s, d))
    return b * s * (2.0 * layer_matrix_params(d, ffn, kv_frac, mlp_mats, attn) + 4.0 * s * d)


def training_flops_layers(
    b: ArrayLike, s: ArrayLike, d: ArrayLike, L: ArrayLike, recompute: ArrayLike = NONE,
    ffn: ArrayLike | None = None, kv_frac: ArrayLike = 1.0, mlp_mats: ArrayLike = 2.0, attn=None, attn_op=None,
) -> np.ndarray:  # fmt: skip
    """Training FLOPs of the layers: 3 x forward (GPT: b (72 s d^2 + 12 s^2 d) l), plus recompute.
    ``attn``: attention projection weights per layer (:func:`layer_matrix_params`); ``attn_op``:
    their op-level SAC terms (:func:`op_sac_recompute_flops`)."""
    fwd = forward_flops_layer(b, s, d, ffn, kv_frac, mlp_mats, attn)
    rc = np.asarray(recompute)
    b, s, d = (np.asarray(x, dtype=float) for x in (b, s, d))
    extra = np.where(rc == FULL, fwd, np.where(rc == SELECTIVE, 4.0 * b * s * s * d, 0.0))
    extra = np.where(rc == OP, op_sac_recompute_flops(b, s, d, ffn, kv_frac, attn_op, mlp_mats), extra)
    return (3.0 * fwd + extra) * np.asarray(L, dtype=float)


def lm_head_flops(b: ArrayLike, s: ArrayLike, d: ArrayLike, V: ArrayLike) -> np.ndarray:
    """Logit layer, forward and backward: 6 b s d V (never recomputed)."""
    b, s, d, V = (np.asarray(x, dtype=float) for x in (b, s, d, V))
    return 6.0 * b * s * d * V


def model_flops(b: ArrayLike, s: ArrayLike, d: ArrayLike, L: ArrayLike, V: ArrayLike) -> np.ndarray:
    """Model FLOPs (MFU basis): layers without recompute plus the LM head."""
    return training_flops_layers(b, s, d, L) + lm_head_flops(b, s, d, V)


def megatron_eq3_flops(B: ArrayLike, s: ArrayLike, d: ArrayLike, L: ArrayLike, V: ArrayLike) -> np.ndarray:
    """Narayanan et al. eq. 3: 96 B s l d^2 (1 + s/(6d) + V/(16 l d)) -- full recompute counted."""
    B, s, d, L, V = (np.asarray(x, dtype=float) for x in (B, s, d, L, V))
    return 96.0 * B * s * L * d * d * (1.0 + s / (6.0 * d) + V / (16.0 * L * d))


# ---- activations ---------------------------------------------------------------------
#: bytes per s b d of a layer's kept activations that TP does not split without sequence
#: parallelism: two layer-norm inputs (4), the attention and MLP inputs (4), two dropout masks (2)
KEPT_REPLICATED = 10.0


def kept_split_coeff(ffn_over_d: ArrayLike, kv_frac: ArrayLike, mats: ArrayLike) -> np.ndarray:
    """Bytes per s b d of a layer's kept activations that TP splits: Q and the attention
    output (4), K and V (4 kv/a), the MLP intermediates (2 mats f/d).  GPT: 24."""
    f, kv, mt = (np.asarray(x, dtype=float) for x in (ffn_over_d, kv_frac, mats))
    return 4.0 + 4.0 * kv + 2.0 * mt * f


def mlp_kept_coeff(ffn_over_d: ArrayLike, mats: ArrayLike, dropout: ArrayLike = True) -> np.ndarray:
    """Bytes per s b d the MLP block keeps: its input (2), dropout mask (1, with dropout),
    intermediates (2 mats f/d).  GPT: 19 (Korthikanti sec. 4.1)."""
    drop = np.asarray(dropout, dtype=float)
    return 2.0 + drop + 2.0 * np.asarray(mats, dtype=float) * np.asarray(ffn_over_d, dtype=float)


def activation_bytes_layer(
    b: ArrayLike,
    s: ArrayLike,
    d: ArrayLike,
    a: ArrayLike,
    t: ArrayLike = 1,
    seq_parallel: ArrayLike = False,
    recompute: ArrayLike = NONE,
    flash: ArrayLike = False,
    ffn_over_d: ArrayLike = 4.0,
    kv_frac: ArrayLike = 1.0,
    mats: ArrayLike = 2.0,
    dropout: ArrayLike = True,
    mla_kept: tuple | None = None,
    attn_op: tuple | None = None,
) -> np.ndarray:
    """Activation bytes one layer keeps for backward, per GPU (Korthikanti et al. 2022).

    Korthikanti's 34 s b d (sec. 4.1) generalised to the layer's shape: 10 s b d
    replicated without sequence parallelism (two layer-norm inputs, the attention and MLP
    inputs, two dropout masks) and :func:`kept_split_coeff` s b d split over TP (Q and the
    attention output 4, K and V 4 kv/a, the MLP's intermediates 2 mats f/d: GeLU input and
    output, or SwiGLU's gate, up and product).  GPT (f = 4d, kv = a, GeLU): 10 + 24.
    ``flash``: fused attention keeps no s x s score tensors, so the 5 a s / d term vanishes.
    Without ``dropout`` (Llama, Mixtral, DeepSeek) there are no masks: the two 1-byte s b d
    masks go, and of the 5 a s / d only the softmax output (2) stays.
    ``mla_kept``: multi-head latent attention's (split, replicated) coefficients
    (analytic.mla.attention_kept_coeffs) in place of Q, K, V and the output's 4 + 4 kv/a;
    ``attn_op``: its op-level SAC terms (:func:`op_sac_kept_coeff`).
    """
    b, s, d, a, t = (np.asarray(x, dtype=float) for x in (b, s, d, a, t))
    sp = np.asarray(seq_parallel, dtype=bool)
    rc = np.asarray(recompute)
    sbd = s * b * d
    drop = np.asarray(dropout, dtype=float)
    # softmax output (2) + dropout mask and output (3), per head shard
    attn = np.where(flash, 0.0, (2.0 + 3.0 * drop) * a * s / (d * t))
    split = kept_split_coeff(ffn_over_d, kv_frac, mats)
    replicated = KEPT_REPLICATED - 2.0 * (1.0 - drop)  # the two 1-byte dropout masks
    if mla_kept is not None:  # MLA's q, k, v, output and latents (analytic.mla)
        split = mla_kept[0] + 2.0 * np.asarray(mats, dtype=float) * np.asarray(ffn_over_d, dtype=float)
        replicated = replicated + mla_kept[1]
    linear = np.where(sp, (replicated + split) / t, replicated + split / t)
    full = 2.0 * sbd / np.where(sp, t, 1.0)
    op = sbd * op_sac_kept_coeff(ffn_over_d, kv_frac, mats, attn_op) / t  # split like the linear layers
    out = np.where(rc == FULL, full, np.where(rc == SELECTIVE, sbd * linear, sbd * (linear + attn)))
    return np.where(rc == OP, op, out)


def vector_traffic_bytes_layer(
    b: ArrayLike,
    s: ArrayLike,
    d: ArrayLike,
    a: ArrayLike,
    t: ArrayLike = 1,
    seq_parallel: ArrayLike = False,
    recompute: ArrayLike = NONE,
    flash: ArrayLike = False,
    passes: ArrayLike = 5.0,
) -> np.ndarray:
    """HBM bytes the memory-bound (non-matmul) kernels of one layer move, fwd + bwd, per GPU.

    Korthikanti's activation count lists every tensor the element-wise kernels (layer
    norm, GeLU, softmax, dropout, residual adds) produce.  Each is written and read in
    forward and read, and its gradient written and read, in backward: ``passes`` = 5
    traversals of the activation bytes.  Full recompute re-runs the forward (2 more);
    selective recompute re-runs only the attention core (2 more over its s x s tensors).
    """
    rc = np.asarray(recompute)
    base = activation_bytes_layer(b, s, d, a, t, seq_parallel, NONE, flash)
    attn = base - activation_bytes_layer(b, s, d, a, t, seq_parallel, SELECTIVE, flash)
    # op-level SAC re-runs every element-wise op of the forward, as full recompute does
    extra = np.where((rc == FULL) | (rc == OP), base, np.where(rc == SELECTIVE, attn, 0.0)) * (2.0 / 5.0)
    return passes * (base + extra)


def activation_bytes_seed004(
    b: ArrayLike, s: ArrayLike, d: ArrayLike, a: ArrayLike, L: ArrayLike
) -> np.ndarray:
    """Seed 004's estimate for the whole model: b (34 s d + 5 a s^2) l bytes."""
    b, s, d, a, L = (np.asarray(x, dtype=float) for x in (b, s, d, a, L))
    return b * (34.0 * s * d + 5.0 * a * s * s) * L
