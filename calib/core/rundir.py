"""Run directories: ``run.json`` plus Parquet tables, written atomically.

A run is first written into a hidden sibling directory and renamed into place
(:mod:`calib.core.atomic`), so a failed or interrupted ingest leaves nothing at the
target path, and an existing run is replaced only when asked, in one atomic swap.

Every table carries the run schema version in its Arrow metadata
(``calib.schema_version``, with ``calib.table`` naming the table) and is checked on read:
a newer or unknown version is an error naming the file.  The last file written is
``checksums.sha256`` (``sha256sum`` format) over every other file of the run; ``calib runs
--check`` verifies it.  Runs written before table metadata existed have no
``checksums.sha256``: their tables may lack the version key and are read as schema
version 1, the only version of that era.  In a run that has the manifest, a table
without the key is an error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from calib.core.atomic import DirExists, replacing_dir
from calib.core.errors import InputError
from calib.core.schema import RUN_FORMAT, SCHEMA_VERSION, TABLES, RunMeta, conform

#: Arrow schema-metadata keys of every table calib writes
VERSION_KEY = b"calib.schema_version"
TABLE_KEY = b"calib.table"
#: the checksum manifest, written last
MANIFEST = "checksums.sha256"
RUN_FILE = "run.json"


class RunExists(InputError):
    """A run is already stored at the target and replacing it was not asked for."""

    def __init__(self, target: Path) -> None:
        super().__init__(target, "a run already exists there; it is replaced only when asked to")
        self.target = Path(target)


def write_run(
    target: Path, meta: RunMeta, tables: Mapping[str, pd.DataFrame], *, replace: bool = False
) -> Path:
    """Write ``meta`` and ``tables`` to ``target`` atomically and return ``target``.

    An existing run at ``target`` raises :class:`RunExists` unless ``replace``; with it,
    the old run is swapped out only once the new one is complete.  A directory that is not
    a calib run is never replaced.
    """
    target = Path(target)
    if target.exists() and not replace:
        raise RunExists(target)
    if target.exists() and not (target / RUN_FILE).is_file():
        raise InputError(target, "exists and is not a calib run directory; refusing to replace it")
    try:
        with replacing_dir(target, replace=replace, may_replace=lambda t: (t / RUN_FILE).is_file()) as tmp:
            for name, df in tables.items():
                if name not in TABLES:
                    raise ValueError(f"unknown table {name}")
                pq.write_table(
                    with_version(conform(name, df), name), tmp / f"{name}.parquet", compression="zstd"
                )
            meta_json = {**meta.to_json(), "tables": sorted(tables)}
            (tmp / RUN_FILE).write_text(json.dumps(meta_json, indent=2, sort_keys=False) + "\n")
            write_manifest(tmp)
    except DirExists:
        raise RunExists(target) from None
    return target


def with_version(table: pa.Table, name: str) -> pa.Table:
    """``table`` with the schema version and table name in its Arrow metadata."""
    meta = dict(table.schema.metadata or {})
    meta[VERSION_KEY] = str(SCHEMA_VERSION).encode()
    meta[TABLE_KEY] = name.encode()
    return table.replace_schema_metadata(meta)


def check_version(path: Path, schema: pa.Schema, *, legacy: bool) -> int:
    """The schema version of the table at ``path`` (its Arrow ``schema``), or InputError."""
    raw = (schema.metadata or {}).get(VERSION_KEY)
    if raw is None:
        if legacy:
            return 1
        raise InputError(path, "table carries no calib schema version (not written by calib, or damaged)")
    try:
        version = int(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise InputError(path, f"table schema version {raw!r} is not a number") from None
    if version > SCHEMA_VERSION or version < 1:
        raise InputError(
            path, f"table schema version {version} is not one this calib understands (1..{SCHEMA_VERSION})"
        )
    return version


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(run_path: Path) -> Path:
    """``checksums.sha256`` over every other file of the run directory (sorted)."""
    lines = [
        f"{sha256_file(p)}  {p.name}\n"
        for p in sorted(Path(run_path).iterdir())
        if p.is_file() and p.name != MANIFEST
    ]
    out = Path(run_path) / MANIFEST
    out.write_text("".join(lines))
    return out


def read_manifest(run_path: Path) -> dict[str, str] | None:
    """{file name: sha256} of the run's manifest; None when the run has none (older runs)."""
    path = Path(run_path) / MANIFEST
    if not path.is_file():
        return None
    out: dict[str, str] = {}
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        digest, sep, name = line.partition("  ")
        if not sep or len(digest) != 64 or not name or "/" in name:
            raise InputError(path, f"line {i} is not '<sha256>  <file>'")
        out[name] = digest
    return out


@dataclass
class Run:
    """A run directory opened for reading; tables load on first access."""

    path: Path
    meta: RunMeta
    legacy: bool = False  # written before checksums and table metadata existed
    _cache: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def has(self, table: str) -> bool:
        return table in self.meta.tables

    def table(self, name: str) -> pd.DataFrame:
        if name not in self._cache:
            if not self.has(name):
                raise InputError(
                    self.path, f"run has no '{name}' table (it has: {', '.join(self.meta.tables)})"
                )
            path = self.path / f"{name}.parquet"
            try:
                table = pq.read_table(path)
            except (OSError, ValueError) as exc:
                raise InputError(path, f"cannot read table: {exc}") from None
            check_version(path, table.schema, legacy=self.legacy)
            self._cache[name] = table.to_pandas()
        return self._cache[name]


def read_run(path: str | Path) -> Run:
    """Open a run directory, checking its format and schema version."""
    path = Path(path)
    meta_path = path / RUN_FILE
    if not meta_path.is_file():
        raise InputError(path, "not a calib run (no run.json)")
    try:
        raw = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(meta_path, f"unreadable run.json: {exc}") from None
    if not isinstance(raw, dict) or raw.get("format") != RUN_FORMAT:
        raise InputError(meta_path, f"not a calib run file (format is not '{RUN_FORMAT}')")
    version = raw.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise InputError(
            meta_path,
            f"run schema version {version} is newer than this calib understands ({SCHEMA_VERSION}); upgrade calib",
        )
    try:
        meta = RunMeta.from_json(raw)
    except (TypeError, ValueError) as exc:
        raise InputError(meta_path, f"malformed run.json: {exc}") from None
    return Run(path=path, meta=meta, legacy=not (path / MANIFEST).is_file())
