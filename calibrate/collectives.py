"""Collective curves: piecewise alpha-beta fits of time against message size.

For one collective at one scale, nccl-tests gives the time of each message size (out-of-
place and in-place, possibly several logs).  The fit target is the per-size median time
(robust to a single stalled repetition).  Within one NCCL protocol/algorithm regime,

    t(S) = alpha + S * factor(n) / busbw,

fitted with *relative* residuals (t_pred / t_meas - 1), so that 4-byte and 1-GiB
messages weigh alike.  NCCL switches regime with the size, so the curve is split into
contiguous segments of at least :data:`MIN_SIZES` sizes; the breakpoints come from
dynamic programming over all splits and the number of segments from Akaike's
information criterion (2 per parameter: each segment's alpha and busbw and each
breakpoint).  Each segment's (alpha, 1/busbw) is the non-negative least-
squares solution, obtained in closed form for every candidate segment at once from
prefix sums; standard errors come from the covariance sigma^2 (A^T W A)^-1.  Sizes whose
relative residual exceeds 10 % are down-weighted (Huber weights, iterated), so that one
erratic size -- nccl-tests logs have them -- cannot steal a breakpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from calib.calibrate.calibration import (
    FITTED,
    UNIDENTIFIABLE,
    CollectiveCurve,
    FitQuality,
    Param,
    Segment,
)

from calib.core.collective_names import busbw_factor

MIN_SIZES = 3  # sizes per segment: two parameters and at least one degree of freedom
MAX_SEGMENTS = 6
HUBER_C = 0.1  # relative residual beyond which a size is down-weighted (Huber)
HUBER_ITERATIONS = 8
_TINY = 1e-300


@dataclass(frozen=True)
class SizeSeries:
    """Median time per message size of one collective at one scale."""

    collective: str
    n_gpus: int
    n_nodes: int
    gpus_per_node: int
    bytes: np.ndarray  # ascending, > 0
    time_s: np.ndarray  # median over repetitions
    n_samples: int  # measurements behind the medians
    source: str
    time_se_s: np.ndarray | None = None  # standard error of each size's mean (repetitions' scatter)


def size_series(samples: pd.DataFrame, source: str) -> list[SizeSeries]:
    """Group ``samples`` rows by (collective, ranks, nodes) into per-size median times.

    Both the out-of-place and the in-place time of every line count as repetitions.
    Zero-byte lines (nccl-tests rounds tiny all-gathers down to 0) measure only the
    launch and are left out.
    """
    both = pd.concat(
        [
            samples[["collective", "nranks", "nnodes", "gpus_per_node", "bytes"]].assign(
                t=samples["time_oop_us"]
            ),
            samples[["collective", "nranks", "nnodes", "gpus_per_node", "bytes"]].assign(
                t=samples["time_ip_us"]
            ),
        ],
        ignore_index=True,
    )
    both = both[(both["bytes"] > 0) & np.isfinite(both["t"]) & (both["t"] > 0)]
    med = (
        both.groupby(["collective", "nranks", "nnodes", "gpus_per_node", "bytes"], sort=True)["t"]
        .agg(["median", "size", "std"])
        .reset_index()
    )
    out = []
    for (coll, nr, nn, gpn), g in med.groupby(["collective", "nranks", "nnodes", "gpus_per_node"], sort=True):
        out.append(
            SizeSeries(
                collective=str(coll),
                n_gpus=int(nr),
                n_nodes=int(nn),
                gpus_per_node=int(gpn),
                bytes=g["bytes"].to_numpy(dtype=float),
                time_s=g["median"].to_numpy(dtype=float) * 1e-6,
                n_samples=int(g["size"].sum()),
                source=source,
                time_se_s=(g["std"] / np.sqrt(g["size"])).to_numpy(dtype=float) * 1e-6,
            )
        )
    return out


def _segment_table(u: np.ndarray, v: np.ndarray, w: np.ndarray):
    """Weighted NNLS solution and RSS of ``alpha*u + c*v ~ 1`` for every segment [i, j].

    Returns arrays indexed [i, j] (j inclusive): alpha, c, weighted rss, and the normal-
    matrix entries for the covariance.  From prefix sums: no loop over segments.
    """
    P = lambda x: np.concatenate([[0.0], np.cumsum(x)])  # noqa: E731
    cu, cv, cuu, cuv, cvv, c1 = P(w * u), P(w * v), P(w * u * u), P(w * u * v), P(w * v * v), P(w)
    i, j = np.meshgrid(np.arange(len(u)), np.arange(len(u)), indexing="ij")
    su, sv = cu[j + 1] - cu[i], cv[j + 1] - cv[i]
    suu, suv, svv, n = cuu[j + 1] - cuu[i], cuv[j + 1] - cuv[i], cvv[j + 1] - cvv[i], c1[j + 1] - c1[i]
    det = suu * svv - suv * suv
    with np.errstate(divide="ignore", invalid="ignore"):
        a2 = (svv * su - suv * sv) / det
        c2 = (suu * sv - suv * su) / det
        a_only, c_only = su / suu, sv / svv

    def rss(a, c):
        return n - 2 * (a * su + c * sv) + a * a * suu + 2 * a * c * suv + c * c * svv

    both_ok = (a2 >= 0) & (c2 >= 0) & np.isfinite(a2) & np.isfinite(c2)
    r_a, r_c = rss(a_only, 0.0), rss(0.0, c_only)
    alpha = np.where(both_ok, a2, np.where(r_a <= r_c, a_only, 0.0))
    c = np.where(both_ok, c2, np.where(r_a <= r_c, 0.0, c_only))
    r = np.maximum(rss(alpha, c), 0.0)
    return alpha, c, r, (suu, suv, svv, n)


def _best_split(rss: np.ndarray, m: int) -> tuple[list[tuple[int, int]], float]:
    """Segments (i, j) minimising total RSS for the AIC-best number of segments."""
    valid = np.full_like(rss, np.inf)
    for i in range(m):
        valid[i, i + MIN_SIZES - 1 :] = rss[i, i + MIN_SIZES - 1 :]
    kmax = max(1, min(MAX_SEGMENTS, m // MIN_SIZES))
    best = np.full((kmax + 1, m + 1), np.inf)  # best[k][e]: first e sizes in k segments
    arg = np.zeros((kmax + 1, m + 1), dtype=int)
    best[0][0] = 0.0
    for k in range(1, kmax + 1):
        for e in range(k * MIN_SIZES, m + 1):
            cand = best[k - 1][:e] + valid[:e, e - 1]
            arg[k][e] = int(np.argmin(cand))
            best[k][e] = cand[arg[k][e]]
    aic = [
        m * np.log(max(best[k][m], _TINY) / m) + 2.0 * (3 * k - 1) if np.isfinite(best[k][m]) else np.inf
        for k in range(1, kmax + 1)
    ]
    k = int(np.argmin(aic)) + 1
    segs, e = [], m
    for kk in range(k, 0, -1):
        s = arg[kk][e]
        segs.append((s, e - 1))
        e = s
    return segs[::-1], float(best[k][m])


def fit_curve(series: SizeSeries, *, mask: np.ndarray | None = None) -> CollectiveCurve:
    """Fit the piecewise alpha-beta curve of ``series`` (on ``mask``'s sizes when given)."""
    S, T = series.bytes, series.time_s
    if mask is not None:
        S, T = S[mask], T[mask]
    m = len(S)
    f = float(busbw_factor(series.collective, series.n_gpus))
    f = 1.0 if not np.isfinite(f) or f == 0 else f
    src = series.source
    if m < 3:
        return _degenerate(series, S, T, f)
    u, v = 1.0 / T, S * f / T
    # Huber-weighted iterations: a single erratic size (a stalled repetition, a protocol
    # hiccup) must not pull a whole regime or take a breakpoint of its own
    w = np.ones(m)
    for _ in range(HUBER_ITERATIONS):
        alpha, c, rss, (suu, suv, svv, nn) = _segment_table(u, v, w)
        segs, _ = _best_split(rss, m)
        r = np.concatenate([alpha[i, j] * u[i : j + 1] + c[i, j] * v[i : j + 1] - 1.0 for i, j in segs])
        w_new = np.minimum(1.0, HUBER_C / np.maximum(np.abs(r), 1e-300))
        if np.allclose(w_new, w):
            break
        w = w_new
    segments = []
    for i, j in segs:
        a, cc, r, n_pts = alpha[i, j], c[i, j], rss[i, j], j - i + 1
        sigma2 = r / (n_pts - 2) if n_pts > 2 else np.nan
        det = suu[i, j] * svv[i, j] - suv[i, j] ** 2
        var_a = sigma2 * svv[i, j] / det if det > 0 else np.nan
        var_c = sigma2 * suu[i, j] / det if det > 0 else np.nan
        a_bound, c_bound = a <= 0, cc <= 0
        cc = max(cc, 1e-24)  # c == 0: a pure-latency regime; keep busbw finite (1e15 GB/s)
        busbw = 1.0 / (cc * 1e9)
        segments.append(
            Segment(
                min_bytes=float(S[i]),
                max_bytes=float(S[j]),
                alpha_s=Param(
                    float(a),
                    stderr=None if a_bound or not np.isfinite(var_a) else float(np.sqrt(var_a)),
                    unit="s",
                    status=FITTED,
                    note="at bound 0" if a_bound else "",
                ),
                busbw_gbps=Param(
                    float(busbw),
                    stderr=None if c_bound or not np.isfinite(var_c) else float(np.sqrt(var_c) / cc**2 / 1e9),
                    unit="GB/s",
                    status=FITTED,
                    note="latency-only regime: bandwidth not resolved" if c_bound else "",
                ),
            )
        )
    curve = CollectiveCurve(
        collective=series.collective,
        n_gpus=series.n_gpus,
        n_nodes=series.n_nodes,
        gpus_per_node=series.gpus_per_node,
        alpha_s=segments[0].alpha_s,
        busbw_gbps=segments[-1].busbw_gbps,
        source=src,
        segments=tuple(segments),
    )
    return _with_quality(curve, series, mask)


def _degenerate(series: SizeSeries, S: np.ndarray, T: np.ndarray, f: float) -> CollectiveCurve:
    """Fewer than three sizes: latency and bandwidth cannot be told apart honestly."""
    if len(S) == 2 and S[1] > S[0] and T[1] > T[0]:
        c = (T[1] - T[0]) / (f * (S[1] - S[0]))
        a = T[0] - c * f * S[0]
        if a >= 0:
            note = "two message sizes: exact solve, no uncertainty"
            alpha = Param(float(a), unit="s", status=FITTED, note=note)
            bw = Param(float(1.0 / (c * 1e9)), unit="GB/s", status=FITTED, note=note)
            return _with_quality(_plain(series, alpha, bw), series, None)
    i = int(np.argmax(S))
    measured = float(S[i] * f / T[i] / 1e9)
    sizes = ", ".join(f"{s:.0f}" for s in np.unique(S))
    note = (
        f"{len(np.unique(S))} message size(s) ({sizes} B): latency and bandwidth cannot be separated; "
        "need >= 3 sizes spanning latency- and bandwidth-bound messages"
    )
    alpha = Param(0.0, unit="s", status=UNIDENTIFIABLE, note=note + "; value 0 is a placeholder")
    bw = Param(
        measured,
        unit="GB/s",
        status=UNIDENTIFIABLE,
        note=note + f"; value is the measured busbw at {S[i]:.0f} B, a lower bound on the plateau",
    )
    return _with_quality(_plain(series, alpha, bw), series, None)


def _plain(series: SizeSeries, alpha: Param, bw: Param) -> CollectiveCurve:
    return CollectiveCurve(
        collective=series.collective,
        n_gpus=series.n_gpus,
        n_nodes=series.n_nodes,
        gpus_per_node=series.gpus_per_node,
        alpha_s=alpha,
        busbw_gbps=bw,
        source=series.source,
    )


def busbw_rel_errors(curve: CollectiveCurve, series: SizeSeries) -> np.ndarray:
    """busbw_pred / busbw_meas - 1 at every measured size (= t_meas / t_pred - 1)."""
    return series.time_s / curve.time_s(series.bytes) - 1.0


def _with_quality(curve: CollectiveCurve, series: SizeSeries, mask: np.ndarray | None) -> CollectiveCurve:
    from dataclasses import replace

    sel = np.ones(len(series.bytes), bool) if mask is None else mask
    rel = busbw_rel_errors(curve, series)[sel]
    y = np.log(series.time_s[sel])
    yhat = np.log(curve.time_s(series.bytes[sel]))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - yhat) ** 2)) / ss_tot if ss_tot > 0 else None
    q = FitQuality(
        n_points=int(sel.sum()),
        r2=r2,
        rmse=float(np.sqrt(np.mean(rel**2))),
        max_abs_rel_err=float(np.max(np.abs(rel))),
        residuals=tuple(float(x) for x in rel),
        note=f"relative busbw residuals per message size; R^2 of log time; {len(curve.segments) or 1} regime(s)",
    )
    return replace(curve, quality=q)


def heldout_errors(series: SizeSeries) -> np.ndarray:
    """Fit on every other size (0, 2, 4, ...), return busbw errors at the skipped sizes."""
    train = np.arange(len(series.bytes)) % 2 == 0
    curve = fit_curve(series, mask=train)
    return busbw_rel_errors(curve, series)[~train]


def fit_series(series: SizeSeries) -> CollectiveCurve:
    """The full fit plus its held-out check recorded in the quality."""
    from dataclasses import replace

    curve = fit_curve(series)
    if len(series.bytes) >= 2 * MIN_SIZES + 1 and curve.quality is not None:
        held = heldout_errors(series)
        q = replace(
            curve.quality,
            heldout_max_abs_rel_err=float(np.max(np.abs(held))),
            note=curve.quality.note
            + f"; held-out: fit on every other size, max |err| on the other {len(held)}",
        )
        curve = replace(curve, quality=q)
    return curve
