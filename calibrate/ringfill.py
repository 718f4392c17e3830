"""A ring's pipeline fill and drain: the once-only part of a ring collective's time.

A ring collective pays, once, a fill and drain of its pipeline (kernel launch, the first
slice travelling before every link is busy, the last one draining: NCCL's ``baseLat`` and
more) on top of its steps.  Reading the all-gather as (n - 1) x tau(c) spreads that
once-only cost over the steps, so tau(c) read at 2 nodes (7 steps) overstates what each
of the 31 steps at 8 nodes costs -- the 2 -> 8-node self-check's all-gather misses at
4-32 MiB.  The fitted scale's own logs hold the fix: at the same chunk c = S / n the ring
all-reduce runs 2 (n - 1) steps and the all-gather n - 1, with one fill each, so

    L0(c) = 2 t_allgather(S) - t_allreduce(S)

(the all-reduce's reduction arithmetic, hidden under the network time, is neglected: it
makes L0 a lower bound).  L0 is fitted as ``l0 + c / b_fill`` (a fixed latency plus a
part of one chunk, at most the whole chunk at the ring step's plateau bandwidth: fill and
drain are one slice each of a chunk sent in two or more), both with standard errors, weighted by 1 / t_allreduce (the noise of a
difference of two times grows with them).  Only sizes >= ``min_bytes`` where the
all-reduce ran the ring (not below ``tree_ratio`` x twice the all-gather) and 0 < L0 <
t_allgather count, in an unbroken run down from the largest size: L0 is not carried into
a protocol regime where no size measured it (there, L0 = 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from calib.calibrate.calibration import FITTED, FIXED, CollectiveCurve, Param, Segment
from calib.calibrate.collectives import MIN_SIZES
from calib.calibrate.params import lstsq_stderr, stderr_or_none

from calib.core.collective_names import ALLGATHER, ALLREDUCE, SENDRECV

#: the fill's bandwidth when the fit finds no per-byte part (1e9 GB/s: c / b_fill vanishes)
BW_NO_BYTES_GBPS = 1e9


def fit_marginal(
    inter: Mapping[str, Sequence], *, min_bytes: float, tree_ratio: float
) -> tuple[CollectiveCurve | None, dict[str, Param]]:
    """L0(c) as a one-segment curve, and the params ``fill_steps`` / ``fill_min_chunk_bytes``
    (None and {} when the logs cannot give it: no all-reduce and all-gather at one scale,
    or fewer than 3 ring sizes)."""
    ag = {s.n_gpus: s for _, s in inter.get(ALLGATHER, ())}
    ar = {s.n_gpus: s for _, s in inter.get(ALLREDUCE, ())}
    scales = sorted(set(ag) & set(ar))
    big = [n for n in scales if ag[n].n_nodes > 2]
    use = big[-1:] or scales[-1:]  # the largest scale tau is fitted on (netfit._fit_steps' rule)
    if not use:
        return None, {}
    n = use[0]
    S, i_ag, i_ar = np.intersect1d(ag[n].bytes, ar[n].bytes, return_indices=True)
    t_ag, t_ar = ag[n].time_s[i_ag], ar[n].time_s[i_ar]
    l0 = 2.0 * t_ag - t_ar
    ok = (min_bytes <= S) & (t_ar >= tree_ratio * 2.0 * t_ag) & (l0 > 0) & (l0 < t_ag)
    ok &= np.cumprod(ok[::-1])[::-1].astype(bool)
    if ok.sum() < MIN_SIZES:
        return None, {}
    c, y, w = S[ok] / n, l0[ok], 1.0 / t_ar[ok]
    A = np.column_stack([np.ones_like(c), c]) * w[:, None]
    from scipy.optimize import lsq_linear

    # fill and drain are one slice each and NCCL's Simple ring sends a chunk in two or more
    # slices: their bytes are at most one chunk at the ring step's plateau bandwidth
    b_step = float(np.max((S / n) / (t_ag / (n - 1.0))))
    x = lsq_linear(A, y * w, bounds=([0.0, 0.0], [np.inf, 1.0 / b_step])).x
    r = A @ x - y * w
    se = lstsq_stderr(A, r)
    src = f"2 t_allgather - t_allreduce at {n} GPUs, {int(ok.sum())} ring sizes >= {S[ok].min() / 2**10:.0f} KiB"
    alpha = Param(
        float(x[0]), stderr=stderr_or_none(se[0]), unit="s", status=FITTED, note=f"fill latency l0; {src}"
    )
    # busbw of the fill's per-byte part (GB/s), its stderr by error propagation; at a bound
    # (no per-byte part, or a whole chunk) the value is the bound's and has no stderr
    k, se_k = float(x[1]), float(se[1])
    at_bound = k <= 0 or k >= (1 - 1e-9) / b_step
    bw = 1e-9 / k if k > 0 else BW_NO_BYTES_GBPS
    bw_se = None if at_bound else bw * se_k / k
    seg = Segment(
        min_bytes=float(c.min()),
        max_bytes=float(c.max()),
        alpha_s=alpha,
        busbw_gbps=Param(
            bw, stderr=bw_se, unit="GB/s", status=FITTED, note=f"chunk bytes per fill second; {src}"
        ),
    )
    curve = CollectiveCurve(
        SENDRECV, 2, 2, 1, alpha_s=seg.alpha_s, busbw_gbps=seg.busbw_gbps, segments=(seg,)
    )
    return curve, {
        "fill_steps": Param(
            float(n - 1),
            status=FIXED,
            note=f"steps of the fitted scale ({n} GPUs), over which tau spreads the fill",
        ),  # fmt: skip
        "fill_min_chunk_bytes": Param(
            float(c.min()), unit="B", status=FIXED, note="below this chunk no fill was measured: L0 = 0"
        ),
    }
