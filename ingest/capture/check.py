"""Is a directory of traces calibration-ready?  A fast scan, no torch, no full ingest.

Levels: ``error`` (calib cannot use the directory: unreadable file, two files of one rank,
mixed runs), ``missing`` (usable, but calibration would lack something it needs: steps,
shapes, communication), ``warn`` (works, with a caveat the user should know) and
``ok``.  A directory is ready when it has no ``error`` and no ``missing``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from calib.ingest.capture.runconfig import RUN_CONFIG_NAME, rank_of_name, read_run_config

from calib.core.errors import InputError

ERROR, MISSING, WARN, OK = "error", "missing", "warn", "ok"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
TRACE_GLOBS = ("*.pt.trace.json.gz", "*.pt.trace.json", "*.json.gz", "*.json")


class _Args(msgspec.Struct, gc=False, frozen=True):
    """Only whether sizes are present matters; the decoder skips every other key."""

    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    nelems: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="In msg nelems")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    args: _Args = _NO_ARGS


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None  # noqa: N815 - Kineto's keys
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    calib: Any = None


_DECODER = msgspec.json.Decoder(_Trace)


@dataclass(frozen=True)
class TraceSummary:
    """What one trace file holds, as far as calibration cares."""

    path: Path
    rank: int | None
    rank_from: str  # "distributedInfo", "calib", "file name" or "none"
    world_size: int | None
    backend: str | None
    devices: tuple[str, ...]
    steps: tuple[int, ...]
    n_ops: int
    n_kernels: int
    n_comm: int
    comm_sized: int  # communication events that carry a message size
    shapes: bool
    system: str | None


@dataclass(frozen=True)
class Finding:
    level: str
    where: str
    message: str


@dataclass(frozen=True)
class CheckReport:
    run_dir: Path
    traces: tuple[TraceSummary, ...]
    config: dict[str, Any] | None
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    @property
    def ready(self) -> bool:
        return not any(f.level in (ERROR, MISSING) for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "ready": self.ready,
            "traces": [{**t.__dict__, "path": str(t.path)} for t in self.traces],
            "findings": [f.__dict__ for f in self.findings],
        }


def read_bytes(path: Path) -> bytes:
    """The JSON text of a trace, inflated when gzipped (ISA-L when available)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            from isal import igzip as gz
        except ImportError:  # pragma: no cover - isal is a dependency
            import gzip as gz
        try:
            data = gz.decompress(data)
        except (OSError, EOFError, ValueError) as exc:
            raise InputError(path, f"corrupt gzip: {exc}") from None
    return data


def summarize(path: str | Path) -> TraceSummary:
    """Scan one Kineto trace; an unreadable or non-Kineto file is an :class:`InputError`."""
    path = Path(path)
    try:
        doc = _DECODER.decode(read_bytes(path))
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    except msgspec.DecodeError as exc:
        raise InputError(path, f"not a Kineto trace (invalid JSON: {exc})") from None
    if doc.traceEvents is None:
        raise InputError(path, "not a Kineto trace (no traceEvents)")
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    meta = doc.calib if isinstance(doc.calib, dict) else {}
    rank, rank_from = info.get("rank"), "distributedInfo"
    if not isinstance(rank, int):
        rank, rank_from = meta.get("rank"), "calib"
    if not isinstance(rank, int):
        m = _RANK_IN_NAME.search(path.name)
        rank, rank_from = (int(m.group(1)), "file name") if m else (None, "none")
    world = info.get("world_size", meta.get("world_size"))
    devices = tuple(str(d.get("name", "?")) for d in (doc.deviceProperties or []) if isinstance(d, dict))

    steps: list[int] = []
    n_ops = n_kernels = n_comm = comm_sized = 0
    shapes = False
    for ev in doc.traceEvents:
        if ev.ph != "X" or not isinstance(ev.name, str):
            continue
        name, cat = ev.name, ev.cat
        if cat == "cpu_op":
            n_ops += 1
            if not shapes and len(ev.args.dims) > 2:  # "[]" is an op without tensor inputs
                shapes = True
            if name.startswith("c10d::") or name == "record_param_comms":
                n_comm += 1
                comm_sized += len(ev.args.nelems) > 0
        elif cat in ("kernel", "Kernel"):
            n_kernels += 1
            if "nccl" in name.lower() or "rccl" in name.lower():
                n_comm += 1
                comm_sized += len(ev.args.nelems) > 0
        elif cat == "user_annotation" and name.startswith("gloo:"):
            comm_sized += len(ev.args.dims) > 2
        m = _STEP.match(name)
        if m:
            steps.append(int(m.group(1)))
    return TraceSummary(
        path=path,
        rank=rank,
        rank_from=rank_from,
        world_size=world if isinstance(world, int) else None,
        backend=info.get("backend"),
        devices=devices or ("cpu",),
        steps=tuple(sorted(set(steps))),
        n_ops=n_ops,
        n_kernels=n_kernels,
        n_comm=n_comm,
        comm_sized=comm_sized,
        shapes=shapes,
        system=meta.get("system"),
    )


def trace_files(run_dir: Path) -> list[Path]:
    """Trace-looking files directly in ``run_dir`` (run_config.json excluded)."""
    seen: dict[Path, None] = {}
    for pattern in TRACE_GLOBS:
        for p in sorted(run_dir.glob(pattern)):
            if p.is_file() and p.name != RUN_CONFIG_NAME and not p.name.startswith("."):
                seen.setdefault(p, None)
    return list(seen)


def check_run(run_dir: str | Path) -> CheckReport:
    """Scan ``run_dir`` and say what calibration will and will not get from it."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise InputError(run_dir, "no such directory")
    files = [run_dir] if run_dir.is_file() else trace_files(run_dir)
    config_dir = run_dir.parent if run_dir.is_file() else run_dir
    findings: list[Finding] = []
    add = lambda level, where, msg: findings.append(Finding(level, str(where), msg))  # noqa: E731
    try:
        config = read_run_config(config_dir)
    except InputError as exc:
        config = None
        add(ERROR, exc.where, exc.problem)
    if not files:
        add(ERROR, run_dir, "no trace files (*.pt.trace.json[.gz]) here")
        return CheckReport(run_dir, (), config, tuple(findings))

    traces: list[TraceSummary] = []
    for f in files:
        try:
            traces.append(summarize(f))
        except InputError as exc:
            add(ERROR, exc.where, exc.problem)
    _check_set(traces, config, add, run_dir)
    for t in traces:
        _check_trace(t, add)
    if not findings:
        add(OK, run_dir, f"{len(traces)} trace(s), calibration-ready")
    return CheckReport(
        run_dir, tuple(sorted(traces, key=lambda t: (t.rank is None, t.rank or 0))), config, tuple(findings)
    )


def _check_set(traces: list[TraceSummary], config: dict[str, Any] | None, add: Any, run_dir: Path) -> None:
    ranks = [t.rank for t in traces if t.rank is not None]
    dupes = sorted({r for r in ranks if ranks.count(r) > 1})
    if dupes:
        add(ERROR, run_dir, f"several files for rank(s) {dupes}: one run per directory, one file per rank")
    worlds = {t.world_size for t in traces if t.world_size is not None}
    if len(worlds) > 1:
        add(ERROR, run_dir, f"files from runs of different world sizes {sorted(worlds)}")
    world = next(iter(worlds), None) or (config or {}).get("world_size")
    if config is not None and worlds and config.get("world_size") not in worlds:
        add(
            ERROR,
            run_dir / RUN_CONFIG_NAME,
            f"world_size {config.get('world_size')} does not match the traces' {sorted(worlds)}",
        )
    if (world or 0) > 1:
        absent = sorted(set(range(world or 0)) - set(ranks))
        if absent:
            shown = absent if len(absent) <= 8 else [*absent[:8], "..."]
            add(
                WARN,
                run_dir,
                f"{len(absent)} of {world} ranks have no trace ({shown}); "
                "per-rank buckets and imbalance cover only the ranks present",
            )
    if len({t.steps for t in traces}) > 1:
        add(WARN, run_dir, "ranks recorded different ProfilerStep numbers; iterations are matched by number")
    system = (config or {}).get("system") or next((t.system for t in traces if t.system), None)
    if not system:
        add(
            WARN,
            run_dir,
            "no system tag (neither a 'calib' trace metadata nor run_config.json): "
            "state the system at ingest",
        )
    if config is None:
        add(
            WARN,
            run_dir,
            "no run_config.json: the model shape (d, l, a, s, V, b) is unknown to calib; "
            "state it at ingest or write run_config.json when collecting the traces",
        )
    elif not (config.get("model") or {}).get("d"):
        add(WARN, run_dir / RUN_CONFIG_NAME, "run_config.json has no model shape (d, l, a, s, V, b)")


def _check_trace(t: TraceSummary, add: Any) -> None:
    where = t.path
    if t.rank is None:
        add(WARN, where, "rank unknown (no distributedInfo and no rank in the file name)")
    elif rank_of_name(t.path.name) is None:
        add(
            WARN,
            where,
            f"not named rank{t.rank}.pt.trace.json.gz (rank taken from {t.rank_from}); "
            "collecting the traces renames them",
        )
    if not t.steps:
        add(
            MISSING,
            where,
            "no ProfilerStep#N: profile with a wait/warmup/active schedule and call "
            "prof.step() (or capture(...).step()) once per iteration",
        )
    elif len(t.steps) < 2:
        add(WARN, where, f"only one profiled step ({t.steps[0]}): no iteration-to-iteration spread")
    if not t.shapes:
        add(
            MISSING,
            where,
            "no operator shapes (record_shapes=False): GEMM FLOPs and gloo message sizes are unknown",
        )
    if t.devices != ("cpu",) and t.n_kernels == 0:
        add(MISSING, where, "a GPU run without device kernels: add ProfilerActivity.CUDA to the activities")
    if (t.world_size or 1) > 1:
        if t.n_comm == 0:
            add(MISSING, where, f"world size {t.world_size} but no communication events")
        elif t.comm_sized == 0:
            add(
                WARN,
                where,
                "communication events carry no message sizes (record_shapes=False?): "
                "no bandwidth samples from this trace",
            )
