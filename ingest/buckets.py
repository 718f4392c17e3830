"""Seed 004's time buckets, per iteration, from one priority sweep of the timeline.

Layers in priority order: communication; compute kernels by class; memcpy/memset; the
host waiting (sync, data loading) -> "other"; the host inside an operator -> intra-op
dispatch; nothing at all -> inter-op dispatch.  Each instant of an iteration window goes
to exactly one bucket, so the buckets sum to the wall time by construction.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.ingest.events import Events
from calib.ingest.intervals import Nesting, sorted_unique, sweep
from calib.ingest.timeline import CLASS_PRIORITY, MEMORY_CLASSES, Timeline

from calib.core.schema import KERNEL_CLASSES

NS = 1e-9
#: dispatch_ops label for intra-op time whose operators overlap without nesting
UNNESTED = "(overlapping, not nested ops)"


def compute(ev: Events, tl: Timeline, rank: int) -> dict[str, pd.DataFrame]:
    """Buckets, kernel-class shares and intra-op attribution for one rank."""
    s, e = ev.start, ev.end
    class_layers = []
    for cname in CLASS_PRIORITY:
        sel = tl.act_class == KERNEL_CLASSES.index(cname)
        class_layers.append((tl.act_start[sel], tl.act_end[sel]))
    layers = [(s[tl.comm], e[tl.comm]), *class_layers, (s[tl.waits], e[tl.waits]), (s[tl.ops], e[tl.ops])]
    sw = sweep(layers, tl.win_start, tl.win_end)
    nwin = len(tl.win_start)
    owned = sw.per_window(nwin)  # (W, K+1)
    n_cls = len(CLASS_PRIORITY)
    k_comm, k_cls0, k_wait, k_op, k_none = 0, 1, 1 + n_cls, 2 + n_cls, 3 + n_cls
    mem_cols = [k_cls0 + CLASS_PRIORITY.index(c) for c in MEMORY_CLASSES]
    compute_rows = [k_cls0 + i for i, c in enumerate(CLASS_PRIORITY) if c not in MEMORY_CLASSES]
    compute_active = sw.active[compute_rows].any(axis=0)
    wall = (tl.win_end - tl.win_start).astype(np.float64)

    first = _first_segment(tl.act_event)  # count each kernel (or CPU op) once
    n_kernels = _count_in_windows(tl.act_start[first], tl.win_start, tl.win_end)
    outer_ops = tl.ops[tl.op_nest.outermost]
    n_ops = _count_in_windows(s[outer_ops], tl.win_start, tl.win_end)
    buckets = pd.DataFrame(
        {
            "rank": np.int32(rank),
            "iteration": tl.iteration.astype(np.int64),
            "device": tl.device,
            "start_s": tl.win_start * NS,
            "wall_s": wall * NS,
            "comm_s": owned[:, k_comm] * NS,
            "comm_exposed_s": sw.sum_where(nwin, sw.active[k_comm] & ~compute_active) * NS,
            "kernel_s": owned[:, k_cls0 : k_cls0 + n_cls].sum(axis=1) * NS,
            "memcpy_s": owned[:, mem_cols].sum(axis=1) * NS,
            "intra_op_s": owned[:, k_op] * NS,
            "inter_op_s": owned[:, k_none] * NS,
            "other_s": owned[:, k_wait] * NS,
            "compute_s": (wall - owned[:, k_comm]) * NS,
            "compute_busy_s": sw.sum_where(nwin, compute_active) * NS,
            "n_kernels": n_kernels,
            "n_ops": n_ops,
            "n_gemms": np.zeros(nwin, dtype=np.int64),
            "gemm_flops": np.full(nwin, np.nan),
        }
    )

    # kernel classes: time_s partitions kernel_s; busy_s sums durations started in the window
    act_win = _window_of(tl.act_start, tl.win_start, tl.win_end)
    act_dur = (tl.act_end - tl.act_start).astype(np.float64)
    # one bincount over (class position, window): each bin sums the same durations in the
    # same order as a bincount per class would
    pos = np.full(len(KERNEL_CLASSES), -1, dtype=np.int64)
    pos[[KERNEL_CLASSES.index(c) for c in CLASS_PRIORITY]] = np.arange(n_cls)
    m = (pos[tl.act_class] >= 0) & (act_win >= 0)
    key = pos[tl.act_class[m]] * nwin + act_win[m]
    busy = np.bincount(key, weights=act_dur[m], minlength=n_cls * nwin)
    count = np.bincount(pos[tl.act_class[m & first]] * nwin + act_win[m & first], minlength=n_cls * nwin)
    kernels = pd.DataFrame(
        {
            "rank": np.int32(rank),
            "iteration": np.tile(tl.iteration.astype(np.int64), n_cls),
            "kernel_class": np.repeat(np.array(CLASS_PRIORITY, dtype=object), nwin),
            "time_s": owned[:, k_cls0 : k_cls0 + n_cls].T.reshape(-1) * NS,
            "busy_s": busy * NS,
            "count": count.astype(np.int64),
        }
    )
    dispatch = _intra_op_attribution(ev, tl, sw, k_op, rank)
    return {"buckets": buckets, "kernels": kernels, "dispatch_ops": dispatch}


def _first_segment(event: np.ndarray) -> np.ndarray:
    """True for the first interval of each event (CPU ops may own several self segments)."""
    first = np.zeros(len(event), dtype=bool)
    if len(event):
        order = np.argsort(event, kind="stable")
        ev_sorted = event[order]
        lead = np.ones(len(event), dtype=bool)
        lead[1:] = ev_sorted[1:] != ev_sorted[:-1]
        first[order[lead]] = True
    return first


def _window_of(t: np.ndarray, ws: np.ndarray, we: np.ndarray) -> np.ndarray:
    wid = np.searchsorted(ws, t, side="right") - 1
    ok = wid >= 0
    ok[ok] = t[ok] < we[wid[ok]]
    return np.where(ok, wid, -1)


def _count_in_windows(t: np.ndarray, ws: np.ndarray, we: np.ndarray) -> np.ndarray:
    wid = _window_of(t, ws, we)
    return np.bincount(wid[wid >= 0], minlength=len(ws)).astype(np.int64)


def _intra_op_attribution(ev: Events, tl: Timeline, sw, k_op: int, rank: int) -> pd.DataFrame:
    """Intra-op dispatch time per innermost host operator (seed 004 Table 6, intra-op rows).

    For each elementary segment owned by the intra-op layer, the innermost operator
    active on any compute thread (the most recently started) gets the segment's time.
    """
    seg = np.flatnonzero((sw.owner == k_op) & (sw.window >= 0))
    cols = {"rank": [], "iteration": [], "op": [], "intra_op_s": []}
    if len(seg) == 0 or len(tl.ops) == 0:
        return pd.DataFrame(cols).astype(
            {"rank": "int32", "iteration": "int64", "op": object, "intra_op_s": float}
        )
    t = sw.bounds[seg]
    nest: Nesting = tl.op_nest
    # The innermost op only changes at an op boundary: query where a run of consecutive
    # intra-op segments starts or crosses one, and carry the answer along the run.
    op_bounds = sorted_unique(np.concatenate([nest.start, nest.end]))
    pos = np.searchsorted(op_bounds, t)
    at_bound = (pos < len(op_bounds)) & (op_bounds[np.minimum(pos, len(op_bounds) - 1)] == t)
    new_run = np.ones(len(seg), dtype=bool)
    new_run[1:] = (seg[1:] != seg[:-1] + 1) | at_bound[1:]
    q = np.flatnonzero(new_run)
    best_q = np.full(len(q), -1, dtype=np.int64)
    best_start = np.full(len(q), np.iinfo(np.int64).min)
    for th in tl.host_threads:
        found = nest.innermost(np.full(len(q), th), t[q])
        ok = found >= 0
        later = ok & (nest.start[np.maximum(found, 0)] > best_start)
        best_q = np.where(later, found, best_q)
        best_start = np.where(later, nest.start[np.maximum(found, 0)], best_start)
    best = best_q[np.cumsum(new_run) - 1]
    # ops that overlap without nesting (misreported durations) defeat the innermost
    # query; their time is kept under one explicit label so the table sums to intra_op_s
    names = np.append(ev.names, UNNESTED)
    op_code = np.where(best >= 0, ev.name[tl.ops[np.maximum(best, 0)]], len(ev.names))
    # sum per (window, op) in sorted order; the lengths are whole nanoseconds, so every
    # float sum is exact and the same in any order (as pandas' groupby sum gave)
    n_codes = len(names)
    key = sw.window[seg].astype(np.int64) * n_codes + op_code
    length = sw.length[seg].astype(np.float64)
    nwin_codes = (int(sw.window[seg].max()) + 1) * n_codes
    if nwin_codes <= 1 << 22:  # few windows x names (always, in practice): no sort
        key_sum = np.bincount(key, weights=length, minlength=nwin_codes)
        present = np.bincount(key, minlength=nwin_codes) > 0
        key, total = np.flatnonzero(present), key_sum[present]
    else:
        key, inv = np.unique(key, return_inverse=True)
        total = np.bincount(inv.reshape(-1), weights=length, minlength=len(key))
    return pd.DataFrame(
        {
            "rank": np.int32(rank),
            "iteration": tl.iteration[key // n_codes].astype(np.int64),
            "op": names[key % n_codes].astype(object),
            "intra_op_s": total * NS,
        }
    )


def kernel_stats(ev: Events, tl: Timeline, rank: int) -> pd.DataFrame:
    """Per kernel (GPU) or compute op (CPU) name over the whole trace: count and time."""
    n_cls = len(KERNEL_CLASSES)
    key = ev.name[tl.act_event].astype(np.int64) * n_cls + tl.act_class
    uniq, inv = np.unique(key, return_inverse=True)
    first = _first_segment(tl.act_event)
    count = np.bincount(inv[first], minlength=len(uniq)).astype(np.int64)
    dur = np.bincount(inv, weights=(tl.act_end - tl.act_start).astype(np.float64), minlength=len(uniq)) * NS
    order = np.argsort(-dur, kind="stable")
    uniq, count, dur = uniq[order], count[order], dur[order]
    return pd.DataFrame(
        {
            "rank": np.full(len(uniq), rank, dtype=np.int32),
            "kernel_class": np.array(KERNEL_CLASSES, dtype=object)[uniq % n_cls],
            "name": ev.names[uniq // n_cls],
            "count": count,
            "dur_sum_s": dur,
            "dur_mean_s": dur / np.maximum(count, 1),
        }
    )
