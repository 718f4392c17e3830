"""Cross-check of calib's GPU numbers against HTA (Holistic Trace Analysis) on the same traces.

HTA (``traceinsight``, ``import hta``) is imported lazily, inside :func:`hta_totals`, so
this module costs nothing on calib's core import path; nothing in calib imports it.

What HTA's numbers mean (traceinsight 0.6.1, read from its source):

- **Kept kernels.**  ``Trace.load_traces`` keeps a GPU activity (kernel, memcpy, memset:
  ``stream >= 0`` and ``correlation >= 0``) only if a host event (``cpu_op``,
  ``user_annotation``, ``*_runtime``) with the same correlation id *starts before the
  last* ``ProfilerStep#N``: the last iteration is trimmed, and device work whose launch is
  not in the trace is dropped.  With fewer than two ProfilerStep names nothing is trimmed.
- **Kernel types** (``hta.utils.get_kernel_type``, by name): COMMUNICATION =
  ``^nccl|^hip|^hccl|ncclKernel``; MEMORY = ``^Memcpy|^Memset|^dma``; COMPUTATION = the
  rest (except sync/launch names).
- **Temporal breakdown**, per rank, in µs over the kept kernels: ``kernel_time`` = last
  end - first start; ``idle_time`` = kernel_time - |union of all kept kernels|;
  ``compute_time`` = |union of COMPUTATION kernels| (time overlapped by communication
  included); ``non_compute_time`` = the rest (only communication and/or memory running).
- **Kernel breakdown**: per kernel name and rank, *summed durations* (not unions; rows
  beyond the top kernels are merged into "others", which keeps the sums).  The per-type
  table is different: an interval sweep over the union of each type, labelled by the
  combination running ("COMPUTATION overlapping COMMUNICATION", ...), summed over ranks.
- **Rounding.**  Traces with fractional-µs timestamps (newer Kineto) are rounded inward
  by default (``ts`` -> ceil, end -> floor, pytorch/pytorch#122425), shortening each
  activity by up to 2 µs; ``HTA_DISABLE_NS_ROUNDING=1`` keeps them.  The per-type sweep
  also truncates each swept segment to whole µs (``astype(int)``).

calib's side of each quantity comes from calib's own machinery (timeline, classification
rules, priority sweep, tables), evaluated over the span HTA uses (:func:`calib_totals`
with ``span="hta"``), or from the per-iteration tables ``calib ingest`` publishes
(``span="published"``).  Reproduce the table of ``docs/hta-crosscheck.md`` with
``python benchmarks/hta_compare.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pandas as pd
from calib.ingest import buckets as _buckets
from calib.ingest import collective_calls as _collectives
from calib.ingest.events import ANNOTATION, OP, RUNTIME, Events, normalise, profiler_steps
from calib.ingest.reader import read_trace
from calib.ingest.rules import DEFAULT_RULES, Rules
from calib.ingest.timeline import MEMORY_CLASSES, Timeline
from calib.ingest.timeline import build as build_timeline

from calib.core.schema import KERNEL_CLASSES

US = 1e6  # seconds -> µs

#: The compared quantities (µs), HTA's source for each, and calib's counterpart.
QUANTITIES: dict[str, tuple[str, str]] = {
    "span": (
        "temporal kernel_time(us)",
        "wall of one window from the first to the last kept device activity",
    ),
    "idle": ("temporal idle_time(us)", "intra_op_s + inter_op_s + other_s (device idle)"),
    "compute_union": ("temporal compute_time(us)", "compute_busy_s"),
    "non_compute": ("temporal non_compute_time(us)", "comm_s + kernel_s - compute_busy_s"),
    "compute_sum": ("kernel breakdown, sum (us) of COMPUTATION", "kernels.busy_s, non-memory classes"),
    "comm_sum": ("kernel breakdown, sum (us) of COMMUNICATION", "collectives.dur_s summed"),
    "memory_sum": ("kernel breakdown, sum (us) of MEMORY", "kernels.busy_s, memcpy + memset"),
    "comm_union": ("kernel-type sweep, rows with COMMUNICATION", "comm_s"),
    "comm_exposed": (
        "kernel-type sweep, rows with COMMUNICATION but not COMPUTATION",
        "comm_exposed_s",
    ),
}

#: Quantities whose meaning does not depend on where iteration windows start and end.
BUSY_QUANTITIES = (
    "compute_union",
    "non_compute",
    "compute_sum",
    "comm_sum",
    "memory_sum",
    "comm_union",
    "comm_exposed",
)

ALL = "all"  # the rank label of totals over all ranks of a trace set


# --------------------------------------------------------------------------- HTA side


def hta_totals(paths: Sequence[str | Path], *, ns_rounding: bool = True) -> pd.DataFrame:
    """Run HTA on the traces (one job's ranks) and return its numbers in long form.

    The traces are copied into a temporary directory, which HTA loads as one job.  Rows:
    ``rank`` (str; ``"all"`` for sums over ranks), ``quantity`` (a key of
    :data:`QUANTITIES`), ``us``.  HTA's per-type sweep is summed over ranks, so
    ``comm_union`` and ``comm_exposed`` are per rank only for a single-rank job.
    """
    from calib.core.hta import trace_analysis

    with trace_analysis(paths, ns_rounding=ns_rounding) as ta:
        temporal = ta.get_temporal_breakdown(visualize=False)
        by_type, by_kernel = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)

    rows: list[tuple[str, str, float]] = []
    sums = by_kernel.groupby(["rank", "kernel_type"])["sum (us)"].sum()
    for _, t in temporal.iterrows():
        rank = int(t["rank"])
        rows += [
            (str(rank), "span", float(t["kernel_time(us)"])),
            (str(rank), "idle", float(t["idle_time(us)"])),
            (str(rank), "compute_union", float(t["compute_time(us)"])),
            (str(rank), "non_compute", float(t["non_compute_time(us)"])),
        ]
        for q, kind in (
            ("compute_sum", "COMPUTATION"),
            ("comm_sum", "COMMUNICATION"),
            ("memory_sum", "MEMORY"),
        ):
            rows.append((str(rank), q, float(sums.get((rank, kind), 0.0))))
    label = by_type["kernel_type"].astype(str)
    comm = label.str.contains("COMMUNICATION")
    comm_union = float(by_type.loc[comm, "sum"].sum())
    comm_exposed = float(by_type.loc[comm & ~label.str.contains("COMPUTATION"), "sum"].sum())
    df = pd.DataFrame(rows, columns=["rank", "quantity", "us"])
    total = df.groupby("quantity", sort=False)["us"].sum()
    all_rows = [(ALL, q, float(v)) for q, v in total.items()]
    all_rows += [(ALL, "comm_union", comm_union), (ALL, "comm_exposed", comm_exposed)]
    if len(temporal) == 1:
        r = str(int(temporal["rank"].iloc[0]))
        all_rows += [(r, "comm_union", comm_union), (r, "comm_exposed", comm_exposed)]
    return pd.concat([df, pd.DataFrame(all_rows, columns=df.columns)], ignore_index=True)


# ------------------------------------------------------------------------- calib side


def launch_status(ev: Events, dev: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For device activities ``dev`` (event indices): (kept by HTA, launch not in trace).

    HTA keeps an activity when a host event with its correlation id starts before the
    last ``ProfilerStep#N`` (everything, with fewer than two steps).  An activity whose
    correlation id no host event carries was queued before the profiler started: HTA
    drops it, calib's iteration windows count it where it runs.
    """
    host = np.flatnonzero(np.isin(ev.kind, (RUNTIME, OP, ANNOTATION)))
    host_corr = ev.int_arg(host, "correlation")
    dev_corr = ev.int_arg(dev, "correlation")
    launched = (dev_corr >= 0) & np.isin(dev_corr, host_corr[host_corr >= 0])
    steps, _ = profiler_steps(ev)
    if len(steps) < 2:
        return np.ones(len(dev), dtype=bool), ~launched
    early = host_corr[(ev.start[host] < ev.start[steps[-1]]) & (host_corr >= 0)]
    return launched & np.isin(dev_corr, early), ~launched


def _gpu_timeline(path: Path, rules: Rules) -> tuple[Events, Timeline, dict]:
    raw = read_trace(path)
    ev = normalise(raw)
    tl = build_timeline(ev, rules)
    if tl.device != "gpu":
        raise ValueError(f"{path}: not a GPU trace; HTA's breakdowns need device kernels")
    return ev, tl, raw.distributed_info


def _restrict(ev: Events, tl: Timeline, keep_act: np.ndarray, keep_comm: np.ndarray) -> Timeline:
    """The timeline of the kept activities, as one window from the first to the last."""
    cut = {}
    for f in fields(tl):
        v = getattr(tl, f.name)
        if f.name.startswith("act_") and isinstance(v, np.ndarray):
            cut[f.name] = v[keep_act]
        elif (f.name == "comm" or f.name.startswith("comm_")) and isinstance(v, np.ndarray):
            cut[f.name] = v[keep_comm]
    starts = np.concatenate([cut["act_start"], ev.start[cut["comm"]]])
    ends = np.concatenate([cut["act_end"], ev.end[cut["comm"]]])
    lo, hi = (int(starts.min()), int(ends.max())) if len(starts) else (0, 0)
    return replace(
        tl,
        **cut,
        win_start=np.array([lo], dtype=np.int64),
        win_end=np.array([hi], dtype=np.int64),
        iteration=np.array([-1], dtype=np.int64),
    )


def _totals_from_tables(
    rank: int, buckets: pd.DataFrame, kernels: pd.DataFrame, collectives: pd.DataFrame
) -> list[tuple[str, str, float]]:
    mem = kernels["kernel_class"].isin(MEMORY_CLASSES)
    b = buckets
    values = {
        "span": b["wall_s"].sum() * US,
        "idle": (b["intra_op_s"] + b["inter_op_s"] + b["other_s"]).sum() * US,
        "compute_union": b["compute_busy_s"].sum() * US,
        "non_compute": (b["comm_s"] + b["kernel_s"] - b["compute_busy_s"]).sum() * US,
        "compute_sum": kernels.loc[~mem, "busy_s"].sum() * US,
        "comm_sum": collectives["dur_s"].sum() * US,
        "memory_sum": kernels.loc[mem, "busy_s"].sum() * US,
        "comm_union": b["comm_s"].sum() * US,
        "comm_exposed": b["comm_exposed_s"].sum() * US,
        "n_compute": kernels.loc[~mem, "count"].sum(),
        "n_comm": len(collectives),
        "n_memory": kernels.loc[mem, "count"].sum(),
    }
    return [(str(rank), q, float(v)) for q, v in values.items()]


def _published_iterations(buckets: pd.DataFrame) -> np.ndarray:
    """The iterations HTA also covers: all but the last (HTA trims it) when there are two or more."""
    its = buckets["iteration"].to_numpy()
    return its[:-1] if len(its) >= 2 else its


def _calib_rank(path: Path, span: str, rules: Rules) -> list[tuple[str, str, float]]:
    if span == "published":
        from calib.ingest.orchestrate import ingest_rank

        r = ingest_rank(path, rules=rules)
        b, k, c = (r.tables[t] for t in ("buckets", "kernels", "collectives"))
        its = _published_iterations(b)
        return _totals_from_tables(
            r.rank, b[b["iteration"].isin(its)], k[k["iteration"].isin(its)], c[c["iteration"].isin(its)]
        )
    if span != "hta":
        raise ValueError(f"span must be 'hta' or 'published', not {span!r}")
    ev, tl, dist = _gpu_timeline(path, rules)
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else 0
    keep_act, _ = launch_status(ev, tl.act_event)
    keep_comm, _ = launch_status(ev, tl.comm)
    stl = _restrict(ev, tl, keep_act, keep_comm)
    tables = _buckets.compute(ev, stl, rank)
    coll = _collectives.compute(ev, stl, rank, dist)
    return _totals_from_tables(rank, tables["buckets"], tables["kernels"], coll)


def calib_totals(
    paths: Sequence[str | Path], *, span: str = "hta", rules: Rules = DEFAULT_RULES
) -> pd.DataFrame:
    """calib's counterparts of :data:`QUANTITIES`, same long form as :func:`hta_totals`.

    ``span="hta"``: calib's timeline, classification and sweep over exactly the device
    activities HTA keeps, as one window from the first to the last (like with like).
    ``span="published"``: the per-iteration tables ``calib ingest`` writes, summed over
    all iterations but the last (the iteration HTA trims).  Extra rows ``n_compute``,
    ``n_comm``, ``n_memory`` count the activities behind the sums.
    """
    rows: list[tuple[str, str, float]] = []
    for p in map(Path, paths):
        rows += _calib_rank(p, span, rules)
    df = pd.DataFrame(rows, columns=["rank", "quantity", "us"])
    total = df.groupby("quantity", sort=False)["us"].sum()
    return pd.concat(
        [df, pd.DataFrame([(ALL, q, float(v)) for q, v in total.items()], columns=df.columns)],
        ignore_index=True,
    )


def unmatched(path: str | Path, rules: Rules = DEFAULT_RULES) -> pd.DataFrame:
    """Device activities that calib's published iterations (all but the last) count and
    HTA does not keep, or the reverse, grouped by why: the set behind any difference
    between ``calib_totals(span="published")`` and HTA.

    Columns: ``side`` ("calib only" / "HTA only"), ``reason``, ``kind`` (compute, memory,
    comm by calib's rules), ``count``, ``dur_us`` (summed durations).  Empty when both
    count the same activities.
    """
    ev, tl, _ = _gpu_timeline(Path(path), rules)
    mem = np.isin(tl.act_class, [KERNEL_CLASSES.index(c) for c in MEMORY_CLASSES])
    dev = np.concatenate([tl.act_event, tl.comm])
    start = np.concatenate([tl.act_start, ev.start[tl.comm]])
    dur = np.concatenate([tl.act_end - tl.act_start, ev.end[tl.comm] - ev.start[tl.comm]]) / 1e3
    kind = np.concatenate([np.where(mem, "memory", "compute"), np.full(len(tl.comm), "comm")])
    n_pub = len(tl.win_start) - 1 if len(tl.win_start) >= 2 else len(tl.win_start)
    wid = np.searchsorted(tl.win_start, start, side="right") - 1
    in_pub = (wid >= 0) & (wid < n_pub)
    in_pub[in_pub] = start[in_pub] < tl.win_end[wid[in_pub]]
    kept, unlaunched = launch_status(ev, dev)
    reason = np.full(len(dev), "", dtype=object)
    calib_only = in_pub & ~kept
    reason[calib_only & unlaunched] = "launch not in the trace (queued before profiling began)"
    reason[calib_only & ~unlaunched] = "launched in the last step, which HTA trims; runs in an earlier window"
    reason[kept & ~in_pub] = "kept by HTA, outside the windows calib sums"
    sel = reason != ""
    df = pd.DataFrame(
        {
            "side": np.where(calib_only[sel], "calib only", "HTA only"),
            "reason": reason[sel],
            "kind": kind[sel],
            "dur_us": dur[sel],
        }
    )
    return (
        df.groupby(["side", "reason", "kind"], sort=True)
        .agg(count=("dur_us", "size"), dur_us=("dur_us", "sum"))
        .reset_index()
    )


# ---------------------------------------------------------------------------- compare


def compare(hta: pd.DataFrame, calib: pd.DataFrame) -> pd.DataFrame:
    """HTA and calib side by side: rank, quantity, hta_us, calib_us, diff_us, rel_diff.

    ``rel_diff`` = (calib - HTA) / |HTA| (0 when both are 0, inf when only HTA's is 0).
    Only quantities both sides give; the ``"all"`` rows only for jobs of several ranks.
    """
    m = hta.rename(columns={"us": "hta_us"}).merge(
        calib.rename(columns={"us": "calib_us"}), on=["rank", "quantity"], how="inner"
    )
    if (m["rank"] != ALL).any() and m.loc[m["rank"] != ALL, "rank"].nunique() == 1:
        m = m[m["rank"] != ALL]
    m = m.assign(diff_us=m["calib_us"] - m["hta_us"])
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = m["diff_us"].to_numpy() / m["hta_us"].abs().to_numpy()
    m["rel_diff"] = np.where(m["diff_us"].to_numpy() == 0, 0.0, rel)
    order = {q: i for i, q in enumerate(QUANTITIES)}
    key = m["rank"].map(lambda r: (1, 0) if r == ALL else (0, int(r)))
    m = m.assign(_r=key, _o=m["quantity"].map(order))
    return m.sort_values(["_r", "_o"]).drop(columns=["_r", "_o"]).reset_index(drop=True)


def markdown(table: pd.DataFrame, fixture: str) -> str:
    """Rows of a Markdown table: fixture, rank, quantity, HTA, calib, relative difference."""
    lines = []
    for _, r in table.iterrows():
        lines.append(
            f"| {fixture} | {r['rank']} | {r['quantity']} | {r['hta_us']:,.1f} | {r['calib_us']:,.1f} "
            f"| {round(100 * r['rel_diff'], 3) + 0.0:+.3f} % |"
        )
    return "\n".join(lines)
