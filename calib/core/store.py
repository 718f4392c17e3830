"""The store: where ingested runs and calibrations are found again by system.

Layout (plain files, no server)::

    <store>/                       default ./calib-store, or $CALIB_STORE, or --store
      <system>/
        runs/<run-name>/run.json   one directory per ingested run (calib.core.rundir)
        runs/<run-name>/*.parquet
        <system>.calib.json        the latest fit (calibrate)

Runs ingested without ``--system`` go under the system name ``unassigned``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from calib.core.errors import InputError
from calib.core.rundir import Run, read_run

UNASSIGNED = "unassigned"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def default_store() -> Path:
    return Path(os.environ.get("CALIB_STORE", "calib-store"))


def check_name(kind: str, name: str) -> str:
    """System and run names become directory names: keep them plain."""
    if not _NAME_RE.match(name or ""):
        raise InputError(
            f"--{kind}",
            f"'{name}' is not a valid {kind} name (letters, digits, '.', '_', '+', '-'; at most 128)",
        )
    return name


def safe_name(text: str) -> str:
    """A valid run name derived from a file or directory name."""
    for suffix in (".gz", ".json", ".pt.trace", ".trace"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    name = re.sub(r"[^A-Za-z0-9._+-]+", "_", text).strip("._-") or "run"
    return name[:128]


def system_dir(store: Path, system: str | None) -> Path:
    return Path(store) / check_name("system", system or UNASSIGNED)


def run_dir(store: Path, system: str | None, name: str) -> Path:
    return system_dir(store, system) / "runs" / check_name("name", name)


def calibration_path(store: Path, system: str) -> Path:
    return system_dir(store, system) / f"{system}.calib.json"


def list_systems(store: Path) -> list[str]:
    store = Path(store)
    if not store.is_dir():
        return []
    return sorted(p.name for p in store.iterdir() if p.is_dir() and (p / "runs").is_dir())


def list_runs(store: Path, system: str | None = None) -> list[Run]:
    """Every readable run in the store (of one system if given), sorted by system and name."""
    systems = [system] if system else list_systems(store)
    runs: list[Run] = []
    for sys_name in systems:
        runs_dir = system_dir(store, sys_name) / "runs"
        if not runs_dir.is_dir():
            continue
        for p in sorted(runs_dir.iterdir()):
            if p.name.startswith(".") or not (p / "run.json").is_file():
                continue
            runs.append(read_run(p))
    return runs
