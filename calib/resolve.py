"""Names to typed inputs: the store, system and run names, calibration files, hardware presets.

This is the API layer's side of the pipeline: the stages (:mod:`calib.ingest`,
:mod:`calib.calibrate`, :mod:`calib.analytic`, :mod:`calib.reports`) take runs,
calibrations and specs as objects and never open the store; everything here opens it.
Errors name the field they are about (``system``, ``calibration``, ``store``); the CLI
maps fields to its option names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from calib.analytic.machine import build_system
from calib.analytic.specs import load_hardware
from calib.analytic.timemodel import System
from calib.calibrate.calibration import Calibration
from calib.calibrate.select import needs_text
from calib.core.errors import InputError
from calib.core.rundir import Run, read_run
from calib.core.schema import KIND_TRACE
from calib.core.store import (
    calibration_path,
    check_name,
    default_store,
    list_runs,
    list_systems,
    run_dir,
    system_dir,
)
from calib.reports.inputs import Inputs


def store_path(store: str | Path | None) -> Path:
    """The store directory: as given, or ``$CALIB_STORE`` / ``./calib-store``."""
    return Path(store) if store is not None else default_store()


def system_runs(store: str | Path | None, system: str) -> list[Run]:
    """Every run stored for ``system`` (sorted by name); an error naming the store if none."""
    check_name("system", system)
    store = store_path(store)
    runs = list_runs(store, system)
    if not runs:
        raise InputError(
            f"system {system}",
            f"no runs stored under {system_dir(store, system) / 'runs'}. " + needs_text(system),
        )
    return runs


def network_topology(system: str) -> tuple[dict[str, float] | None, str]:
    """The scale-out topology of the hardware preset named like ``system`` (for the network
    fit's contention term), and where it comes from; (None, "") without one."""
    try:
        hw = load_hardware(system)
    except (InputError, OSError, ValueError):
        return None, ""
    if hw.topology == "none":
        return None, ""
    note = f"hardware spec '{hw.name}': {hw.topology}, {hw.nodes_per_group} nodes per group, global taper " \
        f"{hw.global_taper:g}" + (f" ({hw.topology_note})" if hw.topology_note else "")  # fmt: skip
    return hw.network_topology(), note


def _name_like(text: str) -> bool:
    try:
        check_name("calibration", text)
    except InputError:
        return False
    return True


def load_calibration(
    system: str | None = None, calibration: str | Path | None = None, store: str | Path | None = None
) -> tuple[Calibration, Path]:
    """A system's fitted calibration from the store, or a calibration file, or a calibration
    stored by name (``calib validate --save-calibration NAME``: ``<store>/NAME/NAME.calib.json``)."""
    if system and calibration:
        raise InputError("calibration", "give either a system name or a calibration file, not both")
    if calibration is not None:
        path = Path(calibration)
        if not path.exists() and _name_like(str(calibration)):  # a calibration stored by name
            stored = calibration_path(store_path(store), str(calibration))
            if stored.is_file():
                path = stored
    elif system:
        check_name("system", system)
        path = calibration_path(store_path(store), system)
        if not path.is_file():
            raise InputError("system", f"no calibration for system '{system}' at {path} (fit it first)")
    else:
        raise InputError("system", "give a system name or a calibration file")
    return Calibration.load(path), path


def resolve_system(
    system: str | None = None,
    calibration: str | Path | None = None,
    hardware: str | None = None,
    store: str | Path | None = None,
    *,
    ranks_per_node: int | None = None,
) -> tuple[System, list[str]]:
    """The analytic :class:`System` named by a system (its fitted calibration in the store), a
    calibration file and/or a hardware preset or spec file; also notes for the output."""
    if ranks_per_node is not None and ranks_per_node < 1:
        raise InputError("ranks_per_node", f"must be a positive integer, got {ranks_per_node}")
    if system and calibration:
        raise InputError("calibration", "give either a system name or a calibration file, not both")
    if not (system or calibration or hardware):
        raise InputError("system", "say which machine: a system name, a calibration file or a hardware spec")
    hw = load_hardware(hardware) if hardware else None
    cal = path = None
    if system or calibration:
        cal, path = load_calibration(system, calibration, store)
    return build_system(cal, hw, ranks_per_node=ranks_per_node, origin=str(path) if path else None)


def resolve_run(arg: str | Path, store: Path, system: str | None) -> Run:
    """A run directory, or a run name in the store (under ``system`` or any system)."""
    arg = str(arg)
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
            arg, f"run name is in several systems ({', '.join(str(c) for c in candidates)}); name the system"
        )
    return read_run(candidates[0])


def gather(
    run_args: Sequence[str | Path],
    store: str | Path | None,
    system: str | None = None,
    calibration_file: str | Path | None = None,
) -> Inputs:
    """A report's inputs (runs, calibration, the fit's measured points); InputError on the first bad one."""
    store = store_path(store)
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
            notes.append(f"no calibration for system '{system}' at {cal_path} (fit it first)")
            cal_path = None
    if system and not store.is_dir() and calibration_file is None:
        raise InputError(
            "store", f"{store} does not exist (ingest and fit first, or give a calibration file)"
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
        sel = select(list_runs(Path(store), system), system, where)
    except InputError as exc:
        return (), f"measured busbw points not shown: {exc.problem}"
    if sel.samples.empty:
        return (), ""
    return tuple(size_series(sel.samples, prov.get("network_source", ""))), ""


def stack_defaults(plan: dict, model, hw) -> tuple[dict, list[str]]:
    """``plan`` (a Plan's fields) with flash_attention and dp_overlap settled where not given,
    and the notes that say how (``analytic.vdefaults``)."""
    out = dict(plan)
    out["flash_attention"], a = attention_default(plan.get("flash_attention"), model, hw)
    out["dp_overlap"], b = overlap_default(plan.get("dp_overlap"), plan.get("zero", 0))
    return out, a + b


def attention_default(flash_attention: bool | None, model, hw) -> tuple[bool, list[str]]:
    """Fused attention as given, or its default (``analytic.vdefaults``) with a note saying why."""
    if flash_attention is not None:
        return bool(flash_attention), []
    from calib.analytic.vdefaults import fused_attention_reason

    why = fused_attention_reason(model, hw)
    if why is None:
        return False, []  # analytic.predict's unfused note says what fused would change
    return True, [
        f"attention fused ({why}: the generation that trains with fused attention kernels); a stated default, "
        "--no-flash-attention (API flash_attention=False) for Megatron's 2021 unfused attention"
    ]


def overlap_default(dp_overlap: bool | None, zero: int) -> tuple[bool, list[str]]:
    """DP/ZeRO overlap as given, or its default with a note: on for ZeRO-3 (``analytic.vdefaults``,
    as for a blank table column), off otherwise."""
    if dp_overlap is not None:
        return bool(dp_overlap), []
    from calib.analytic.vdefaults import zero3_overlaps

    if not zero3_overlaps(zero):
        return False, []
    return True, [
        "DP overlap on for ZeRO-3 (DeepSpeed stage 3 and PyTorch FSDP prefetch by default; the hidden share is "
        "the stated ZeRO-3 overlap fraction, not all of it); a stated default, --no-dp-overlap (API "
        "dp_overlap=False) for none"
    ]
