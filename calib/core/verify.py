"""Check stored runs against their contract: ``run.json``, table schemas and checksums.

:func:`verify_run` reads only what it must: ``run.json``, each table's Parquet schema
(footer) and every file's bytes for the checksums.  A run without ``checksums.sha256``
(written before calib kept one) is *unverifiable*, not bad: its schema is still checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

from calib.core.errors import InputError
from calib.core.rundir import MANIFEST, RUN_FILE, check_version, read_manifest, read_run, sha256_file
from calib.core.schema import TABLES

OK, UNVERIFIABLE, BAD = "ok", "unverifiable", "bad"


@dataclass(frozen=True)
class RunCheck:
    path: Path
    status: str  # ok, unverifiable (no checksums; schema fine), bad
    problems: tuple[str, ...] = ()

    def line(self) -> str:
        if self.status == OK:
            return f"ok            {self.path}"
        if self.status == UNVERIFIABLE:
            return f"unverifiable  {self.path}: no {MANIFEST} (written by an older calib); schema ok"
        return f"BAD           {self.path}: {'; '.join(self.problems)}"


def verify_run(path: str | Path) -> RunCheck:
    """The state of the run directory at ``path``; never raises on a bad run."""
    path = Path(path)
    problems: list[str] = []
    try:
        run = read_run(path)
    except InputError as exc:
        return RunCheck(path, BAD, (exc.line(),))
    try:
        manifest = read_manifest(path)
    except InputError as exc:
        manifest = {}
        problems.append(exc.line())
    for name in run.meta.tables:
        file = path / f"{name}.parquet"
        if name not in TABLES:
            problems.append(f"{RUN_FILE} lists an unknown table '{name}'")
            continue
        if not file.is_file():
            problems.append(f"{file.name}: missing")
            continue
        try:
            schema = pq.read_schema(file)
            check_version(file, schema, legacy=manifest is None)
        except InputError as exc:
            problems.append(f"{file.name}: {exc.problem}")
            continue
        except (OSError, ValueError) as exc:
            problems.append(f"{file.name}: not a readable Parquet file ({exc})")
            continue
        want = TABLES[name]
        got = {f.name: f.type for f in schema}
        missing = [f.name for f in want if f.name not in got]
        wrong = [
            f"{f.name} is {got[f.name]}, not {f.type}"
            for f in want
            if f.name in got and got[f.name] != f.type
        ]
        extra = [n for n in got if n not in want.names]
        if missing or wrong or extra:
            parts = ([f"missing columns {', '.join(missing)}"] if missing else []) + wrong
            parts += [f"unexpected columns {', '.join(extra)}"] if extra else []
            problems.append(f"{file.name}: {'; '.join(parts)}")
    if manifest is not None:
        problems += _checksums(path, manifest)
    if problems:
        return RunCheck(path, BAD, tuple(problems))
    return RunCheck(path, OK if manifest is not None else UNVERIFIABLE)


def _checksums(path: Path, manifest: dict[str, str]) -> list[str]:
    problems = []
    for name, digest in sorted(manifest.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{name}: listed in {MANIFEST} but missing")
        elif sha256_file(file) != digest:
            problems.append(f"{name}: checksum differs from {MANIFEST} (changed or damaged)")
    unlisted = sorted(p.name for p in path.iterdir() if p.name != MANIFEST and p.name not in manifest)
    if unlisted:
        problems.append(f"files not in {MANIFEST}: {', '.join(unlisted)}")
    return problems
