"""``calib fit``: a system's runs and samples into one :class:`Calibration`.

Network factors come from nccl-tests samples (:mod:`calibrate.collectives`,
:mod:`calibrate.network`), compute factors from trace runs (:mod:`calibrate.compute`);
whatever the data cannot support keeps the stated default of ``Calibration.defaults``
with status "default" and a note naming the data it needs.  The result depends only on
the inputs (runs are read in sorted order, fits are deterministic); only ``created``
changes between two fits of the same store.
"""

from __future__ import annotations

import platform
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import scipy

from calibrate import compute
from calibrate.calibration import Calibration, Param, Saturating
from calibrate.collectives import fit_series, size_series
from calibrate.network import fit_networks
from calibrate.select import Selection, needs_text, select
from ingest.errors import InputError


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("calib")
    except Exception:  # noqa: BLE001 - metadata missing in a source checkout
        return ""


def fit_system(
    store: Path,
    system: str,
    *,
    where: dict[str, tuple[str, ...]] | None = None,
    peak_tflops: float | None = None,
) -> Calibration:
    """Fit every factor the stored data of ``system`` supports."""
    sel = select(Path(store), system, where or {})
    if sel.samples.empty and not sel.trace_runs:
        kinds = sorted({r.meta.kind for r in sel.runs})
        raise InputError(
            f"--system {system}",
            f"its runs ({', '.join(kinds)}) hold neither nccl-tests samples nor "
            f"trace buckets. {needs_text(system)}",
        )
    where_txt = f"--system {system}"
    notes: list[str] = list(sel.notes)
    curves, networks, gpn, source = _network(sel, where_txt, notes)
    if not gpn:
        gpn = 1
        notes.append("gpus_per_node unknown (only nccl-tests rank lines tell it); set to 1")
    base = Calibration.defaults(
        system,
        gpus_per_node=gpn,
        peak_tflops=peak_tflops,
        intra_busbw_gbps=1.0,
        inter_busbw_gbps=1.0,
        source="calib defaults",
    )
    defaults = {"k1": base.k1_curve, "k2": base.k2_curve, "gemm": base.gemm_efficiency_curve}
    cf = compute.fit_compute(sel.trace_runs, peak_tflops=peak_tflops, defaults=defaults, where=where_txt)
    notes.extend(cf.notes)
    no_traces = f"no trace runs for {system}: needs `calib ingest TRACE --system {system}`"
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
            "GEMM efficiency needs traces with record_shapes and --peak-tflops"
            if sel.trace_runs
            else no_traces
        ),
    )
    dispatch = dict(cf.dispatch) or {
        k: compute.default_note(v, f"{no_traces}; value is calib's default") for k, v in base.dispatch.items()
    }
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
        provenance=_provenance(sel, source, cf.points),
        notes=tuple(notes),
        created=base.created,
        calib_version=_version(),
    )


def _network(sel: Selection, where: str, notes: list[str]):
    if sel.samples.empty:
        return [], {}, None, ""
    versions = sorted(set(sel.samples["nccl_version"].astype(str)) - {""})
    setups = sorted(set(sel.samples["setup"].tolist()))
    source = f"nccl-tests setup={','.join(map(str, setups))}" + (
        f" nccl={','.join(versions)}" if versions else ""
    )
    if sel.samples["nccl_version"].nunique() > 1:
        pooled = sorted(v or "unknown" for v in sel.samples["nccl_version"].astype(str).unique())
        notes.append(
            f"pooled NCCL versions {', '.join(pooled)} as repetitions "
            "(median per size); separate them with --where nccl_version=V"
        )
    series = size_series(sel.samples, source)
    fitted = [(fit_series(s), s) for s in series]
    curves = [c for c, _ in fitted]
    pairs: dict[str, list] = {}
    for c, s in fitted:
        pairs.setdefault(c.collective, []).append((c, s))
    networks = fit_networks(pairs, where=where)
    single = [c for c, ps in pairs.items() if len([p for p in ps if p[0].n_nodes > 1]) == 1]
    if single:
        notes.append(
            f"one inter-node scale for {', '.join(single)}: eff_{{g->n}} per-step latency unidentifiable "
            "(upper bound used); ingest logs at a second node count"
        )
    gpn = int(sel.samples["gpus_per_node"].max())
    return curves, networks, gpn, source


def _as_default(curve: Saturating, note: str) -> Saturating:
    def d(p: Param) -> Param:
        return p if p.status == "fixed" else replace(p, status="default", note=note)

    return replace(curve, y_max=d(curve.y_max), x_half=d(curve.x_half), gamma=d(curve.gamma))


def _device(sel: Selection) -> str | None:
    devices = sorted({d for r in sel.runs for d in r.meta.devices})
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
