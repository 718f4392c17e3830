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

import math

import msgspec
import numpy as np
import pandas as pd
from calib.ingest.collective_calls import _decode_many, itemsize
from calib.ingest.events import RUNTIME, Events, _Codes
from calib.ingest.timeline import Timeline

from calib.core.schema import KERNEL_CLASSES, empty_table

#: element counts and byte totals beyond this are not real tensors (and would overflow int64)
_MAX_COUNT = 1 << 62


def _tensor_sizes(dims: object, types: object) -> tuple[int, int, int]:
    """(bytes of all tensor inputs, elements of the largest one, product of its leading
    dimensions -- all but the last); zeros when unknown.  The leading product tells an
    activation ([b, s, w]: b s) from a weight ([in, out]: in) of the same size.  A tensor
    with a negative dimension, an unknown dtype or more than 2^62 elements is left out."""
    if not (isinstance(dims, list) and isinstance(types, list)):
        return 0, 0, 0
    total, largest, lead = 0, 0, 0
    for d, t in zip(dims, types):
        if not (isinstance(d, list) and d and all(type(v) is int for v in d)):
            continue
        n = math.prod(d)
        size = itemsize(t)
        if n < 0 or n > _MAX_COUNT or size < 0 or min(d) < 0:
            continue
        total = min(total + n * size, _MAX_COUNT)
        if n > largest:
            largest, lead = n, math.prod(d[:-1])
    return total, largest, lead


def _shape_sizes(ev: Events, ops: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_tensor_sizes` of each op event in ``ops``: every distinct (Input Dims, Input
    type) pair is decoded and counted once (a training step repeats a few hundred shapes)."""
    raw_d, raw_t = ev.args_table(ops, ("input_dims", "input_type"))
    codes = _Codes()  # (dims, types) JSON -> code in order of first sight, at C speed
    inv = np.fromiter(
        map(codes.__getitem__, zip(map(bytes, raw_d), map(bytes, raw_t))), dtype=np.int64, count=len(raw_d)
    )
    distinct = list(codes)  # code k is distinct[k]
    dims = _decode_many([msgspec.Raw(d) for d, _ in distinct])
    types = _decode_many([msgspec.Raw(t) for _, t in distinct])
    sizes = np.array([_tensor_sizes(d, t) for d, t in zip(dims, types, strict=True)], dtype=np.int64)
    sizes = sizes.reshape(-1, 3)[inv]
    return sizes[:, 0], sizes[:, 1], sizes[:, 2]


def _unique_inverse(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` for integers by numpy's stable sort, which is
    several times faster on values that come mostly in order (launching ops, names)."""
    order = np.argsort(a, kind="stable")
    s = a[order]
    first = np.ones(len(s), dtype=bool)
    first[1:] = s[1:] != s[:-1]
    inv = np.empty(len(a), dtype=np.intp)
    inv[order] = np.cumsum(first) - 1
    return s[first], inv


def _window_of(tl: Timeline, t: np.ndarray) -> np.ndarray:
    """Index of the window holding each time, -1 outside every window."""
    wid = np.searchsorted(tl.win_start, t, side="right") - 1
    return np.where((wid >= 0) & (t < tl.win_end[np.maximum(wid, 0)]), wid, -1)


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
    uniq, inv = _unique_inverse(op_ev)
    valid = uniq >= 0
    u_bytes = np.zeros(len(uniq), dtype=np.int64)
    u_numel = np.zeros(len(uniq), dtype=np.int64)
    u_lead = np.zeros(len(uniq), dtype=np.int64)
    if valid.any():
        u_bytes[valid], u_numel[valid], u_lead[valid] = _shape_sizes(ev, uniq[valid])
    # group on integer codes that sort as the strings do (grouping strings is slower);
    # same groups, same order, same rows summed in the same order
    # np.unique of the op name strings, sorting only the distinct names (a few hundred)
    name_uniq, name_inv = _unique_inverse(np.where(valid, ev.name[np.maximum(uniq, 0)], -1))
    name_str = np.where(name_uniq >= 0, ev.names[np.maximum(name_uniq, 0)], "").astype(object)
    op_names, str_inv = np.unique(name_str, return_inverse=True)
    op_code = str_inv.reshape(-1)[name_inv]
    cls_names = np.array(sorted(KERNEL_CLASSES), dtype=object)
    cls_code = np.array([sorted(KERNEL_CLASSES).index(c) for c in KERNEL_CLASSES])
    keys = ["rank", "iteration", "kernel_class", "op", "numel", "lead", "in_bytes"]
    df = pd.DataFrame(
        {
            "rank": np.int32(rank),
            "iteration": _iteration_of(tl, tl.act_start),
            "kernel_class": cls_code[tl.act_class],
            "op": op_code.reshape(-1)[inv.reshape(-1)],
            "numel": u_numel[inv],
            "lead": u_lead[inv],
            "in_bytes": u_bytes[inv],
            "dur_s": (tl.act_end - tl.act_start) * 1e-9,
        }
    )
    ops = df.groupby(keys, sort=True)["dur_s"].agg(count="size", dur_s="sum").reset_index()
    ops["kernel_class"] = cls_names[ops["kernel_class"].to_numpy()]
    ops["op"] = op_names[ops["op"].to_numpy()].astype(object)
    ops["count"] = ops["count"].astype(np.int64)
    return {"device_ops": ops, "host_steps": _host_steps(ev, tl, rank)}


def _host_steps(ev: Events, tl: Timeline, rank: int) -> pd.DataFrame:
    """Per iteration: host ops (all levels), kernel launches, and the last launch's offset."""
    rt = np.flatnonzero(ev.kind == RUNTIME)
    launch_name = np.array(["Launch" in n for n in ev.names], dtype=bool)  # per unique name
    launch = rt[launch_name[ev.name[rt]]]
    # per window (slot 0: outside every window), in one pass over the events
    nw = len(tl.iteration)
    slot_l = _window_of(tl, ev.start[launch]) + 1
    n_ops = np.bincount(_window_of(tl, ev.start[tl.ops]) + 1, minlength=nw + 1)
    n_launch = np.bincount(slot_l, minlength=nw + 1)
    last_start = np.full(nw + 1, np.iinfo(np.int64).min)
    np.maximum.at(last_start, slot_l, ev.start[launch])
    rows = []
    for w, it in enumerate(tl.iteration):
        if it < 0 and len(tl.iteration) > 1:
            continue
        # iteration -1 (no steps: one window) also owns what lies outside the window
        slots = [0, w + 1] if it < 0 else [w + 1]
        n_l = int(n_launch[slots].sum())
        last = (last_start[slots].max() - tl.win_start[w]) * 1e-9 if n_l else np.nan
        rows.append((rank, int(it), int(n_ops[slots].sum()), n_l, float(last)))
    out = pd.DataFrame(rows, columns=["rank", "iteration", "n_host_ops", "n_launches", "host_issue_s"])
    return out.astype(
        {"rank": np.int32, "iteration": np.int64, "n_host_ops": np.int64, "n_launches": np.int64}
    )
