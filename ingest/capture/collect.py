"""Gather traces written by other tools into a calibration-ready run directory.

Megatron-LM (``--use-pytorch-profiler``), ``tensorboard_trace_handler`` and DeepSpeed's
own profiling write ``<host>_<pid>.<ns>.pt.trace.json`` files, often several runs in one
folder and without the model shape.  :func:`collect` copies the chosen traces to
``rank<R>.pt.trace.json.gz`` (rank from each trace's ``distributedInfo``), writes
``run_config.json`` with the system tag and model shape the user states, and checks the
result -- all into a temporary directory renamed into place at the end.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from calib.ingest.capture.check import CheckReport, check_run, summarize, trace_files
from calib.ingest.capture.runconfig import trace_name, write_run_config

from calib.core.atomic import DirExists, replacing_dir
from calib.core.errors import InputError


def _sources(paths: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = trace_files(p)
            if not found:
                raise InputError(p, "no trace files (*.pt.trace.json[.gz], *.json[.gz]) in this directory")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise InputError(p, "no such file or directory")
    return files


def collect(
    sources: Sequence[str | Path],
    out: str | Path,
    *,
    system: str | None = None,
    name: str | None = None,
    model: Mapping[str, Any] | None = None,
    framework: str | None = None,
    zero_stage: int | None = None,
    parallel: Mapping[str, int] | None = None,
) -> CheckReport:
    """Copy ``sources`` (files or directories of one run) into ``out`` and check it."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(out, "exists and is not empty; collect into a new directory")
    files = _sources(sources)
    summaries = [summarize(f) for f in files]
    by_rank: dict[int, Path] = {}
    for s in summaries:
        if s.rank is None:
            raise InputError(s.path, "rank unknown (no distributedInfo, no rank in the name)")
        if s.rank in by_rank:
            raise InputError(
                s.path,
                f"a second trace of rank {s.rank} (the first is {by_rank[s.rank]}); "
                "pass the files of one run only",
            )
        by_rank[s.rank] = s.path
    worlds = {s.world_size for s in summaries if s.world_size}
    if len(worlds) > 1:
        raise InputError(sources[0], f"traces of different world sizes {sorted(worlds)}: pass one run only")
    world = next(iter(worlds), None) or max(by_rank) + 1
    backend = next((s.backend for s in summaries if s.backend), None)

    try:
        # an empty ``out`` (checked above) is replaced; anything else there meanwhile is not
        with replacing_dir(
            out, replace=True, may_replace=lambda t: t.is_dir() and not any(t.iterdir())
        ) as tmp:
            for rank, src in sorted(by_rank.items()):
                dst = tmp / trace_name(rank)
                if src.read_bytes()[:2] == b"\x1f\x8b":
                    shutil.copyfile(src, dst)
                else:
                    _gzip(src, dst)
            write_run_config(
                tmp,
                {
                    "name": name or out.name,
                    "system": system,
                    "created": datetime.now(UTC).isoformat(timespec="seconds"),
                    "world_size": world,
                    "backend": backend,
                    "framework": {"name": framework, "zero_stage": zero_stage, "sharding_strategy": None},
                    "parallel": dict(parallel or {}),
                    "model": dict(model or {}),
                    "files": {str(r): trace_name(r) for r in sorted(by_rank)},
                    "collected_from": {str(r): str(p) for r, p in sorted(by_rank.items())},
                },
            )
    except DirExists:
        raise InputError(out, "exists and is not empty; collect into a new directory") from None
    return check_run(out)


def _gzip(src: Path, dst: Path) -> None:
    try:
        from isal import igzip as gz
    except ImportError:  # pragma: no cover - isal is a dependency
        import gzip as gz
    with open(src, "rb") as fin, gz.open(dst, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
