"""The ingest facade: paths in, one run (RunMeta + tables) out.

:func:`ingest_rank` is a pure function of one trace file (file in, tables out), so any
executor -- a loop, a process pool, a Dask cluster -- can drive it; :func:`ingest`
finds the files, tells traces from nccl-tests logs by content, and assembles the run.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from calib.ingest import buckets as _buckets
from calib.ingest import collective_calls as _collectives
from calib.ingest import device_ops as _device_ops
from calib.ingest import frameworks as _frameworks
from calib.ingest import gemms as _gemms
from calib.ingest.capture.runconfig import OPTIONAL_SHAPE_KEYS, check_shape
from calib.ingest.discover import default_name, find_inputs, rank_hints
from calib.ingest.events import Events, read_events
from calib.ingest.executors import ExecutorSpec, RankJob, run_jobs
from calib.ingest.reader import InflateLimit, RawTrace
from calib.ingest.rules import DEFAULT_RULES, Rules
from calib.ingest.timeline import build as build_timeline

from calib.core.devices import limits_for, physics_warning
from calib.core.errors import InputError
from calib.core.schema import KIND_TRACE, Framework, ProcessGroup, RunMeta, SourceFile

FRAMEWORKS = ("ddp", "fsdp", "fsdp2", "deepspeed", "megatron", "zero", "pytorch", "unknown")


@dataclass(frozen=True)
class IngestOptions:
    """What the user can state; everything else is read from the traces."""

    system: str | None = None
    name: str | None = None
    framework: str | None = None
    zero_stage: int | None = None
    model: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)
    rules: Rules = DEFAULT_RULES
    #: leave out empty or cut-off nccl-tests logs of a directory (each recorded in the run's notes)
    skip_bad: bool = False

    def __post_init__(self) -> None:
        if self.framework is not None and self.framework not in FRAMEWORKS:
            raise InputError(
                "framework", f"unknown framework '{self.framework}' (known: {', '.join(FRAMEWORKS)})"
            )
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise InputError("zero_stage", f"ZeRO stage must be 0, 1, 2 or 3, not {self.zero_stage}")


@dataclass
class RankResult:
    """Everything ingest learns from one rank's trace."""

    rank: int
    source: SourceFile
    tables: dict[str, pd.DataFrame]
    world_size: int | None
    backend: str | None
    devices: tuple[str, ...]
    framework: Framework
    groups: tuple[ProcessGroup, ...]
    notes: tuple[str, ...]
    raw_bytes: int


def _gc_paused(fn):
    """Run ``fn`` with the cyclic garbage collector paused.

    Ingest allocates hundreds of thousands of small objects (decoded events, lists) that
    contain no cycles; generational collections over them cost as much as the analysis.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return wrapper


@_gc_paused
def ingest_rank(
    path: str | Path,
    rank_hint: int = 0,
    rules: Rules = DEFAULT_RULES,
    memory_budget_bytes: int | None = None,
) -> RankResult:
    """Analyse one Kineto trace file.  Pure: same file, same result.

    With ``memory_budget_bytes``, a trace too big to decode in that much memory is
    streamed in batches (``ingest.stream``); the tables are the same either way.
    """
    path = Path(path)
    raw, ev, read_notes = _read(path, memory_budget_bytes)
    dist = raw.distributed_info
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else rank_hint
    if len(ev) == 0:
        raise InputError(path, "trace has no complete ('X') events: nothing to measure")
    tl = build_timeline(ev, rules)
    if tl.device == "cpu" and len(tl.ops) == 0 and len(tl.comm) == 0:
        raise InputError(path, "trace has no GPU kernels and no CPU operators: nothing to measure")
    tables = _buckets.compute(ev, tl, rank)
    tables["kernel_stats"] = _buckets.kernel_stats(ev, tl, rank)
    gem = _gemms.compute(ev, tl, rank)
    n_g, f_g = _gemms.per_window(gem, tl.iteration)
    tables["buckets"] = tables["buckets"].assign(n_gemms=n_g, gemm_flops=f_g)
    tables["gemms"] = gem
    tables.update(_device_ops.compute(ev, tl, rank))
    tables["collectives"] = _collectives.compute(ev, tl, rank, dist)
    groups = _frameworks.process_groups(dist)
    framework = _frameworks.detect(ev, dist, groups)
    devices = tuple(sorted({str(p.get("name")) for p in raw.device_properties if p.get("name")})) or (
        ("cpu",) if tl.device == "cpu" else ()
    )
    notes = [*read_notes, *tl.notes]
    if tl.device == "gpu" and len(tl.act_start) and (tl.act_launch_op < 0).mean() > 0.5:
        notes.append("most kernels could not be tied to a launching host op (no correlation ids)")
    notes.extend(_physics_checks(tables, devices))
    unlaunched = _unlaunched_in_first_window(ev, tl)
    if unlaunched:
        notes.append(
            f"{unlaunched} device activities in iteration {int(tl.iteration[0])} were launched before the "
            "trace began (queued work of an unprofiled step): that iteration's buckets include them"
        )
    return RankResult(
        rank=rank,
        source=SourceFile(path=str(path), sha256=raw.sha256, size_bytes=raw.file_bytes, rank=rank),
        tables=tables,
        world_size=dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        devices=devices,
        framework=framework,
        groups=groups,
        notes=tuple(notes),
        raw_bytes=raw.raw_bytes,
    )


def _read(path: Path, budget: int | None) -> tuple[RawTrace, Events, list[str]]:
    """Decode in memory when the trace fits the budget (fastest), else stream it.

    The gzip trailer's size decides, but it can lie (or wrap at 4 GiB), so the in-memory
    inflate is bounded too and falls back to streaming when it overruns.
    """
    from calib.ingest import budget as memory

    if budget is None:
        raw, ev = read_events(path)
        return raw, ev, []
    if memory.fits_in_memory(path, budget):
        try:
            raw, ev = read_events(path, max_inflated_bytes=memory.max_in_memory_json(budget))
            return raw, ev, []
        except InflateLimit:
            pass
    from calib.ingest.stream import read_streaming

    raw, ev = read_streaming(path, memory.batch_bytes(budget), budget_bytes=budget)
    note = (
        f"streamed in batches: {memory.human(raw.raw_bytes)} of JSON would need about "
        f"{memory.human(raw.raw_bytes * memory.IN_MEMORY_BYTES_PER_JSON_BYTE)} decoded at once, "
        f"over this worker's {memory.human(budget)} budget"
    )
    return raw, ev, [note]


def _physics_checks(tables: dict[str, pd.DataFrame], devices: tuple[str, ...]) -> list[str]:
    """Kernel classes faster than the device can run: GEMM FLOP/s above the datasheet
    peak, streamed bytes/s above HBM bandwidth (inputs beyond the L2 cache only)."""
    lim = next((x for x in map(limits_for, devices) if x is not None), None)
    if lim is None:
        return []
    out = []
    g = tables["gemms"]
    g = g[(g["device"] == "gpu") & (g["dur_s"] > 0)]
    if len(g):
        # FP8 operands run against the FP8 peak: the least time the matmuls can take
        fp8 = _gemms.fp8_operands(g["dtype"])
        peak8 = lim.fp8_tflops or lim.bf16_tflops
        floor_s = (g["flops"].to_numpy() / np.where(fp8, peak8, lim.bf16_tflops)).sum() / 1e12
        if g["dur_s"].sum() < floor_s:
            tflops = g["flops"].sum() / g["dur_s"].sum() / 1e12
            peak = f"{lim.bf16_tflops:.0f} TFLOP/s" + (f" ({peak8:.0f} FP8)" if fp8.any() else "")
            out.append(
                physics_warning(
                    "gemm", f"matmuls run at {tflops:.0f} TFLOP/s, above the {peak} peak of {lim.source}"
                )
            )
    ops = tables.get("device_ops")
    if ops is not None and len(ops):
        big = ops[
            (ops["in_bytes"] > 256e6)
            & ops["kernel_class"].isin(["elementwise", "copy_concat", "normalization"])
        ]
        for cls, grp in big.groupby("kernel_class"):
            tbps = grp["in_bytes"].sum() / max(grp["dur_s"].sum(), 1e-12) / 1e12
            if tbps > lim.hbm_tbps * 1.05:
                out.append(
                    physics_warning(
                        str(cls),
                        f"kernels read {tbps:.2f} TB/s, above the {lim.hbm_tbps} TB/s HBM bandwidth of {lim.source}",
                    )
                )
    return out


def _unlaunched_in_first_window(ev, tl) -> int:
    """Device work running in the first window whose launch is not in the trace."""
    if tl.device != "gpu" or tl.iteration[0] < 0:
        return 0
    in_first = (tl.act_start < tl.win_end[0]) & (tl.act_end > tl.win_start[0])
    no_launch = (tl.act_launch == tl.act_start) & (tl.act_launch_op < 0)  # fell back to own start
    cs, ce = ev.start[tl.comm], ev.end[tl.comm]
    comm_first = (
        (cs < tl.win_end[0]) & (ce > tl.win_start[0]) & (tl.comm_launch == cs) & (tl.comm_launch_op < 0)
    )
    return int((in_first & no_launch).sum() + comm_first.sum())


def ingest(
    paths: Sequence[str | Path],
    options: IngestOptions,
    progress: Callable[[Iterable], Iterable] | None = None,
    executor: ExecutorSpec | None = None,
) -> tuple[RunMeta, dict[str, pd.DataFrame]]:
    """Ingest traces (one run, all ranks) or nccl-tests logs (one run of samples).

    ``executor`` says how the ranks are run (serial, process pool, Dask) and with what
    memory budget; every executor gives the same run.
    """
    traces, logs, notes = find_inputs(paths, options.skip_bad)
    options, sidecar_notes = apply_run_config(paths, options)
    notes = [*notes, *sidecar_notes]
    name = options.name or default_name(paths)
    if logs:
        from calib.ingest.nccl_tests import ingest_nccl_tests

        meta, tables = ingest_nccl_tests(logs, name=name, system=options.system, skip_bad=options.skip_bad)
        return replace(meta, notes=(*meta.notes, *notes)), tables
    hints = rank_hints(traces)
    jobs = [RankJob(p, h, options.rules) for p, h in zip(traces, hints, strict=True)]
    results = run_jobs(jobs, executor or ExecutorSpec(), progress)
    return assemble(results, options, name, notes)


def apply_run_config(paths: Sequence[str | Path], options: IngestOptions) -> tuple[IngestOptions, list[str]]:
    """Fill what the user did not state from a captured run's ``run_config.json``.

    The sidecar (written by ``calib capture`` and ``fixtures/generate.py``) states the
    system, run name, framework and ZeRO stage (which traces cannot always tell) and the
    model shape.  Command-line options take precedence over it.
    """
    from calib.ingest.capture.runconfig import RUN_CONFIG_NAME as _NAME
    from calib.ingest.capture.runconfig import read_run_config

    dirs = [Path(p) for p in paths if Path(p).is_dir() and (Path(p) / _NAME).is_file()]
    if len(dirs) != 1:
        return options, ([f"{len(dirs)} run_config.json sidecars given; none applied"] if dirs else [])
    cfg = read_run_config(dirs[0])
    where = dirs[0] / _NAME
    fw = cfg.get("framework") if isinstance(cfg.get("framework"), dict) else {}
    name, stage = fw.get("name"), fw.get("zero_stage")
    if name is not None and name not in FRAMEWORKS:
        raise InputError(where, f"unknown framework '{name}' (known: {', '.join(FRAMEWORKS)})")
    if stage is not None and stage not in (0, 1, 2, 3):
        raise InputError(where, f"ZeRO stage must be 0, 1, 2 or 3, not {stage!r}")
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    full = cfg.get("shape_full") if isinstance(cfg.get("shape_full"), dict) else {}
    shape = {
        k: v
        for k, v in {**model, **full}.items()
        if k in ("d", "l", "a", "s", "V", "b", "kv", "ffn", *OPTIONAL_SHAPE_KEYS)
        and isinstance(v, int)
        and not isinstance(v, bool)
    }
    check_shape(shape, where)
    for key in ("precision", "family", "library"):
        if isinstance(cfg.get(key), str) and shape:
            shape[key] = cfg[key]
    if isinstance(cfg.get("params"), int) and shape:
        shape["params"] = cfg["params"]
    system = options.system or (cfg.get("system") if isinstance(cfg.get("system"), str) else None)
    if system is not None:
        from calib.core.store import check_name

        check_name("system", system)
    updated = replace(
        options,
        system=system,
        name=options.name or (cfg.get("name") if isinstance(cfg.get("name"), str) else None),
        framework=options.framework or name,
        zero_stage=options.zero_stage if options.zero_stage is not None else stage,
        model={**shape, **options.model},  # the options' keys take precedence
        measured=unprofiled_steps(cfg),
    )
    return updated, [f"stated by {where}: framework {name}, ZeRO stage {stage}, model {shape or '-'}"]


def unprofiled_steps(cfg: dict[str, Any]) -> dict[str, Any]:
    """Median step time of the steps timed after the profiler window (slowest rank).

    ``calib capture`` times every step of the loop on the host, each ending in a device
    synchronisation; the steps in phase "after" ran with the profiler off, so their median
    is the step time a prediction must match (the profiled steps are slower).
    """
    phases = cfg.get("step_phases")
    times = cfg.get("step_times_s")
    if not (isinstance(phases, list) and isinstance(times, dict)):
        return {}
    meds = []
    for t in times.values():
        if not isinstance(t, list):
            continue
        after = [
            float(x)
            for x, ph in zip(t, phases)
            if ph == "after" and isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
        ]
        if after:
            meds.append(float(np.median(after)))
    peak = cfg.get("peak_mem_bytes")
    mem = (
        {"peak_mem_bytes": int(peak)}
        if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0
        else {}
    )
    if not meds:
        return mem
    return {"step_s_unprofiled": max(meds), "steps_unprofiled": len(after), **mem}


def assemble(
    results: list[RankResult], options: IngestOptions, name: str, notes: Sequence[str] = ()
) -> tuple[RunMeta, dict[str, pd.DataFrame]]:
    """Combine per-rank results into one run, checking they belong together."""
    results = sorted(results, key=lambda r: r.rank)
    ranks = [r.rank for r in results]
    dup = sorted({r for r in ranks if ranks.count(r) > 1})
    if dup:
        files = [r.source.path for r in results if r.rank == dup[0]]
        raise InputError(
            files[1],
            f"rank {dup[0]} appears in more than one trace ({', '.join(files)}); "
            "ingest one job's traces per run",
        )
    worlds = {r.world_size for r in results if r.world_size is not None}
    if len(worlds) > 1:
        raise InputError(results[0].source.path, f"traces disagree on the world size {sorted(worlds)}")
    world = worlds.pop() if worlds else len(results)
    framework = _merge_frameworks([r.framework for r in results])
    if options.framework or options.zero_stage is not None:
        framework = replace(
            framework,
            name=options.framework or framework.name,
            zero_stage=options.zero_stage if options.zero_stage is not None else framework.zero_stage,
            stated=True,
        )
    tables = {
        key: pd.concat([r.tables[key] for r in results], ignore_index=True)
        for key in ("buckets", "kernels", "kernel_stats", "dispatch_ops", "collectives", "gemms")
    }
    for key in ("device_ops", "host_steps"):
        parts = [r.tables[key] for r in results if key in r.tables and len(r.tables[key])]
        if parts:
            tables[key] = pd.concat(parts, ignore_index=True)
    if len(results) > 1:
        from calib.ingest import crossrank

        tables["crossrank"] = crossrank.compute(tables["collectives"])
    groups = results[0].groups
    all_notes = [*notes, *(f"rank {r.rank}: {n}" for r in results for n in r.notes)]
    meta = RunMeta(
        name=name,
        kind=KIND_TRACE,
        system=options.system,
        created=datetime.now(UTC).replace(microsecond=0).isoformat(),
        calib_version=_version(),
        world_size=world,
        ranks=tuple(ranks),
        backend=results[0].backend,
        devices=tuple(sorted({d for r in results for d in r.devices})),
        framework=framework,
        process_groups=groups,
        parallel=_frameworks.parallel_layout(groups, world),
        model=dict(options.model),
        measured=dict(options.measured),
        sources=tuple(r.source for r in results),
        notes=tuple(all_notes),
    )
    return meta, tables


def _merge_frameworks(found: list[Framework]) -> Framework:
    """The most specific detection across ranks (ranks normally agree)."""
    known = [f for f in found if f.name != "unknown"]
    if not known:
        return found[0] if found else Framework()
    return max(
        known, key=lambda f: (f.zero_stage is not None, f.sharding_strategy is not None, len(f.detected_from))
    )


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("calib")
    except Exception:  # noqa: BLE001 - running from a source tree
        return "0.0.0+src"
