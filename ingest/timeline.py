"""The device timeline of one rank: activities, iteration windows and host state.

GPU traces: the device activities are kernels, memcpys and memsets; each is tied to the
host call that launched it through its ``correlation`` id.  CPU-only (gloo) traces: the
"device" is the CPU itself; its kernels are the leaf operators that compute (not views
or allocation) on the compute threads, and communication is the ``gloo:*`` work on the
gloo threads.  Either way the rest of ingest sees the same arrays.

Iteration windows follow torch-tb-profiler's rule, so that a step owns the device work
it launched: window i runs from max(CPU start of step i, end of window i-1) to
max(CPU end of step i, end of the last device activity launched in step i).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from calib.ingest.events import (
    ANNOTATION,
    DEVICE_KINDS,
    MEMCPY,
    MEMSET,
    OP,
    OTHER,
    RUNTIME,
    Events,
    profiler_steps,
)
from calib.ingest.intervals import THREAD_STRIDE, Nesting, inside_any, sorted_unique
from calib.ingest.rules import Rules

from calib.core.schema import KERNEL_CLASSES

# Priority of kernel classes on the timeline when kernels of several classes overlap.
CLASS_PRIORITY = (
    "gemm",
    "attention",
    "normalization",
    "embedding",
    "optimizer",
    "copy_concat",
    "elementwise",
    "other",
    "memcpy",
    "memset",
)
MEMORY_CLASSES = ("memcpy", "memset")


@dataclass
class Timeline:
    device: str  # "gpu" or "cpu"
    # device activities (compute kernels, memory ops; not communication), as intervals
    act_start: np.ndarray  # ns
    act_end: np.ndarray
    act_event: np.ndarray  # index of the kernel event (GPU) or the owning host op (CPU)
    act_class: np.ndarray  # index into KERNEL_CLASSES
    act_launch: np.ndarray  # host launch time (ns), own start when unknown
    act_launch_op: np.ndarray  # index into ``ops`` of the launching host op, -1 unknown
    # communication intervals
    comm: np.ndarray  # event indices
    comm_launch: np.ndarray
    comm_launch_op: np.ndarray
    # host
    ops: np.ndarray  # event indices of host operators (on compute threads)
    op_nest: Nesting
    waits: np.ndarray  # event indices of host waits (sync, data loading)
    host_threads: np.ndarray  # thread codes of compute threads
    # iteration windows
    win_start: np.ndarray
    win_end: np.ndarray
    iteration: np.ndarray  # N of ProfilerStep#N, or [-1]
    notes: list[str]


def build(ev: Events, rules: Rules) -> Timeline:
    notes: list[str] = []
    names = ev.names
    gloo_thread = np.array(
        ["gloo" in (ev.thread_names.get(i) or "") for i in range(len(ev.threads))], dtype=bool
    )
    host_kinds = np.isin(ev.kind, (RUNTIME, OP, ANNOTATION)) & ~gloo_thread[ev.thread]
    waits = np.flatnonzero(_on_names(rules.is_wait, names, ev.name[host_kinds])[ev.name] & host_kinds)

    dev = ev.of_kind(*DEVICE_KINDS)
    # GPU: only device events can be communication; CPU: any event
    comm_name = _on_names(rules.is_comm, names, ev.name[dev]) if len(dev) else rules.is_comm(names)
    if len(dev):
        device = "gpu"
        ops = np.flatnonzero((ev.kind == OP) & ~gloo_thread[ev.thread])
        host_threads = sorted_unique(ev.thread[ops].astype(np.int64))
        op_nest = Nesting.build(ev.start[ops], ev.end[ops], ev.thread[ops])
        is_comm = comm_name[ev.name[dev]] & (ev.kind[dev] != MEMCPY) & (ev.kind[dev] != MEMSET)
        comm, act = dev[is_comm], dev[~is_comm]
        cls = _kernel_class(rules, names, ev.name[act])
        cls = np.where(ev.kind[act] == MEMCPY, KERNEL_CLASSES.index("memcpy"), cls)
        cls = np.where(ev.kind[act] == MEMSET, KERNEL_CLASSES.index("memset"), cls)
        rt = ev.of_kind(RUNTIME)
        dev_launch, dev_rt = _launch_times(ev, dev, rt)  # all device events in one lookup
        act_launch, act_rt = dev_launch[~is_comm], dev_rt[~is_comm]
        comm_launch, comm_rt = dev_launch[is_comm], dev_rt[is_comm]
        act_start, act_end, act_event = ev.start[act], ev.end[act], act
        act_launch_op = _launch_ops(ev, act_rt, op_nest)
        comm_launch_op = _launch_ops(ev, comm_rt, op_nest)
    else:
        device = "cpu"
        host_threads = sorted_unique(ev.thread[(ev.kind == OP) & ~gloo_thread[ev.thread]].astype(np.int64))
        ops = np.flatnonzero((ev.kind == OP) & np.isin(ev.thread, host_threads))
        op_nest = Nesting.build(ev.start[ops], ev.end[ops], ev.thread[ops])
        comm = np.flatnonzero(comm_name[ev.name] & np.isin(ev.kind, (ANNOTATION, OP, OTHER)))
        comm_launch, comm_launch_op = ev.start[comm], np.full(len(comm), -1)
        compute_op = rules.is_cpu_compute(names)[ev.name[ops]] & ~rules.is_host_only(names)[ev.name[ops]]
        compute_op &= ~comm_name[ev.name[ops]]
        act_start, act_end, owner = _self_segments(op_nest, compute_op)
        act_event = ops[owner]
        cls = _kernel_class(rules, names, ev.name[act_event])
        act_launch, act_launch_op = act_start, owner
        if not len(ops) and not len(comm):
            notes.append("no device kernels and no CPU operators")

    # optimizer-step kernels are class "optimizer" whatever their name
    opt = np.flatnonzero(rules.is_optimizer(names)[ev.name] & np.isin(ev.kind, (OP, ANNOTATION)))
    if len(opt) and len(act_start):
        in_opt = inside_any(act_launch, ev.start[opt], ev.end[opt])
        movable = ~np.isin(cls, [KERNEL_CLASSES.index(c) for c in MEMORY_CLASSES])
        cls = np.where(in_opt & movable, KERNEL_CLASSES.index("optimizer"), cls)

    win_start, win_end, iteration = _windows(ev, act_end, act_launch, comm, comm_launch, notes)
    return Timeline(
        device=device,
        act_start=act_start,
        act_end=act_end,
        act_event=act_event,
        act_class=cls,
        act_launch=act_launch,
        act_launch_op=act_launch_op,
        comm=comm,
        comm_launch=comm_launch,
        comm_launch_op=comm_launch_op,
        ops=ops,
        op_nest=op_nest,
        waits=waits,
        host_threads=host_threads,
        win_start=win_start,
        win_end=win_end,
        iteration=iteration,
        notes=notes,
    )


def _on_names(rule, names: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """``rule`` (a Rules.is_* method) per name code, run only on the names in ``codes``
    (False elsewhere): the long kernel names need not be scanned for host patterns."""
    present = np.zeros(len(names), dtype=bool)
    present[codes] = True
    idx = np.flatnonzero(present)
    out = np.zeros(len(names), dtype=bool)
    out[idx] = rule(names[idx])
    return out


def _kernel_class(rules: Rules, names: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Kernel class (int64 index into KERNEL_CLASSES) of events with name ``codes``; the
    rules run once per distinct name among them, not over every name of the trace."""
    present = np.zeros(len(names), dtype=bool)
    present[codes] = True
    uniq = np.flatnonzero(present)
    cls = np.zeros(len(names), dtype=np.int64)
    cls[uniq] = rules.kernel_class(names[uniq])
    return cls[codes]


def _self_segments(nest: Nesting, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Self time of host ops: the stretches where op i is the innermost op on its thread.

    On a CPU the operator itself computes; its children's time is theirs.  Returns the
    (start, end, op index) of each stretch whose innermost op satisfies ``keep``.
    """
    if len(nest.start) == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z
    key_s = nest.thread * THREAD_STRIDE + nest.start
    key_e = nest.thread * THREAD_STRIDE + nest.end
    bounds = sorted_unique(np.concatenate([key_s, key_e]))
    seg_thread, seg_t = np.divmod(bounds[:-1], THREAD_STRIDE)
    owner = nest.innermost(seg_thread, seg_t)
    ok = owner >= 0
    ok[ok] = keep[owner[ok]]
    # a segment never crosses into another thread: ends are within the same thread's key space
    seg_end = bounds[1:] - seg_thread * THREAD_STRIDE
    return seg_t[ok], seg_end[ok], owner[ok]


def _launch_times(ev: Events, dev_idx: np.ndarray, rt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host launch time of device events via correlation ids, and the runtime event index."""
    if len(dev_idx) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    dcorr = ev.int_arg(dev_idx, "correlation")
    rcorr = ev.int_arg(rt, "correlation")
    order = np.argsort(rcorr, kind="stable")
    rsorted = rcorr[order]
    pos = np.searchsorted(rsorted, dcorr)
    pos_ok = np.minimum(pos, max(len(rsorted) - 1, 0))
    found = (len(rsorted) > 0) & (dcorr >= 0)
    found = found & (rsorted[pos_ok] == dcorr) if len(rsorted) else np.zeros(len(dcorr), bool)
    rt_idx = np.where(found, rt[order][pos_ok] if len(rsorted) else -1, -1)
    launch = np.where(found, ev.start[np.maximum(rt_idx, 0)], ev.start[dev_idx])
    return launch, rt_idx


def _launch_ops(ev: Events, rt_idx: np.ndarray, nest: Nesting) -> np.ndarray:
    """Innermost host operator (index into ``ops``) around each launching runtime call."""
    out = np.full(len(rt_idx), -1, dtype=np.int64)
    ok = rt_idx >= 0
    if ok.any() and len(nest.start):
        out[ok] = nest.innermost(ev.thread[rt_idx[ok]], ev.start[rt_idx[ok]])
    return out


def _windows(
    ev: Events,
    act_end: np.ndarray,
    act_launch: np.ndarray,
    comm: np.ndarray,
    comm_launch: np.ndarray,
    notes: list[str],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps, number = profiler_steps(ev)
    dev_end_t = np.concatenate([act_end, ev.end[comm]])
    launch = np.concatenate([act_launch, comm_launch])
    if len(steps) == 0:
        lo, hi = int(ev.start.min()), int(ev.end.max())
        notes.append("no ProfilerStep#N events: the whole trace is one iteration (-1)")
        return np.array([lo]), np.array([max(hi, lo)]), np.array([-1])
    cpu_start, cpu_end = ev.start[steps], ev.end[steps]
    sid = np.searchsorted(cpu_start, launch, side="right") - 1
    inside = sid >= 0
    inside[inside] = launch[inside] < cpu_end[sid[inside]]
    dev_end = np.full(len(steps), np.iinfo(np.int64).min)
    if inside.any():
        np.maximum.at(dev_end, sid[inside], dev_end_t[inside])
    # running maximum keeps windows ordered and disjoint even for out-of-order device work
    end = np.maximum.accumulate(np.maximum(cpu_end, dev_end))
    start = cpu_start.copy()
    start[1:] = np.maximum(cpu_start[1:], end[:-1])
    return start, end, number
