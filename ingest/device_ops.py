"""What each device kernel moved, and how fast the host issued the step (GPU traces).

Two small tables feed the physical compute model of ``calib fit``:

* ``device_ops``: kernels grouped by (iteration, class, launching op, largest input
  tensor, input bytes), from the launching op's ``Input Dims``/``Input type``
  (record_shapes traces).  A memory-bound kernel's time follows the bytes it moves, and
  the largest input tells which activation it streams (b*s*d, b*s*ffn, b*s*V, a weight).
* ``host_steps``: per iteration, how many host ops ran (all nesting levels) and when the
  host launched its last kernel, i.e. how long the CPU took to issue the step while the
  profiler was recording.  With the unprofiled step times of ``run_config.json`` this
  gives the host cost per operator and the profiler's own overhead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.ingest.collective_calls import _decode_many, itemsize
from calib.ingest.events import RUNTIME, Events
from calib.ingest.timeline import Timeline

from calib.core.schema import KERNEL_CLASSES, empty_table


def _tensor_sizes(dims: object, types: object) -> tuple[int, int, int]:
    """(bytes of all tensor inputs, elements of the largest one, product of its leading
    dimensions -- all but the last); zeros when unknown.  The leading product tells an
    activation ([b, s, w]: b s) from a weight ([in, out]: in) of the same size."""
    if not (isinstance(dims, list) and isinstance(types, list)):
        return 0, 0, 0
    total, largest, lead = 0, 0, 0
    for d, t in zip(dims, types):
        if isinstance(d, list) and d and all(isinstance(v, int) and not isinstance(v, bool) for v in d):
            n = int(np.prod(np.asarray(d, dtype=np.int64)))
            size = itemsize(t)
            if n < 0 or size < 0:
                continue
            total += n * size
            if n > largest:
                largest, lead = n, int(np.prod(np.asarray(d[:-1], dtype=np.int64))) if len(d) > 1 else 1
    return total, largest, lead


def _iteration_of(tl: Timeline, t: np.ndarray) -> np.ndarray:
    wid = np.searchsorted(tl.win_start, t, side="right") - 1
    inside = (wid >= 0) & (t < tl.win_end[np.maximum(wid, 0)])
    return np.where(inside, tl.iteration[np.maximum(wid, 0)], -1).astype(np.int64)


def compute(ev: Events, tl: Timeline, rank: int) -> dict[str, pd.DataFrame]:
    """``device_ops`` and ``host_steps`` for one rank (empty tables for CPU traces)."""
    if tl.device != "gpu" or len(tl.act_start) == 0:
        return {"device_ops": empty_table("device_ops"), "host_steps": empty_table("host_steps")}
    lo = tl.act_launch_op
    has = (lo >= 0) & (lo < len(tl.ops))
    op_ev = (
        np.where(has, tl.ops[np.clip(lo, 0, max(len(tl.ops) - 1, 0))], -1)
        if len(tl.ops)
        else np.full(len(lo), -1)
    )
    # decode the shapes once per launching op, not per kernel
    uniq, inv = np.unique(op_ev, return_inverse=True)
    valid = uniq >= 0
    dims = _decode_many(ev.arg(uniq[valid], "input_dims")) if valid.any() else []
    types = _decode_many(ev.arg(uniq[valid], "input_type")) if valid.any() else []
    u_bytes = np.zeros(len(uniq), dtype=np.int64)
    u_numel = np.zeros(len(uniq), dtype=np.int64)
    u_lead = np.zeros(len(uniq), dtype=np.int64)
    for j, (d, t) in zip(np.flatnonzero(valid), zip(dims, types, strict=True), strict=True):
        u_bytes[j], u_numel[j], u_lead[j] = _tensor_sizes(d, t)
    u_name = np.where(valid, ev.names[ev.name[np.maximum(uniq, 0)]].astype(str), "")
    df = pd.DataFrame(
        {
            "rank": np.int32(rank),
            "iteration": _iteration_of(tl, tl.act_start),
            "kernel_class": np.asarray(KERNEL_CLASSES, dtype=object)[tl.act_class],
            "op": u_name[inv].astype(object),
            "numel": u_numel[inv],
            "lead": u_lead[inv],
            "in_bytes": u_bytes[inv],
            "dur_s": (tl.act_end - tl.act_start) * 1e-9,
        }
    )
    ops = (
        df.groupby(["rank", "iteration", "kernel_class", "op", "numel", "lead", "in_bytes"], sort=True)[
            "dur_s"
        ]
        .agg(count="size", dur_s="sum")
        .reset_index()
    )
    ops["count"] = ops["count"].astype(np.int64)
    return {"device_ops": ops, "host_steps": _host_steps(ev, tl, rank)}


def _host_steps(ev: Events, tl: Timeline, rank: int) -> pd.DataFrame:
    """Per iteration: host ops (all levels), kernel launches, and the last launch's offset."""
    rt = np.flatnonzero(ev.kind == RUNTIME)
    names = ev.names[ev.name[rt]].astype(str)
    launch = rt[np.char.find(names, "Launch") >= 0]
    it_launch = _iteration_of(tl, ev.start[launch])
    it_ops = _iteration_of(tl, ev.start[tl.ops])
    rows = []
    for w, it in enumerate(tl.iteration):
        if it < 0 and len(tl.iteration) > 1:
            continue
        sel = launch[it_launch == it]
        last = (ev.start[sel].max() - tl.win_start[w]) * 1e-9 if len(sel) else np.nan
        rows.append((rank, int(it), int((it_ops == it).sum()), int(len(sel)), float(last)))
    out = pd.DataFrame(rows, columns=["rank", "iteration", "n_host_ops", "n_launches", "host_issue_s"])
    return out.astype(
        {"rank": np.int32, "iteration": np.int64, "n_host_ops": np.int64, "n_launches": np.int64}
    )
