"""Ranks sharing a node's compute: the effective compute slots per node S.

r ranks on a node with S slots each get min(1, S / r) of one; ``calib fit`` estimates S
from traces of one model at different ranks per node (see :func:`fit_compute_slots`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.calibrate.levels import LEVEL_RATIO
from calib.calibrate.params import DEFAULT, FITTED, UNIDENTIFIABLE, Param

from calib.core.rundir import Run


def node_points(trace_runs: tuple[Run, ...]) -> pd.DataFrame:
    """Per trace run: ranks on its node, framework, work level and compute seconds per GFLOP per rank.

    Compute = the iteration's wall time less its exposed communication (``buckets``),
    median over ranks and iterations; work = the matmul FLOPs of the rank's iteration.
    Ingest records no host names, so a run's ranks are taken to share one node (true of
    every locally launched CPU run); for GPU runs, where ranks never share a device, the
    fit below then simply finds no slowdown.
    """
    rows = []
    for run in trace_runs:
        if not run.has("buckets"):
            continue
        b = run.table("buckets")
        b = b[(b["gemm_flops"] > 0) & (b["wall_s"] > 0)]
        if b.empty:
            continue
        compute = (b["wall_s"] - b["comm_exposed_s"]).clip(lower=0)
        rows.append(
            {
                "run": run.meta.name,
                "framework": run.meta.framework.name,
                "ranks_per_node": int(run.meta.world_size or b["rank"].nunique()),
                "x_flops": float(np.median(b["gemm_flops"] / b["n_gemms"].where(b["n_gemms"] > 0))),
                "compute_s_per_gflop": float(np.median(compute / (b["gemm_flops"] / 1e9))),
                "iterations": int(len(b)),
            }
        )
    return pd.DataFrame(
        rows,
        columns=["run", "framework", "ranks_per_node", "x_flops", "compute_s_per_gflop", "iterations"],
    )


def _share(r: np.ndarray, slots: float) -> np.ndarray:
    """Time-sharing factor of r ranks on ``slots`` compute slots: max(1, r / slots)."""
    return np.maximum(1.0, r / slots)


def fit_compute_slots(
    points: pd.DataFrame, devices_per_node: int, *, where: str
) -> tuple[Param, pd.DataFrame]:
    """Effective compute slots per node S from the per-rank slowdown with ranks per node.

    r ranks on a node with S slots (devices, or cores / threads per rank) each get
    min(1, S / r) of one: per-rank compute time grows by max(1, r / S).  Runs of one
    model and framework (same work level) at different r are compared with the one at
    the fewest ranks: c_r / c_r0 = max(1, r/S) / max(1, r0/S).  Each comparison implies
    an S in [1, devices_per_node]; S is their median (robust to a run caught by a burst
    of load from other jobs).  With no slowdown S sits at the stated devices per node (a
    bound, not a fit); with one ranks-per-node level it is that default.  Returns S and
    the comparisons (run, r, r0, slowdown, implied_slots).
    """
    cols = ["run", "framework", "ranks_per_node", "base_ranks", "slowdown"]  # + implied_slots
    dev = float(max(devices_per_node, 1))
    default = Param(
        dev,
        unit="slots",
        status=DEFAULT,
        note=f"= devices per node ({devices_per_node}): no trace runs of one model at two ranks-per-node counts",
    )
    pts = points.dropna(subset=["x_flops", "compute_s_per_gflop"])
    if pts.empty:
        return default, pd.DataFrame(columns=cols)
    level = np.zeros(len(pts), int)
    xs = pts["x_flops"].to_numpy(float)
    order = np.argsort(xs, kind="stable")
    starts = np.concatenate([[True], xs[order][1:] / xs[order][:-1] > LEVEL_RATIO])
    level[order] = np.cumsum(starts) - 1
    pts = pts.assign(level=level)
    base = pts.loc[pts.groupby(["framework", "level"])["ranks_per_node"].idxmin()]
    merged = pts.merge(
        base[["framework", "level", "ranks_per_node", "compute_s_per_gflop"]].rename(
            columns={"ranks_per_node": "base_ranks", "compute_s_per_gflop": "base_s_per_gflop"}
        ),
        on=["framework", "level"],
    )
    cmp = merged[merged["ranks_per_node"] > merged["base_ranks"]]
    cmp = cmp.assign(slowdown=cmp["compute_s_per_gflop"] / cmp["base_s_per_gflop"])
    if cmp.empty:
        return default, pd.DataFrame(columns=cols)
    r = cmp["ranks_per_node"].to_numpy(float)
    r0 = cmp["base_ranks"].to_numpy(float)
    y = np.log(cmp["slowdown"].to_numpy(float))
    grid = np.exp(np.linspace(0.0, np.log(dev), 2001)) if dev > 1 else np.array([1.0])
    model = np.log(_share(r[None, :], grid[:, None]) / _share(r0[None, :], grid[:, None]))
    # each comparison's own S (the grid point its slowdown implies; ties -> the largest S),
    # then their median: one run caught by a burst of load on a shared host moves a
    # least-squares fit, not the median
    miss = np.abs(model - y[None, :])
    own = grid[len(grid) - 1 - np.argmin(miss[::-1], axis=0)]
    s = float(np.median(own))
    rmax = int(r.max())
    table = cmp[cols].reset_index(drop=True).assign(implied_slots=own)
    slow = ", ".join(f"{a:.2f}x at {int(b)} vs {int(c)} ranks" for a, b, c in zip(cmp["slowdown"], r, r0))
    if np.isclose(s, dev):
        note = (
            f"no slowdown beyond time-sharing of {devices_per_node} device(s) per node seen up to {rmax} ranks "
            f"per node ({slow}); S = devices per node (a bound)"
        )
        return Param(dev, unit="slots", status=UNIDENTIFIABLE, note=note), table
    n = len(own)
    # the median's standard error: sqrt(pi / 2) * sigma / sqrt(n), sigma from the spread of the runs
    stderr = float(np.sqrt(np.pi / 2) * np.std(own, ddof=1) / np.sqrt(n)) if n > 1 else None
    status = FITTED
    note = (
        f"median over {n} comparison(s) of the slots each slowdown implies; per-rank compute slowdown {slow}"
    )
    if np.isclose(s, 1.0):
        status = UNIDENTIFIABLE
        note += "; at least as slow as one slot shared by all ranks (S = 1 is a bound)"
    return Param(s, stderr=stderr, unit="slots", status=status, note=note), table
