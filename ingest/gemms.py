"""Matmul operators with their shapes and device time (record_shapes traces).

These feed the GEMM model (achieved FLOP/s per shape) and the "work per operator" axis
of k1 and k2.  Every device GEMM is counted exactly once: only matmul ops
(``aten::mm``/``addmm``/``bmm``/``baddbmm``, FP8's ``_scaled_mm``, MoE's grouped
``_grouped_mm``/``_scaled_grouped_mm``) that contain no other matmul op are kept.
The composites that call them (``aten::linear``, ``aten::matmul``) are not matmul ops
here, and a matmul nested in a matmul -- autocast re-dispatching ``aten::addmm`` into
``aten::addmm``, as HF's Conv1D does under bf16 autocast -- keeps only the inner one,
which launched the kernels.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pandas as pd
from calib.ingest.collective_calls import _decode_many
from calib.ingest.events import Events, _Codes
from calib.ingest.timeline import Timeline

from calib.core.schema import empty_table

#: op name -> positions of (A, B) in Input Dims; C = A @ B with A (..., m, k), B (..., k, n)
MATMUL_OPS = {
    "aten::mm": (0, 1),
    "aten::addmm": (1, 2),
    "aten::_addmm_activation": (1, 2),
    "aten::bmm": (0, 1),
    "aten::baddbmm": (1, 2),
    "aten::_scaled_mm": (0, 1),  # FP8: A (m, k) e4m3/e5m2, B (k, n), per-tensor scales
    "aten::_grouped_mm": (0, 1),  # MoE experts: ragged groups along m, n or k (offs)
    "aten::_scaled_grouped_mm": (0, 1),
}
#: grouped matmuls: the groups split one of m, n, k (2D operands; FLOPs 2 m n k in all)
#: or are a batch (both operands 3D: batch = groups)
GROUPED_OPS = frozenset({"aten::_grouped_mm", "aten::_scaled_grouped_mm"})


def fp8_operands(dtype: pd.Series) -> np.ndarray:
    """Which GEMMs ran on FP8 operands (e4m3 / e5m2), from the gemms table's dtype column."""
    return dtype.astype(str).str.contains("Float8", regex=False).to_numpy()


def compute(ev: Events, tl: Timeline, rank: int) -> pd.DataFrame:
    """One row per matmul op with shapes; ``dur_s`` is its kernels' time (GPU) or its own (CPU)."""
    if len(tl.ops) == 0:
        return empty_table("gemms")
    mm_name = np.isin(ev.names, list(MATMUL_OPS))  # over unique names, then per op
    sel = np.flatnonzero(mm_name[ev.name[tl.ops]])
    if len(sel) == 0:
        return empty_table("gemms")
    sel = sel[innermost(ev, tl.ops[sel])]
    if len(sel) == 0:
        return empty_table("gemms")
    ev_idx = tl.ops[sel]
    sel_names = ev.names[ev.name[ev_idx]]
    # shapes per distinct (op name, Input Dims, Input type): a step repeats a few dozen
    codes = _Codes()
    inv = np.fromiter(
        map(
            codes.__getitem__,
            zip(
                ev.name[ev_idx].tolist(),
                map(bytes, ev.arg(ev_idx, "input_dims")),
                map(bytes, ev.arg(ev_idx, "input_type")),
            ),
        ),
        dtype=np.int64,
        count=len(ev_idx),
    )
    distinct = list(codes)
    u_names = [ev.names[c] for c, _, _ in distinct]
    dims = _decode_many([msgspec.Raw(d) for _, d, _ in distinct])
    types = _decode_many([msgspec.Raw(t) for _, _, t in distinct])
    m = np.full(len(distinct), -1, dtype=np.int64)
    n = m.copy()
    k = m.copy()
    batch = np.ones(len(distinct), dtype=np.int64)
    dtype = []
    for j, (name, d, t) in enumerate(zip(u_names, dims, types, strict=True)):
        ia, ib = MATMUL_OPS[name]
        dtype.append(t[ia] if isinstance(t, list) and len(t) > ia and isinstance(t[ia], str) else None)
        if not (isinstance(d, list) and len(d) > ib):
            continue
        a, b = d[ia], d[ib]
        if not (_shape(a) and _shape(b)) or len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            continue
        m[j], k[j], n[j] = a[-2], a[-1], b[-1]
        if name in GROUPED_OPS:  # 3D x 2D splits n, 2D x 3D splits m: one group's batch is 1
            batch[j] = a[0] if len(a) == 3 and len(b) == 3 else 1
        else:
            batch[j] = int(np.prod(a[:-2], dtype=np.int64)) if len(a) > 2 else 1
    m, n, k, batch = m[inv], n[inv], k[inv], batch[inv]
    dtype = [dtype[i] for i in inv.tolist()]
    ok = m >= 0
    if tl.device == "gpu":
        # device time of the kernels each op launched (act_launch_op indexes tl.ops)
        lo = tl.act_launch_op
        has = lo >= 0
        dur_by_op = np.bincount(
            lo[has], weights=(tl.act_end - tl.act_start)[has].astype(float), minlength=len(tl.ops)
        )
        dur = dur_by_op[sel] * 1e-9
    else:
        dur = (ev.end[ev_idx] - ev.start[ev_idx]) * 1e-9
    wid = np.searchsorted(tl.win_start, ev.start[ev_idx], side="right") - 1
    inside = (wid >= 0) & (ev.start[ev_idx] < tl.win_end[np.maximum(wid, 0)])
    iteration = np.where(inside, tl.iteration[np.maximum(wid, 0)], -1)
    df = pd.DataFrame(
        {
            "rank": np.int32(rank),
            "iteration": iteration.astype(np.int64),
            "op": sel_names.astype(object),
            "m": m,
            "n": n,
            "k": k,
            "batch": batch,
            "flops": 2.0 * m * n * k * batch,
            "dtype": dtype,
            "dur_s": dur,
            "device": tl.device,
        }
    )
    return df[ok].reset_index(drop=True)


def innermost(ev: Events, idx: np.ndarray) -> np.ndarray:
    """Mask of the ops in ``idx`` that contain no other op of ``idx`` (same thread).

    Host ops nest properly, so an op contains another one of the set exactly when the
    next one (by thread, then start) begins before it ends.
    """
    th, st, en = ev.thread[idx].astype(np.int64), ev.start[idx], ev.end[idx]
    order = np.lexsort((-en, st, th))
    th_o, st_o, en_o = th[order], st[order], en[order]
    outer = np.zeros(len(idx), dtype=bool)
    outer[:-1] = (th_o[1:] == th_o[:-1]) & (st_o[1:] < en_o[:-1])
    keep = np.empty(len(idx), dtype=bool)
    keep[order] = ~outer
    return keep


def _shape(x: object) -> bool:
    return isinstance(x, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in x)


def per_window(gemms: pd.DataFrame, iterations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n_gemms, gemm_flops) per iteration; flops NaN where the trace has no shapes."""
    if gemms.empty:
        return np.zeros(len(iterations), dtype=np.int64), np.full(len(iterations), np.nan)
    g = gemms.groupby("iteration")["flops"].agg(["count", "sum"])
    g = g.reindex(iterations)
    return g["count"].fillna(0).to_numpy(np.int64), g["sum"].to_numpy(float)
