"""Precision: bf16 and FP8 (Transformer Engine style) -- GEMM rate, casts, bytes of each tensor.

bf16: every GEMM at the device's dense BF16 peak (``peak_tflops``).

FP8 (Micikevicius et al. 2022, "FP8 Formats for Deep Learning", arXiv:2209.05433;
NVIDIA Transformer Engine's ``fp8_autocast`` with per-tensor delayed scaling): the
linear layers' GEMMs (QKV, attention projection, MLP / expert matrices; forward, input
gradient and weight gradient) run :func:`fp8_speedup` x faster than in bf16 -- the
hardware's measured FP8 / BF16 GEMM rate where its preset has one (``fp8_gemm_speedup``:
1.78 on GH100, not the datasheet's 2), else the peak ratio, a stated default;
the attention core (flash attention), the LM head and the embedding stay bf16.
Casts are memory-bound kernels: each linear's input is read in bf16 (2 bytes) and
written in FP8 twice (row- and column-wise copies for the forward and weight-gradient
GEMMs, 1 + 1 bytes), each gradient output read (2) and written once (1); the amax
reduction is fused into the cast.  The weights' own casts (once per iteration: TE caches
the FP8 weight over micro-batches) are not priced.  FP8 keeps the bf16 weights and adds
the linear layers' FP8 copy (1 byte per parameter; none for the embedding and LM head,
which stay bf16).  Saved linear inputs are FP8
(1 byte instead of 2): 7 of Korthikanti's 34 s b d bytes per layer (QKV, projection and
fc1 inputs, s b d each; fc2 input 4 s b d) are saved.

Model states (Rajbhandari et al. ZeRO, mixed-precision Adam): bf16 weights 2 and
gradients 2 bytes per parameter; the optimizer holds fp32 momentum and variance (8) and
an fp32 master copy (4) -- with ``master_weights = bf16`` there is no separate master
copy (the bf16 weights are updated in place), 8 bytes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

MASTER_KINDS = ("fp32", "bf16")
OPT_MOMENTS_BYTES = 8.0  # fp32 Adam m and v
MASTER_BYTES = {"fp32": 4.0, "bf16": 0.0}
FP8_WEIGHT_COPY_BYTES = 1.0
CAST_IN_BYTES = 4.0  # read bf16 (2) + write FP8 row-wise (1) and column-wise (1)
CAST_GRAD_BYTES = 3.0  # read bf16 (2) + write FP8 (1)
FP8_SAVED_SBD = 7.0  # s b d bytes of Korthikanti's 34 saved by FP8 linear inputs
#: bytes per token-layer per unit of d and of ffn that torch.compile'd FP8 linears keep
#: beyond the compiled BF16 family (``compiled_fp8_saved_bytes``)
COMPILED_FP8_SAVED_D, COMPILED_FP8_SAVED_FFN = -1.0, -1.0
DISPATCH_FP8_BYTES = 1.0 + 4.0 / 128.0  # FP8 value + one fp32 scale per 128 (DeepSeek-V3 sec. 3.3)


def master_code(name: str) -> int:
    from calib.core.errors import InputError

    try:
        return MASTER_KINDS.index(name.strip().lower())
    except ValueError:
        raise InputError("master_weights", f"unknown master-weight dtype '{name}' (fp32, bf16)") from None


def optimizer_bytes_per_param(master: ArrayLike = 0) -> np.ndarray:
    """fp32 Adam moments (8) + master weights (4 fp32, 0 bf16)."""
    return OPT_MOMENTS_BYTES + np.where(np.asarray(master) == 0, MASTER_BYTES["fp32"], MASTER_BYTES["bf16"])


def fp8_speedup(hw) -> float:
    """FP8 linear GEMMs' rate over bf16's on ``hw``: its measured ``fp8_gemm_speedup``, else the
    dense peak ratio ``peak_fp8_tflops / peak_tflops`` (stated default); 1 without FP8 units."""
    if not getattr(hw, "peak_fp8_tflops", None):
        return 1.0
    return float(hw.fp8_gemm_speedup or hw.peak_fp8_tflops / hw.peak_tflops)


def fp8_rate_text(hw) -> str:
    """How fast :func:`fp8_speedup` makes ``hw``'s FP8 linear GEMMs, and where that comes from."""
    if getattr(hw, "fp8_gemm_speedup", None):
        return f"x{hw.fp8_gemm_speedup:g} their bf16 rate (the preset's measured fp8_gemm_speedup)"
    return (
        f"x{fp8_speedup(hw):.3g} their bf16 rate, the datasheet peak ratio (stated default: no FP8 GEMM "
        "measured on this hardware; Hopper's measured 1.78 against its 2.0)"
    )


def gemm_time_s(linear_flops, attn_flops, peak_flops, peak_fp8_flops, eff, fp8) -> np.ndarray:
    """Seconds of a layer's GEMMs: the linear ones at ``peak_fp8_flops`` (the bf16 peak x
    :func:`fp8_speedup`) when ``fp8``, attention at bf16."""
    fp8 = np.asarray(fp8, dtype=bool)
    lin_peak = np.where(fp8, peak_fp8_flops, peak_flops)
    return (np.asarray(linear_flops) / lin_peak + np.asarray(attn_flops) / peak_flops) / np.asarray(eff)


def cast_bytes_layer(T, d, ffn, kv_frac, mats, t, passes_fwd=1.0, attn_io=None) -> np.ndarray:
    """HBM bytes of one layer's FP8 casts per micro-batch on one GPU (T tokens on the GPU's
    TP rank, all column/row-parallel shards / t).

    Forward inputs per token: QKV d, projection d, fc1 d, fc2 ffn (the activation's
    output).  Backward gradient outputs per token: QKV (1 + 2 kv/a) d, projection d,
    fc1 (mats - 1) ffn, fc2 d.  ``attn_io``: (inputs, outputs) per token summed over other
    attention projections, each its own linear casting its own input (multi-head latent
    attention: q_a, q_b, kv_a, kv_b, o; analytic.mla.linear_io) in place of QKV and projection.
    """
    T, d, ffn, kv_frac, t = (np.asarray(x, dtype=float) for x in (T, d, ffn, kv_frac, t))
    if attn_io is not None:
        fwd_in = attn_io[0] + d + ffn
        bwd_out = attn_io[1] + (np.asarray(mats, dtype=float) - 1.0) * ffn + d
        return T * (passes_fwd * CAST_IN_BYTES * fwd_in + CAST_GRAD_BYTES * bwd_out) / t
    fwd_in = 3.0 * d + ffn
    bwd_out = (1.0 + 2.0 * kv_frac) * d + d + (np.asarray(mats, dtype=float) - 1.0) * ffn + d
    return T * (passes_fwd * CAST_IN_BYTES * fwd_in + CAST_GRAD_BYTES * bwd_out) / t


def compiled_fp8_saved_bytes(d: ArrayLike, ffn: ArrayLike) -> np.ndarray:
    """Activation bytes per token and layer that FP8 linears under torch.compile keep beyond
    the compiled BF16 graph, read from the two compiled FP8 H200 traces' kernels (their
    inputs' shapes and dtypes; tests/test_compiled_fp8_memory.py):

    * each linear keeps its input's column-wise FP8 cast (1 byte) for the weight gradient;
      Inductor computes a shared input's cast once (q, k, v; gate, up);
    * the two norm outputs and the MLP product (silu(gate) up) are then no longer kept in
      BF16 (2 bytes): the compiled BF16 backward reads them saved, the FP8 backward only
      their casts (gate and up stay: the SwiGLU backward needs them);
    * the attention output stays in BF16 (the flash-attention backward reads it), so the
      projection's FP8 cast adds to it;

    net -2 d + d - ffn = -(d + ffn).  No FP8 weight copy is kept either: every linear's
    weight is cast again in the backward (7 weight casts per layer in each trace), where
    the eager implementation saves its cast from the forward."""
    return COMPILED_FP8_SAVED_D * np.asarray(d, dtype=float) + COMPILED_FP8_SAVED_FFN * np.asarray(
        ffn, dtype=float
    )
