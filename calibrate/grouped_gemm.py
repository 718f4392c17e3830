"""Grouped expert GEMMs from their shapes: every expert's GEMM on a roofline of its own.

An MoE layer's experts run as one grouped GEMM (torch ``grouped_mm`` as HF transformers calls
it, CUTLASS's grouped kernels, Megatron-Core's GroupedGEMM): E GEMMs of m_e = R / E rows each
in one launch.  Two things make it slower than one GEMM of all R rows, and both follow from
the shapes:

* every expert reads its own K x N weights, so a group streams 2 (m_e K + K N + m_e N) bytes
  for 2 m_e K N FLOPs.  With K, N >> m_e its arithmetic intensity is about m_e FLOP/B, so a
  group of fewer rows than the device's ridge point (peak / HBM, about 300 FLOP/B on an H100)
  is bound by reading its weights, not by the tensor cores;
* each group's rows are padded to the kernel's row tile (``TILE_ROWS``): m_e + tile / 2 on
  average when the router splits the rows unevenly.

Each group takes ``(c^p + b^p)^(1/p)`` (a smooth maximum of its compute and its operand
streaming, ``c`` at ``COMPUTE_FRACTION`` of the peak, ``b`` at ``STREAM_FRACTION`` of the HBM
bandwidth).  :func:`grouping_factor` is the grouped time over one GEMM of the R rows by the
same rule (E = 1, no padding): a factor >= 1 that multiplies the device model's fitted
roofline, so the machine's rate stays the traced one and the law carries only the grouping.
The three constants were fitted to 1,940 grouped GEMMs timed on one H100 SXM
(``fixtures/kernels/h100-grouped``: forward, input and weight gradient, 14 expert shapes,
8-256 experts, 8 K and 32 K routed rows, even and random splits; ``benchmarks/grouped_gemm_law.py``
refits them), never to a training trace.  On those kernels the factor moves the grouped/one-GEMM
ratio from 1.1 (8 experts of 4,096 rows) to 6 (256 experts of 32 rows); the law's rms error is
15 % (log) against 80 % for "one GEMM of the rows".  They are stated for other devices: the
ridge point follows each device's datasheet peak and HBM bandwidth (the same kernels on an H200
fit as well, rms 0.144, though its weight-bound groups gained 1.16x, not the HBM ratio 1.43x).
FP8 expert GEMMs take the peak times the FP8 speed-up with their operands still counted at 2
bytes: no FP8 MoE run was traced (torch's row-wise FP8 grouped kernel, timed, runs compute-bound
groups at about BF16 speed; docs/calibrate.md).
"""

from __future__ import annotations

import numpy as np
from calib.calibrate.params import Param
from numpy.typing import ArrayLike

_SRC = "fitted to 1,940 grouped_mm kernels on one H100 SXM (fixtures/kernels/h100-grouped, benchmarks/grouped_gemm_law.py)"
#: a group's compute at this fraction of the datasheet peak
COMPUTE_FRACTION = Param(0.6983, 0.0102, "", note=_SRC)
#: a group's operand streaming at this fraction of the datasheet HBM bandwidth
STREAM_FRACTION = Param(0.7989, 0.0126, "", note=_SRC)
#: the smooth maximum's exponent (1: compute and streaming add; large: the longer one alone)
SMOOTH_P = Param(2.3077, 0.1478, "", note=_SRC)
#: rows of the grouped kernels' tile (CUTLASS's 128-row tiles on Hopper; 64 and 256 fitted worse)
TILE_ROWS = 128


def group_time_s(experts: ArrayLike, rows: ArrayLike, k: ArrayLike, n: ArrayLike, peak_tflops: ArrayLike,
                 hbm_tbps: ArrayLike, pad: bool = True, fractions: tuple[float, float, float] | None = None,
                 even: ArrayLike = False) -> np.ndarray:  # fmt: skip
    """Seconds of ``experts`` GEMMs of ``rows / experts`` rows x k x n by the law (no fixed
    launch cost).  ``pad``: each group's rows padded for the compute, by half a tile (uneven
    routing) or, where ``even``, up to whole tiles (equal splits of a microbenchmark);
    ``fractions``: (compute, stream, p), else the module's constants."""
    cf, sf, p = fractions or (COMPUTE_FRACTION.value, STREAM_FRACTION.value, SMOOTH_P.value)
    E = np.maximum(np.asarray(experts, dtype=float), 1.0)
    R, k, n = (np.asarray(x, dtype=float) for x in (rows, k, n))
    me = R / E
    whole = np.ceil(me / TILE_ROWS) * TILE_ROWS
    mp = np.where(np.asarray(even, dtype=bool), whole, me + TILE_ROWS / 2.0) if pad else me
    c = 2.0 * mp * k * n / (cf * np.asarray(peak_tflops, dtype=float) * 1e12)
    b = 2.0 * (me * k + k * n + me * n) / (sf * np.asarray(hbm_tbps, dtype=float) * 1e12)
    return E * (c**p + b**p) ** (1.0 / p)


def grouping_factor(experts: ArrayLike, rows: ArrayLike, k: ArrayLike, n: ArrayLike, peak_tflops: ArrayLike,
                    hbm_tbps: ArrayLike) -> np.ndarray:  # fmt: skip
    """The grouped GEMM's time over one GEMM of all ``rows`` (module docstring); 1 where
    there is one expert or no row, or the device states no positive peak or HBM bandwidth."""
    E, R = np.asarray(experts, dtype=float), np.asarray(rows, dtype=float)
    peak, hbm = np.asarray(peak_tflops, dtype=float), np.asarray(hbm_tbps, dtype=float)
    known = (peak > 0.0) & (hbm > 0.0) & np.isfinite(peak) & np.isfinite(hbm)
    peak, hbm = np.where(known, peak, 1.0), np.where(known, hbm, 1.0)
    one = group_time_s(1.0, R, k, n, peak, hbm, pad=False)
    ok = known & (E > 1.0) & (R > 0.0) & (one > 0.0)
    grouped = group_time_s(E, R, k, n, peak, hbm)
    return np.where(ok, grouped / np.where(ok, one, 1.0), 1.0)


def expert_factors(experts: ArrayLike, rows: ArrayLike, d: ArrayLike, f_e: ArrayLike, mats: float, peak_tflops: ArrayLike,
                   hbm_tbps: ArrayLike) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The grouping factors of an MoE layer's two expert GEMMs on ``rows`` routed rows over
    ``experts`` groups: the up-projection (d -> (mats - 1) f_e: gate and up fused, as HF's
    grouped experts and Megatron-Core's GroupedMLP run them) and the down-projection
    (f_e -> d).  The one place the device path (analytic.device_path) and the spec path
    (analytic.moe) take the layer's expert GEMMs from."""
    f_e = np.asarray(f_e, dtype=float)
    up = grouping_factor(experts, rows, d, (float(mats) - 1.0) * f_e, peak_tflops, hbm_tbps)
    return up, grouping_factor(experts, rows, f_e, d, peak_tflops, hbm_tbps)


def fit_law(kernels, starts=((0.5, 1.5), (0.5, 4.0), (0.8, 2.5), (0.8, 8.0))) -> dict[str, Param]:
    """Refit (compute fraction, stream fraction, p) on timed grouped GEMMs: a frame with
    ``experts, routed_rows, k, n, split`` ("even": rows a multiple of the tile per group, no
    padding; else half a tile per group) and ``grouped_s``, against the H100's datasheet peak
    and HBM bandwidth (``peak_tflops``, ``hbm_tbps`` columns).  The bare call's launch cost
    (which CUDA events around a microbenchmark see, a kernel trace does not) is fitted beside
    them as ``launch_s``.  Least squares on log time from a few starts; stderr from the Jacobian."""
    from scipy.optimize import least_squares

    df = kernels[np.isfinite(kernels["grouped_s"].to_numpy(dtype=float))]
    cols = [
        df[c].to_numpy(dtype=float) for c in ("experts", "routed_rows", "k", "n", "peak_tflops", "hbm_tbps")
    ]
    even = df["split"].to_numpy() == "even"
    t = df["grouped_s"].to_numpy(dtype=float)

    def resid(x):
        return np.log((x[3] * 1e-6 + group_time_s(*cols, fractions=tuple(x[:3]), even=even)) / t)

    lo, hi = [0.1, 0.1, 1.0, 0.0], [1.0, 1.5, 30.0, 200.0]
    fits = [
        least_squares(resid, [c0, 0.8, p0, 10.0], bounds=(lo, hi), x_scale=[0.1, 0.1, 1.0, 10.0])
        for c0, p0 in starts
    ]
    best = min(fits, key=lambda r: r.cost)
    cov = np.linalg.pinv(best.jac.T @ best.jac) * float(np.mean(best.fun**2))
    se = np.sqrt(np.diag(cov))
    note = (
        f"fitted to {len(df)} timed grouped GEMMs; rms log error {float(np.sqrt(np.mean(best.fun**2))):.3f}"
    )
    names = ("compute_fraction", "stream_fraction", "smooth_p", "launch_s")
    vals = [*best.x[:3], best.x[3] * 1e-6]
    ses = [*se[:3], se[3] * 1e-6]
    return {
        nm: Param(float(v), float(e), "s" if nm == "launch_s" else "", note=note)
        for nm, v, e in zip(names, vals, ses)
    }
