"""What a report is about: runs, a system's calibration and the data it was fitted on.

Everything is read through the other stages' contracts (``calib.core.rundir.read_run``,
``calib.core.store``, ``Calibration.load``, ``calibrate.select``); a run that is missing or
from a newer schema, or a calibration that cannot be read, is an :class:`InputError`
(one line, exit 2) before anything is drawn or written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calib.calibrate.calibration import Calibration

from calib.core.errors import InputError
from calib.core.rundir import Run, read_run
from calib.core.schema import KIND_TRACE
from calib.core.store import calibration_path, check_name, list_runs, list_systems, run_dir


@dataclass(frozen=True)
class Inputs:
    runs: tuple[Run, ...]
    system: str | None = None
    calibration: Calibration | None = None
    calibration_path: Path | None = None
    store: Path | None = None
    series: tuple = ()  # calibrate.collectives.SizeSeries the fit used (measured points)
    notes: tuple[str, ...] = field(default_factory=tuple)


def resolve_run(arg: str, store: Path, system: str | None) -> Run:
    """A run directory, or a run name in the store (under ``system`` or any system)."""
    path = Path(arg)
    if path.is_dir():
        return read_run(path)
    if path.exists():
        raise InputError(arg, "not a run directory")
    candidates = []
    if "/" not in arg and store.is_dir():
        try:
            check_name("name", arg)
        except InputError:
            raise InputError(arg, "no such run directory") from None
        systems = [system] if system else list_systems(store)
        candidates = [
            run_dir(store, s, arg) for s in systems if (run_dir(store, s, arg) / "run.json").is_file()
        ]
    if not candidates:
        where = f" and no run of that name in store {store}" + (f" (system {system})" if system else "")
        raise InputError(arg, f"no such run: not a directory{where if store.is_dir() else ''}")
    if len(candidates) > 1:
        raise InputError(
            arg, f"run name is in several systems ({', '.join(str(c) for c in candidates)}); give --system"
        )
    return read_run(candidates[0])


def gather(
    run_args: tuple[str, ...],
    store: Path,
    system: str | None = None,
    calibration_file: Path | None = None,
) -> Inputs:
    """Resolve the report's inputs; raise InputError on the first bad one."""
    notes: list[str] = []
    runs = [resolve_run(a, store, system) for a in run_args]
    if system:
        check_name("system", system)
    if system and not run_args and store.is_dir():
        runs = [r for r in list_runs(store, system) if r.meta.kind == KIND_TRACE]
    cal, cal_path = None, None
    if calibration_file is not None:
        cal_path = Path(calibration_file)
        cal = Calibration.load(cal_path)
    elif system:
        cal_path = calibration_path(store, system)
        if cal_path.is_file():
            cal = Calibration.load(cal_path)
        else:
            notes.append(
                f"no calibration for system '{system}' at {cal_path} (run `calib fit --system {system}`)"
            )
            cal_path = None
    if system and not store.is_dir() and calibration_file is None:
        raise InputError(
            "--store", f"{store} does not exist (ingest and fit first, or give --calibration FILE)"
        )
    series: tuple = ()
    if cal is not None:
        series, note = measured_series(cal, store)
        if note:
            notes.append(note)
    seen: set[Path] = set()
    unique = []
    for r in runs:
        key = r.path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(r)
    return Inputs(tuple(unique), system, cal, cal_path, store, series, tuple(notes))


def measured_series(cal: Calibration, store: Path) -> tuple[tuple, str]:
    """The per-size medians the calibration's curves were fitted to, re-selected from the store
    with the fit's own ``where`` (so the points drawn are exactly the fit's data)."""
    from calib.calibrate.collectives import size_series
    from calib.calibrate.select import select

    prov = cal.provenance or {}
    system = prov.get("system") or cal.system
    if not cal.collectives or not store or not (Path(store) / system).is_dir():
        return (), (
            "" if not cal.collectives else f"measured busbw points not shown: no store data for {system}"
        )
    where = {k: tuple(str(x) for x in v) for k, v in (prov.get("where") or {}).items()}
    try:
        sel = select(Path(store), system, where)
    except InputError as exc:
        return (), f"measured busbw points not shown: {exc.problem}"
    if sel.samples.empty:
        return (), ""
    return tuple(size_series(sel.samples, prov.get("network_source", ""))), ""
