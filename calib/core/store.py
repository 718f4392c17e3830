"""The store: where ingested runs and calibrations are found again by system.

Layout (plain files, no server)::

    <store>/                       default ./calib-store, or $CALIB_STORE, or --store
      <system>/
        runs/<run-name>/run.json   one directory per ingested run (calib.core.rundir)
        runs/<run-name>/*.parquet
        <system>.calib.json        the latest fit (calibrate)

      .lock                        writers hold it (fcntl.flock) while they change the store

Runs ingested without ``--system`` go under the system name ``unassigned``.

A run is never lost: :func:`save_run` refuses an existing run name unless asked to
replace it, and then swaps the new run in atomically (:mod:`calib.core.atomic`).  Writers
to one store are serialised by an exclusive ``flock`` on ``<store>/.lock``, so of two
concurrent writers of one name exactly one creates the run and the other is refused
(or, when replacing, replaces it after the first has finished).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pandas as pd

from calib.core.errors import InputError
from calib.core.rundir import Run, RunExists, read_run, write_run
from calib.core.schema import RunMeta

UNASSIGNED = "unassigned"
LOCK_FILE = ".lock"
#: say why we wait once the lock has been held by another writer this long (seconds)
LOCK_NOTICE_S = 2.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")


def default_store() -> Path:
    return Path(os.environ.get("CALIB_STORE", "calib-store"))


def check_name(kind: str, name: str) -> str:
    """System and run names become directory names: keep them plain."""
    if not _NAME_RE.match(name or ""):
        raise InputError(
            f"--{kind}",
            f"'{name}' is not a valid {'run' if kind == 'name' else kind} name (letters, digits, '.', '_', '+', "
            "'-'; at most 128)",
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


def run_paths(store: Path, system: str | None = None) -> tuple[list[Path], list[Path]]:
    """(run directories, leftover temporaries) of the store, of one system if given.

    Run directories are every visible directory under ``<system>/runs/``, readable or
    not; leftovers are hidden ``.*.tmp`` / ``.*.old`` directories an interrupted writer
    left behind (never a run; safe to delete).
    """
    systems = [system] if system else list_systems(store)
    runs: list[Path] = []
    leftovers: list[Path] = []
    for sys_name in systems:
        runs_dir = system_dir(store, sys_name) / "runs"
        if not runs_dir.is_dir():
            continue
        for p in sorted(runs_dir.iterdir()):
            if not p.is_dir():
                continue
            if p.name.startswith("."):
                if p.name.endswith((".tmp", ".old")):
                    leftovers.append(p)
                continue
            runs.append(p)
    return runs, leftovers


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


@contextlib.contextmanager
def locked(
    store: Path, *, on_wait: Callable[[str], None] | None = None, notice_s: float = LOCK_NOTICE_S
) -> Iterator[Path]:
    """Hold the store's writer lock (``<store>/.lock``, exclusive flock) inside the block.

    ``on_wait`` gets one line if another writer holds the lock for more than ``notice_s``
    seconds; then this one waits until the lock is free.  The lock goes with the process,
    so a killed writer never leaves the store locked.
    """
    store = Path(store)
    try:
        store.mkdir(parents=True, exist_ok=True)
        fd = os.open(store / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(store, f"cannot open the store for writing: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + notice_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    if on_wait is not None:
                        on_wait(f"waiting for another calib writing to {store} (lock {store / LOCK_FILE})")
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    break
                time.sleep(0.05)
        yield store
    finally:
        os.close(fd)  # releases the lock


def check_new_run(store: Path, system: str | None, name: str, *, replace: bool = False) -> Path:
    """The run's directory; :class:`RunExists` now if it exists and ``replace`` is not set.

    A cheap early check so that a long ingest is not done in vain; :func:`save_run`
    checks again under the lock.
    """
    target = run_dir(store, system, name)
    if target.exists() and not replace:
        raise RunExists(target)
    return target


def save_run(
    store: Path,
    meta: RunMeta,
    tables: Mapping[str, pd.DataFrame],
    *,
    replace: bool = False,
    on_wait: Callable[[str], None] | None = None,
) -> Path:
    """Store a run under its system and name, holding the store's writer lock.

    An existing run of that name raises :class:`RunExists` unless ``replace``; then it
    is replaced atomically.  Returns the run's directory.
    """
    target = run_dir(store, meta.system, meta.name)
    with locked(store, on_wait=on_wait):
        return write_run(target, meta, tables, replace=replace)
