"""nccl-tests output logs (``all_reduce_perf`` & co.) into ``samples`` rows.

A log has a header (``# nThread .. nGpus ..``, one ``#  Rank N ... on HOST device D [bus]
NAME`` line per rank), a column header (``size count type redop root time algbw busbw
#wrong`` out-of-place then in-place) and one line per message size.  The log does not
name the collective, so it comes from a ``# Collective test starting: X_perf`` line when
present, else from the file name (``all_reduce_output.dat.5``); the trailing ``.dat.K``
is the environment setup index of the alcf-nccl-tests scripts.  Ranks, nodes and GPUs per
node come from the rank lines, never from the file name.

Nothing is skipped silently: inside a data section every line must be a measurement, an
NCCL library log line (``host:pid:tid [dev] NCCL INFO ...``, counted in a note) or a
comment; anything else is an :class:`InputError` naming the file and line.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from calib.core.collective_names import UNKNOWN, busbw_factor, canonical
from calib.core.errors import InputError
from calib.core.schema import KIND_NCCL_TESTS, SAMPLES, RunMeta, SourceFile

SOURCE = "nccl-tests"
HEAD_BYTES = 8192

_NTHREAD_RE = re.compile(r"^#\s*nThread\s+\d+\s+nGpus\s+\d+\s+minBytes\s+\d+", re.M)
_COLHDR_RE = re.compile(r"^#\s*size\s+count\s+type\b", re.M)
_RANK_RE = re.compile(
    r"^#\s*Rank\s+(?P<rank>\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+"
    r"(?P<dev>\d+)\s+\[[^\]]*\]\s*(?P<name>.*?)\s*$"
)
_TEST_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
_VERSION_RES = (
    re.compile(r"NCCL version\s+(\d+\.\d+(?:\.\d+)?)"),
    re.compile(r"nccl-library=(\d+\.\d+(?:\.\d+)?)"),
)
_PATH_VERSION_RE = re.compile(r"nccl[-_]?v?(\d+\.\d+(?:\.\d+)?)", re.I)
_SETUP_RE = re.compile(r"\.(?:dat|out|log|txt)\.(\d+)$")
_NCCL_LOG_RE = re.compile(r"^\S+:\d+:\d+\s+\[\d+\]\s+NCCL\s+(INFO|WARN|TRACE|ERROR)\b")
_END_RE = re.compile(r"^#\s*(Out of bounds values|Avg bus bandwidth)")
_FILENAME_COLL_RE = re.compile(
    r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|alltoall|broadcast|reduce|sendrecv|hypercube|gather|scatter)",
    re.I,
)


def looks_like_nccl_tests(head: str) -> bool:
    """True when ``head`` (the first few KB of a file) is nccl-tests output.

    Either the run header (``# nThread 1 nGpus 1 minBytes ...``) or the column header
    (``#  size  count  type ...``) must be present; both are printed by every version.
    """
    return bool(_NTHREAD_RE.search(head) or _COLHDR_RE.search(head))


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not a text file (byte {exc.start} is not UTF-8)") from None


def _collective_of(path: Path, lines: list[str]) -> str:
    for line in lines[:200]:
        m = _TEST_RE.match(line)
        if m:
            coll = canonical(m.group(1).removesuffix("_perf"))
            if coll != UNKNOWN:
                return coll
    # the longest collective-looking token in the file name ("reduce_scatter" over "reduce")
    tokens = sorted(_FILENAME_COLL_RE.findall(path.name), key=len, reverse=True)
    for tok in tokens:
        coll = canonical(tok)
        if coll != UNKNOWN:
            return coll
    raise InputError(
        path,
        "cannot tell which collective this nccl-tests log measures (no '# Collective test starting' "
        "line and no collective in the file name, e.g. all_reduce_output.dat)",
    )


def _nccl_version(path: Path, text: str) -> str:
    for rx in _VERSION_RES:
        m = rx.search(text)
        if m:
            return m.group(1)
    m = _PATH_VERSION_RE.search(str(path))
    return m.group(1) if m else ""


def _parse_float(tok: str) -> float:
    if tok in ("N/A", "n/a", "-"):
        return math.nan
    return float(tok)


def _parse_wrong(tok: str) -> int:
    if tok in ("N/A", "n/a", "-"):
        return -1
    v = float(tok)  # old versions print "0e+00" or "0.0"
    return int(v) if math.isfinite(v) else -1


def parse_nccl_tests_file(path: Path) -> pd.DataFrame:
    """One ``samples`` row per measured line of the nccl-tests log at ``path``.

    Raises :class:`InputError` for a file without rank lines or data lines, or with a
    line in a data section that is neither a measurement nor a known log line.
    """
    return _parse(Path(path))[0]


@dataclass(frozen=True)
class _LogInfo:
    devices: tuple[str, ...]
    n_library_lines: int
    has_trailer: bool


def _parse(path: Path) -> tuple[pd.DataFrame, _LogInfo]:
    text = _read_text(path)
    if not looks_like_nccl_tests(text[:HEAD_BYTES]):
        raise InputError(
            path, "not an nccl-tests log (no '# nThread .. nGpus ..' or '# size count type' header)"
        )
    lines = text.splitlines()

    ranks: dict[int, tuple[str, str]] = {}
    rows: list[tuple] = []
    cols: list[str] | None = None  # column names of the current data section
    n_lib, trailer = 0, False
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _RANK_RE.match(line)
            if m:
                ranks[int(m.group("rank"))] = (m.group("host"), m.group("name"))
                continue
            body = line.lstrip("#").split()
            if body[:3] == ["size", "count", "type"]:
                cols = body
            elif _END_RE.match(line):
                cols, trailer = None, True
            continue
        if _NCCL_LOG_RE.match(line):
            n_lib += 1
            continue
        if cols is None:
            continue  # text outside a data section: launcher output, MPI summaries
        rows.append(_parse_row(path, lineno, line, cols))
    if not ranks:
        raise InputError(
            path, "no '#  Rank N ... on HOST device D' lines: cannot tell ranks and nodes (header cut off?)"
        )
    if not rows:
        raise InputError(path, "nccl-tests log has no measurement lines (run failed or file truncated)")
    hosts = Counter(h for h, _ in ranks.values())
    m = _SETUP_RE.search(path.name)
    df = pd.DataFrame(rows, columns=_ROW_COLUMNS)
    wrong = np.maximum(df["wrong_oop"].to_numpy(), df["wrong_ip"].to_numpy())
    df = df.drop(columns=["wrong_oop", "wrong_ip"]).assign(
        source=SOURCE,
        file=str(path),
        setup=int(m.group(1)) if m else -1,
        collective=_collective_of(path, lines),
        nranks=len(ranks),
        nnodes=len(hosts),
        gpus_per_node=max(hosts.values()),
        wrong=wrong,
        nccl_version=_nccl_version(path, text),
    )
    _check_busbw(path, df)
    df = df[SAMPLES.names].astype(_INT_COLUMNS)
    info = _LogInfo(tuple(sorted({n for _, n in ranks.values() if n})), n_lib, trailer)
    return df, info


_ROW_COLUMNS = [
    "bytes",
    "count",
    "dtype",
    "redop",
    "root",
    "time_oop_us",
    "algbw_oop_gbps",
    "busbw_oop_gbps",
    "wrong_oop",
    "time_ip_us",
    "algbw_ip_gbps",
    "busbw_ip_gbps",
    "wrong_ip",
]
_INT_COLUMNS = {
    c: str(SAMPLES.field(c).type)
    for c in ("setup", "root", "nranks", "nnodes", "gpus_per_node", "bytes", "count", "wrong")
}


def _parse_row(path: Path, lineno: int, line: str, cols: list[str]) -> tuple:
    """A measurement line, mapped by the column header of its section.

    Columns before the first ``time`` describe the message (size, count, type and, since
    nccl-tests 2.x, redop and root); then come out-of-place and in-place groups of
    time, algbw, busbw and #wrong (``error`` in old versions).
    """
    tok = line.split()
    if len(tok) != len(cols):
        raise InputError(
            f"{path}:{lineno}",
            f"expected {len(cols)} columns ({' '.join(cols)}), found {len(tok)} in '{line[:80]}' "
            "(truncated or garbled line)",
        )
    try:
        head = dict(zip(cols, tok))
        starts = [i for i, c in enumerate(cols) if c == "time"]
        groups = []
        for i in starts[:2]:
            t, a, b = (_parse_float(x) for x in tok[i : i + 3])
            w = _parse_wrong(tok[i + 3]) if i + 3 < len(tok) and cols[i + 3] in ("#wrong", "error") else -1
            groups.append((t, a, b, w))
        if not groups:
            raise ValueError("no time column in the header")
        groups += [(math.nan, math.nan, math.nan, -1)] * (2 - len(groups))
        row = (
            int(head["size"]),
            int(head["count"]),
            head["type"],
            head.get("redop", ""),
            int(head.get("root", -1)),
        )
    except (KeyError, ValueError) as exc:
        raise InputError(f"{path}:{lineno}", f"cannot parse measurement line '{line[:80]}': {exc}") from None
    return row + groups[0] + groups[1]


def _check_busbw(path: Path, df: pd.DataFrame) -> None:
    """busbw must equal algbw x the nccl-tests factor (to print precision); else ranks are wrong."""
    factor = busbw_factor(df["collective"].to_numpy(), df["nranks"].to_numpy())
    algbw, busbw = df["algbw_oop_gbps"].to_numpy(), df["busbw_oop_gbps"].to_numpy()
    ok = np.isfinite(algbw) & np.isfinite(busbw) & (algbw >= 1.0) & np.isfinite(factor)
    if not ok.any():
        return
    rel = np.abs(busbw[ok] - algbw[ok] * factor[ok]) / np.maximum(busbw[ok], 1e-9)
    if np.max(rel) > 0.02:
        i = int(np.argmax(rel))
        raise InputError(
            path,
            f"busbw {busbw[ok][i]} is not algbw {algbw[ok][i]} x the {df['collective'].iat[0]} factor "
            f"{factor[ok][i]:.4f} for {df['nranks'].iat[0]} ranks: rank lines and measurements disagree",
        )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _head(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def collect_files(paths: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """nccl-tests logs among ``paths`` (directories searched recursively, in sorted order).

    Returns (logs, other files found inside directories).  A file named explicitly that is
    not nccl-tests output is an error; inside a directory it is listed as "other".
    """
    logs: list[Path] = []
    others: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            for f in sorted(q for q in p.rglob("*") if q.is_file() and not q.name.startswith(".")):
                (logs if looks_like_nccl_tests(_head(f)) else others).append(f)
        elif p.is_file():
            if not looks_like_nccl_tests(_head(p)):
                raise InputError(
                    p, "not an nccl-tests log (no '# nThread .. nGpus ..' or '# size count type' header)"
                )
            logs.append(p)
        else:
            raise InputError(p, "no such file or directory")
    return logs, others


def ingest_nccl_tests(
    paths: list[Path], *, name: str, system: str | None, skip_bad: bool = False
) -> tuple[RunMeta, dict[str, pd.DataFrame]]:
    """Parse nccl-tests logs (files or directories of them) into a run's meta and tables.

    The run holds one ``samples`` table; ``run.json`` lists every source with its sha256
    and notes what was not a log (e.g. ``nodes.dat``) so nothing is dropped unseen.  A
    log that cannot be parsed (cut off, garbled) raises :class:`InputError` naming it;
    with ``skip_bad`` it is left out and recorded in the notes.
    """
    logs, others = collect_files(paths)
    if not logs:
        where = ", ".join(str(p) for p in paths) or "(no paths)"
        raise InputError(where, "no nccl-tests logs found")
    notes = []
    parsed, good = [], []
    for f in logs:
        try:
            df, info = _parse(f)
            if not info.has_trailer:
                raise InputError(
                    f, "no '# Avg bus bandwidth' trailer after the last size: the log is cut off"
                )
            parsed.append((df, info))
            good.append(f)
        except InputError as exc:
            if not skip_bad:
                raise InputError(
                    exc.where, f"{exc.problem}; remove it, or skip_bad to ingest the rest"
                ) from None
            notes.append(f"skipped bad file {exc.line()}")
    if not parsed:
        raise InputError(
            ", ".join(str(p) for p in paths), "every nccl-tests log was bad: " + "; ".join(notes)
        )
    logs = good
    samples = pd.concat([df for df, _ in parsed], ignore_index=True)
    if others:
        notes.append(f"not nccl-tests output, not ingested: {', '.join(str(o) for o in others)}")
    for f, (_, info) in zip(logs, parsed):
        if info.n_library_lines:
            notes.append(f"{f}: {info.n_library_lines} NCCL library log lines (not measurements)")
    versions = sorted(set(samples["nccl_version"]) - {""})
    n_unknown = samples.loc[samples["nccl_version"] == "", "file"].nunique()
    if n_unknown:
        notes.append(f"NCCL version not in the log or its path for {n_unknown} file(s)")
    sizes = sorted(set(samples["nranks"].tolist()))
    meta = RunMeta(
        name=name,
        kind=KIND_NCCL_TESTS,
        system=system,
        created=datetime.now(UTC).replace(microsecond=0).isoformat(),
        calib_version=_version(),
        world_size=sizes[0] if len(sizes) == 1 else None,
        backend="nccl",
        devices=tuple(sorted({d for _, info in parsed for d in info.devices})),
        sources=tuple(SourceFile(path=str(f), sha256=_sha256(f), size_bytes=f.stat().st_size) for f in logs),
        notes=(*notes, f"nccl versions: {', '.join(versions) or 'unknown'}; rank counts: {sizes}"),
    )
    return meta, {"samples": samples}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("calib")
    except Exception:  # noqa: BLE001 - metadata missing in a source checkout
        return ""
