"""Which of the given paths are Kineto traces and which nccl-tests logs (by content), and
what a run is called and which rank each trace holds when the files do not say."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from calib.ingest.capture.runconfig import RUN_CONFIG_NAME
from calib.ingest.reader import sniff

from calib.core.errors import InputError

_TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_RE = re.compile(r"(?:rank|_r|-r)[-_]?(\d+)(?!.*\d)", re.I)


def find_inputs(
    paths: Sequence[str | Path], skip_bad: bool = False
) -> tuple[list[Path], list[Path], list[str]]:
    """Split the given files/directories into Kineto traces and nccl-tests logs, by content.

    Files named explicitly must be one or the other.  Inside directories, files that are
    neither (host lists, READMEs) are skipped and reported in the returned notes; an
    empty file (a failed job) is refused, or with ``skip_bad`` skipped and noted.
    """
    from calib.ingest.nccl_tests import looks_like_nccl_tests

    traces: list[Path] = []
    logs: list[Path] = []
    notes: list[str] = []
    if not paths:
        raise InputError("PATH", "give at least one trace file, nccl-tests log or directory")
    for p in map(Path, paths):
        if not p.exists():
            raise InputError(p, "no such file or directory")
        if p.is_dir():
            entries = sorted(f for f in p.rglob("*") if not f.name.startswith("."))
            broken = [f for f in entries if f.is_symlink() and not f.exists()]
            if broken:
                raise InputError(broken[0], "broken symbolic link: the file it points to is missing")
            files = [f for f in entries if f.is_file()]
            if not files:
                raise InputError(p, "directory has no files")
            explicit = False
        else:
            files, explicit = [p], True
        for f in files:
            if not explicit and f.name == RUN_CONFIG_NAME:
                continue  # the capture sidecar: read by ingest(), not a trace
            head = sniff(f, 4096)
            if not explicit and not head.strip():
                if not skip_bad:
                    raise InputError(
                        f, "empty file (a failed job?); remove it, or skip_bad to ingest the rest"
                    )
                notes.append(f"skipped bad file {f}: empty")
                continue
            first = head.lstrip()[:1]
            if first in ("{", "["):
                if not explicit and not f.name.endswith(_TRACE_SUFFIXES):
                    notes.append(f"skipped {f}: JSON but not named *.json/*.json.gz")
                    continue
                if not explicit and first == "{" and '"traceEvents"' not in sniff(f, 1 << 16):
                    notes.append(f"skipped {f}: JSON without 'traceEvents' in its first 64 KiB")
                    continue
                traces.append(f)
            elif looks_like_nccl_tests(head):
                logs.append(f)
            elif explicit:
                what = (
                    "empty file"
                    if not head.strip()
                    else "neither a Kineto trace (JSON) nor an nccl-tests log"
                )
                raise InputError(f, what)
            else:
                notes.append(f"skipped {f}: neither a trace nor an nccl-tests log")
    if not traces and not logs:
        raise InputError(paths[0], "no Kineto traces or nccl-tests logs found")
    if traces and logs:
        raise InputError(paths[0], "mixes Kineto traces and nccl-tests logs; ingest them as separate runs")
    return traces, logs, notes


def rank_hints(files: list[Path]) -> list[int]:
    hints = []
    for i, f in enumerate(files):
        m = _RANK_RE.search(f.name)
        hints.append(int(m.group(1)) if m else i)
    return hints


def default_name(paths: Sequence[str | Path]) -> str:
    from calib.core.store import safe_name

    first = Path(paths[0])
    name = safe_name(first.name if first.name else first.resolve().name)
    return name if len(paths) == 1 else f"{name}+{len(paths) - 1}"
