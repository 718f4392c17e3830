"""Run directories: ``run.json`` plus Parquet tables, written atomically.

A run is first written into a hidden sibling directory and renamed into place, so a
failed or interrupted ingest leaves nothing at the target path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from calib.core.errors import InputError
from calib.core.schema import RUN_FORMAT, SCHEMA_VERSION, TABLES, RunMeta, conform


def write_run(
    target: Path, meta: RunMeta, tables: Mapping[str, pd.DataFrame], *, overwrite: bool = True
) -> Path:
    """Write ``meta`` and ``tables`` to ``target`` atomically and return ``target``.

    An existing run at ``target`` is replaced only once the new one is complete.
    """
    target = Path(target)
    if target.exists() and not overwrite:
        raise InputError(target, "a run already exists there (use a different --name or --out)")
    if target.exists() and not (target / "run.json").is_file():
        raise InputError(target, "exists and is not a calib run directory; refusing to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        for name, df in tables.items():
            if name not in TABLES:
                raise ValueError(f"unknown table {name}")
            pq.write_table(conform(name, df), tmp / f"{name}.parquet", compression="zstd")
        meta_json = {**meta.to_json(), "tables": sorted(tables)}
        (tmp / "run.json").write_text(json.dumps(meta_json, indent=2, sort_keys=False) + "\n")
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@dataclass
class Run:
    """A run directory opened for reading; tables load on first access."""

    path: Path
    meta: RunMeta
    _cache: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    def has(self, table: str) -> bool:
        return table in self.meta.tables

    def table(self, name: str) -> pd.DataFrame:
        if name not in self._cache:
            if not self.has(name):
                raise InputError(
                    self.path, f"run has no '{name}' table (it has: {', '.join(self.meta.tables)})"
                )
            try:
                self._cache[name] = pq.read_table(self.path / f"{name}.parquet").to_pandas()
            except (OSError, ValueError) as exc:
                raise InputError(self.path / f"{name}.parquet", f"cannot read table: {exc}") from None
        return self._cache[name]


def read_run(path: str | Path) -> Run:
    """Open a run directory, checking its format and schema version."""
    path = Path(path)
    meta_path = path / "run.json"
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
    return Run(path=path, meta=meta)
