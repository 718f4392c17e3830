"""Fused (flash) attention's kernel time from its shape: the device model's attention term.

A flash-attention kernel walks, for every (batch, head), its query tiles against the key
tiles.  Per score element it does ``2 h'`` multiply-adds per matmul on the tensor cores
(Q K^T and P V forward, five such products backward) and an exponential with its scaling,
max and sum on the special-function and CUDA cores, whose cost does not grow with the head
width; per query or key row it loads and stores h'-wide tiles (Q, K, V, O and their
gradients).  So, forward + backward of one layer::

    t = c_flop * b a s^2 h'  +  c_score * b a s^2  +  c_io * b a s h'

The second term is why narrow heads run far below the matmul rate: FlashAttention-3 (Shah
et al. 2024, section 3.1) counts 989 TFLOP/s of FP16 matmul against 3.9 TFLOP/s of
exponentials on an H100 SXM5, so at h' = 64 the exponentials take about as long as the
matmuls unless the kernel overlaps them.  The third is the per-row work that a long
sequence amortises (efficiency rises with s).  h' is the head dimension rounded up to the
kernels' multiple of 32 (FlashAttention-2 builds its kernels for 32, 64, 96, 128, ...;
80 runs as 96).  With only the first and third terms and a 64-wide tile (calib up to
stop 22), leave-one-run-out on the five H100 reference runs missed their attention time by
17 % median; with all three, 3 % (docs/calibrate.md, "Attention").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from calib.calibrate.params import DEFAULT, UNIDENTIFIABLE, Param, lstsq_stderr, stderr_or_none
from numpy.typing import ArrayLike
from scipy.optimize import nnls

if TYPE_CHECKING:  # device_facts imports the device model, which imports this module
    from calib.calibrate.device_facts import RunFacts

#: the head-dimension multiple the kernels are built for (FlashAttention-2's rounding)
ATTN_HEAD_TILE = 32
#: the tile calibrations fitted before ``attn_head_tile`` was recorded used
LEGACY_HEAD_TILE = 64
#: default with no attention traced: half of an 800 TFLOP/s-class device, stated as such
DEFAULT_NOTE = "no attention kernels traced; default: 50 % of the datasheet-class 800 TFLOP/s"


def padded_head(d: ArrayLike, a: ArrayLike, tile: int = ATTN_HEAD_TILE) -> np.ndarray:
    return np.ceil(np.asarray(d, dtype=float) / np.asarray(a, dtype=float) / tile) * tile


def features(b, heads, s, hd_pad) -> np.ndarray:
    """The three shape terms (per layer), stacked on the last axis: s^2 h', s^2, s h'."""
    bh = np.asarray(b, dtype=float) * np.asarray(heads, dtype=float)
    s = np.asarray(s, dtype=float)
    return np.stack(np.broadcast_arrays(bh * s * s * hd_pad, bh * s * s, bh * s * hd_pad), axis=-1)


def run_features(f: RunFacts) -> np.ndarray:
    return f.L * features(f.b, f.a, f.s, padded_head(f.d, f.a))


def fit_attention(runs: Sequence[RunFacts]) -> tuple[Param, Param, Param]:
    """(c_flop, c_io, c_score) by non-negative least squares on the runs' relative errors
    (every run weighs the same, whatever its length)."""
    rows = [(run_features(f), f.class_s["attention"]) for f in runs if f.class_s.get("attention", 0) > 0]
    if not rows:
        return (
            Param(1.0 / 400e12, unit="s/unit", status=DEFAULT, note=DEFAULT_NOTE),
            Param(0.0, unit="s/unit", status=DEFAULT, note=DEFAULT_NOTE),
            Param(0.0, unit="s/unit", status=DEFAULT, note=DEFAULT_NOTE),
        )
    X = np.array([r[0] for r in rows])
    y = np.array([r[1] for r in rows])
    A = X / y[:, None]
    c, _ = nnls(A, np.ones(len(y)))
    distinct = len({(round(x[0] / x[1]), round(x[1] / x[2])) for x in X})  # (h', s) pairs seen
    if len(rows) > 3 and distinct >= 3:
        se = lstsq_stderr(A, A @ c - 1.0)
        flop, score, io = (Param(float(v), stderr_or_none(e), "s/unit") for v, e in zip(c, se, strict=True))
        return flop, io, score
    note = (
        f"{len(rows)} runs, {distinct} distinct head widths and lengths: three terms need 4 runs and 3 shapes"
    )
    flop, score, io = (Param(float(v), None, "s/unit", UNIDENTIFIABLE, note) for v in c)
    return flop, io, score


def layer_s(c_flop: float, c_io: float, c_score: float, b, heads, s, hd_pad) -> np.ndarray:
    """Forward + backward seconds of one layer's fused attention core."""
    X = features(b, heads, s, hd_pad)
    return c_flop * X[..., 0] + c_score * X[..., 1] + c_io * X[..., 2]
