"""Fit a system: its runs and samples into one :class:`Calibration`.

Network factors come from nccl-tests samples (:mod:`calibrate.collectives`,
:mod:`calibrate.netfit`), compute factors from trace runs (:mod:`calibrate.compute`);
whatever the data cannot support keeps the stated default of ``Calibration.defaults``
with status "default" and a note naming the data it needs.  The result depends only on
the inputs (runs are read in sorted order, fits are deterministic); only ``created``
changes between two fits of the same store.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
import scipy
from calib.calibrate import compute, device_check, device_facts, device_fit
from calib.calibrate.calibration import Calibration, Param, Saturating
from calib.calibrate.collectives import fit_series, size_series
from calib.calibrate.device_compile import compiled_runs
from calib.calibrate.device_model import DeviceModel
from calib.calibrate.netfit import fit_nccl
from calib.calibrate.select import Selection, needs_text, select

from calib.core.devices import limits_for
from calib.core.errors import InputError
from calib.core.rundir import Run


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("calib")
    except Exception:  # noqa: BLE001 - metadata missing in a source checkout
        return ""


def fit_system(
    runs: Sequence[Run],
    system: str,
    *,
    where: dict[str, tuple[str, ...]] | None = None,
    peak_tflops: float | None = None,
    gpus_per_node: int | None = None,
    profiler_overhead: float | None = None,
    topology: dict[str, float] | None = None,
    topology_note: str = "",
) -> Calibration:
    """Fit every factor the runs of ``system`` support (``where`` filters them, see
    :mod:`calibrate.select`).

    ``peak_tflops``: the device's dense peak (the GEMM-efficiency denominator); without
    it, the best sustained throughput of the system's GEMM benchmark samples is
    used (stated as such in the notes).  ``gpus_per_node``: devices per node (on a CPU
    host: cores / threads per rank); default from the collective samples' rank lines.
    ``profiler_overhead``: profiled / unprofiled step time of the traced runs (from the
    capture's ``run_config.json`` step times); the excess is taken out of dispatch, so
    k1 and the per-operator costs describe unprofiled steps.  ``topology``: the system
    spec's network topology ({"topology": 1 dragonfly / 2 fat tree, "nodes_per_group",
    "global_taper"}) for the contention term of all-to-all and tree all-reduce at scale,
    ``topology_note`` where it comes from.
    """
    sel = select(runs, system, where or {})
    if sel.samples.empty and not sel.trace_runs:
        kinds = sorted({r.meta.kind for r in sel.runs})
        raise InputError(
            f"system {system}",
            f"its runs ({', '.join(kinds)}) hold neither nccl-tests samples nor "
            f"trace buckets. {needs_text(system)}",
        )
    where_txt = f"system {system}"
    notes: list[str] = list(sel.notes)
    curves, networks, gpn, source = _network(sel, where_txt, notes, topology, topology_note)
    if gpus_per_node:
        if gpn and gpn != gpus_per_node:
            notes.append(
                f"gpus_per_node {gpus_per_node} as stated (the collective samples ran {gpn} ranks per node)"
            )
        gpn = int(gpus_per_node)
    if not gpn:
        gpn = 1
        notes.append("gpus_per_node unknown (only nccl-tests rank lines tell it); set to 1")
    samples = compute.bench_gemm_samples(sel.runs)
    dtype = compute.traced_gemm_dtype(sel.trace_runs)
    peak_info = None
    if peak_tflops is None and len(samples):
        peak_info = compute.measured_peak(samples, dtype)
        peak_tflops = peak_info.tflops
        notes.append(
            f"peak {peak_info.tflops:.4g} TFLOP/s = the best sustained matmul throughput measured by the GEMM "
            f"benchmark ({peak_info.dtype} {peak_info.shape} on {peak_info.device}, best of {peak_info.samples} "
            "shapes), not a datasheet peak: GEMM efficiencies are fractions of it"
            + (f"; {peak_info.note}" if peak_info.note else "")
        )
    node_pts = compute.node_points(sel.trace_runs)
    slots, slowdowns = compute.fit_compute_slots(node_pts, gpn, where=where_txt)
    uncontended = (
        tuple(r for r in sel.trace_runs if (r.meta.world_size or 1) <= max(slots.value, 1.0) + 1e-9)
        or sel.trace_runs
    )
    if len(slowdowns):
        notes.append(
            f"compute slots per node {slots.value:.3g} ({slots.status}): {slots.note}; GEMM efficiency from the "
            f"traces of runs with at most that many ranks per node ({len(uncontended)} of {len(sel.trace_runs)})"
        )
    base = Calibration.defaults(
        system,
        gpus_per_node=gpn,
        peak_tflops=peak_tflops,
        intra_busbw_gbps=1.0,
        inter_busbw_gbps=1.0,
        source="calib defaults",
    )
    defaults = {"k1": base.k1_curve, "k2": base.k2_curve, "gemm": base.gemm_efficiency_curve}
    cf = compute.fit_compute(
        sel.trace_runs,
        peak_tflops=peak_tflops,
        defaults=defaults,
        where=where_txt,
        gemm_samples=samples,
        gemm_dtype=peak_info.dtype if peak_info else dtype,
        gemm_trace_runs=uncontended,
        profiler_overhead=profiler_overhead,
    )
    if profiler_overhead:
        notes.append(
            f"profiler overhead {profiler_overhead:.3g}x (profiled / unprofiled step time, as stated) taken out of "
            "the traces' dispatch time: k1 and dispatch costs describe unprofiled steps"
            if profiler_overhead > 1
            else f"profiler overhead {profiler_overhead:.3g} <= 1 stated: no correction"
        )
    notes.extend(cf.notes)
    no_traces = f"no trace runs for {system}: needs profiler traces of system {system}"
    need_k = (
        f"{no_traces} (>= 2 model sizes, shapes recorded)"
        if not sel.trace_runs
        else "the trace runs have no matmul shapes (record_shapes): k1/k2 cannot be placed on the work axis"
    )
    k1 = cf.k1 or _as_default(base.k1_curve, need_k)
    k2 = cf.k2 or _as_default(base.k2_curve, need_k)
    gemm = cf.gemm_efficiency or _as_default(
        base.gemm_efficiency_curve,
        (
            "GEMM efficiency needs traces with record_shapes (or GEMM benchmark samples) and a peak "
            "(peak_tflops, or the benchmark's best)"
            if sel.trace_runs or len(samples)
            else no_traces
        ),
    )
    dispatch = dict(cf.dispatch) or {
        k: compute.default_note(v, f"{no_traces}; value is calib's default") for k, v in base.dispatch.items()
    }
    device_model = _device_model(sel, samples, peak_info, profiler_overhead, notes)
    if not curves:
        notes.append(f"no nccl-tests samples: no collective curves. {needs_text(system)}")
    elif not any(c.n_nodes <= 1 for c in curves):
        notes.append(
            "no single-node samples: inside a node collective_time_s uses the smallest inter-node curve "
            "(pessimistic); ingest single-node nccl-tests logs to calibrate NVLink"
        )
    return Calibration(
        system=system,
        gpus_per_node=int(gpn),
        peak_tflops=peak_tflops,
        device=_device(sel),
        collectives=tuple(curves),
        network=networks,
        gemm_efficiency_curve=gemm,
        k1_curve=k1,
        k2_curve=k2,
        dispatch=dispatch,
        device_model=device_model,
        compute_slots_per_node=slots,
        provenance={
            **_provenance(sel, source, cf.points),
            **_node_provenance(gpn, node_pts, slowdowns),
            **({"gemm_points": _records(cf.gemm_points)} if cf.gemm_points is not None else {}),
            **({"peak": {**peak_info.__dict__, "source": "GEMM benchmark"}} if peak_info else {}),
        },
        notes=tuple(notes),
        created=base.created,
        calib_version=_version(),
    )


def _device_model(sel: Selection, samples: pd.DataFrame, peak_info, profiler_overhead: float | None,
                  notes: list[str]) -> DeviceModel | None:  # fmt: skip
    """The physical compute model from the GPU trace runs that recorded shapes and a model."""
    # one GPU's physics: a run of several ranks times communication into its step and its
    # kernel tables hold every rank's kernels (they would count N times)
    every = [(r, device_facts.facts(r)) for r in sel.trace_runs]
    multi = [r for r, f in every if f is not None and (r.meta.world_size or 1) > 1]
    runs = [f for r, f in every if f is not None and (r.meta.world_size or 1) <= 1]
    if multi:
        notes.append(
            "left out of the device model (fitted from single-GPU runs): "
            + ", ".join(
                f"{r.meta.name} ({r.meta.world_size} ranks: its step includes communication)" for r in multi
            )
        )
    if not runs:
        return None
    device = _device(sel) or "gpu"
    lim = limits_for(device)
    if lim is not None:
        peak, hbm, source = lim.bf16_tflops, lim.hbm_tbps, lim.source
    elif peak_info is not None:
        peak, hbm, source = peak_info.tflops, 0.0, "best GEMM benchmark throughput (no datasheet known)"
    else:
        peak, hbm, source = 0.0, 0.0, "no datasheet and no benchmark: rates are absolute"
    stated = profiler_overhead - 1.0 if profiler_overhead else None
    dm = device_fit.fit_device(runs, samples, device, peak, hbm, source, stated_overhead=stated)
    checked, _ = device_fit.dense_runs(runs)  # the runs left out are named in dm.notes
    if len(checked) < len(runs):  # torch.compile runs are predicted by their own family
        checked = checked + compiled_runs(runs)
    dm = replace(dm, runs=device_check.check_runs(dm, checked, samples, stated_overhead=stated),
                 variant_runs=device_check.variant_rows(dm, runs))  # fmt: skip
    notes.extend(dm.notes)
    notes.append(device_check.summary(dm))
    return dm


def _network(sel: Selection, where: str, notes: list[str], topology=None, topology_note: str = ""):
    if sel.samples.empty:
        return [], {}, None, ""
    versions = sorted(set(sel.samples["nccl_version"].astype(str)) - {""})
    setups = sorted(set(sel.samples["setup"].tolist()))
    kinds = sorted(set(sel.samples["source"].astype(str))) if "source" in sel.samples else []
    if kinds == ["calib-bench"]:  # calib's collective benchmark: no nccl-tests setups or versions
        source = "calib-bench"
    else:
        source = f"nccl-tests setup={','.join(map(str, setups))}" + (
            f" nccl={','.join(versions)}" if versions else ""
        )
    series = size_series(sel.samples, source)
    fitted = [(fit_series(s), s) for s in series]
    curves = [c for c, _ in fitted]
    pairs: dict[str, list] = {}
    for c, s in fitted:
        pairs.setdefault(c.collective, []).append((c, s))
    networks, net_notes = fit_nccl(pairs, where=where, topology=topology, topology_note=topology_note)
    notes.extend(net_notes)
    gpn = int(sel.samples["gpus_per_node"].max())
    return curves, networks, gpn, source


#: provenance key of the evidence behind ``Calibration.compute_slots_per_node``
NODE_KEY = "node"


def _records(df: pd.DataFrame | None) -> list[dict]:
    return df.replace({np.nan: None}).to_dict(orient="records") if df is not None and len(df) else []


def _node_provenance(gpn: int, points: pd.DataFrame, slowdowns: pd.DataFrame) -> dict:
    """The evidence behind the compute slots S (the typed field ``compute_slots_per_node``).

    r ranks on one node slow each other by max(1, r / S) (time-sharing of cores, or of a
    device); S <= devices per node.  ``provenance["node"]``: {"devices_per_node", "points",
    "slowdowns"} -- the measured points, not read by the model.
    """
    return {
        NODE_KEY: {
            "devices_per_node": int(gpn),
            "points": _records(points),
            "slowdowns": _records(slowdowns),
        }
    }


def _as_default(curve: Saturating, note: str) -> Saturating:
    def d(p: Param) -> Param:
        return p if p.status == "fixed" else replace(p, status="default", note=note)

    return replace(curve, y_max=d(curve.y_max), x_half=d(curve.x_half), gamma=d(curve.gamma))


def _device(sel: Selection) -> str | None:
    """The devices the runs name; CPU-only traces say just "cpu", so a named processor
    (from a benchmark run on the same system) replaces that generic word."""
    devices = sorted({d for r in sel.runs for d in r.meta.devices})
    if "cpu" in devices and len(devices) > 1:
        devices.remove("cpu")
    return ", ".join(devices) if devices else None


def _provenance(sel: Selection, source: str, points: pd.DataFrame) -> dict:
    runs = []
    for r in sel.runs:
        runs.append(
            {
                "name": r.meta.name,
                "kind": r.meta.kind,
                "sources": [{"path": s.path, "sha256": s.sha256} for s in r.meta.sources],
            }
        )
    prov = {
        "system": sel.system,
        "runs": runs,
        "where": {k: list(v) for k, v in sorted(sel.where.items())},
        "samples_used": int(len(sel.samples)),
        "network_source": source,
        "trace_points": points.replace({np.nan: None}).to_dict(orient="records") if len(points) else [],
        "versions": {
            "calib": _version(),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "pandas": pd.__version__,
            "python": platform.python_version(),
        },
    }
    return prov
