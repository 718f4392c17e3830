"""The numbers a report shows, computed here (API layer) and handed to :mod:`calib.reports`.

For a prediction spec (:mod:`calib.reports.spec`) and a machine: ZeRO scaling curves,
TP x DP / TP x PP communication maps, a strategy search and validations against
published tables, as :class:`calib.reports.predictions.Predictions`.  Nothing here draws.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from calib.analytic.machine import build_system
from calib.analytic.predict import Plan, predict
from calib.analytic.search import Space, search
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies, valid_mask
from calib.analytic.timemodel import System, evaluate
from calib.core.errors import InputError
from calib.reports.inputs import Inputs
from calib.reports.predictions import Maps, Predictions, SearchOut, ValidationOut
from calib.reports.spec import MapSpec, PredictSpec, ScalingSpec, SearchSpec, ValidateSpec, table_path


def machine_for(inputs: Inputs, spec: PredictSpec | None, notes: list[str]) -> System | None:
    """The analytic System to predict with, or None (then only validation can run)."""
    hardware = spec.hardware if spec else None
    if inputs.calibration is None and not hardware:
        return None
    origin = str(inputs.calibration_path) if inputs.calibration_path is not None else None
    hw = load_hardware(hardware) if hardware else None
    system, more = build_system(inputs.calibration, hw, origin=origin)
    notes.extend(more)
    return system


def predictions(
    inputs: Inputs, spec: PredictSpec, step: Callable[[str], None] = lambda name: None
) -> Predictions:
    """Everything ``spec`` asks for, on the machine of ``inputs`` (``step`` marks progress)."""
    notes: list[str] = []
    step("machine")
    system = machine_for(inputs, spec, notes)
    if system is None and (spec.scaling or spec.maps or spec.search):
        notes.append("no machine to predict with: give a fitted system, a calibration file, or a prediction "
                     "spec with 'hardware: PRESET'")  # fmt: skip
    scaling = maps_out = found = None
    if system is not None:
        step("scaling")
        scaling = scaling_table(system, spec.scaling, notes) if spec.scaling else None
        step("maps")
        maps_out = maps(system, spec.maps) if spec.maps else None
        step("search")
        found = run_search(system, spec.search) if spec.search else None
    step("validation")
    vals = tuple(run_validation(spec, v) for v in spec.validate)
    return Predictions(
        machine=machine_label(system) if system else "-",
        hbm_gb=system.hw.hbm_bytes / 1e9 if system else None,  # binary GiB as GB of the memory terms
        scaling=scaling,
        scaling_spec=spec.scaling,
        maps=maps_out,
        search=found,
        validations=vals,
        notes=tuple(notes),
    )


def scaling_table(system: System, spec: ScalingSpec, notes: list[str]) -> pd.DataFrame:
    """calib.analytic.predict for every model x ZeRO stage over the GPU counts (weak scaling)."""
    frames = []
    for name in spec.models:
        model = load_model(name)
        for z in spec.zero:
            try:
                res = predict(model, system, list(spec.gpus), Plan(zero=z, micro_batch=spec.micro_batch))
            except InputError as exc:
                notes.append(f"scaling {name} ZeRO-{z}: skipped ({exc.problem})")
                continue
            t = res.table
            frames.append(t.assign(model=name, params_b=_params_b(model)).astype({"zero": int}))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    df["mem_reserve_gb"] = df["mem_total_gb"] - df[
        ["mem_weights_gb", "mem_grads_gb", "mem_optimizer_gb", "mem_activations_gb"]
    ].sum(axis=1)
    return df


def _params_b(model) -> float:
    from calib.analytic import formulas as F

    return float(F.params_total(model.d_model, model.n_layers, model.vocab, model.seq_len)) / 1e9


def _grid(model, system: System, tp, pp, dp, mb: int, batch, zero: int) -> pd.DataFrame:
    """Evaluate a flat list of layouts; invalid ones are kept as rows with valid=False."""
    tp, pp, dp, batch = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (tp, pp, dp, batch)))
    ok = dp >= 1
    st_all = Strategies.of(tp=tp, pp=pp, dp=np.maximum(dp, 1), micro_batch=mb, global_batch=batch, zero=zero)
    ok &= np.broadcast_to(valid_mask(model, st_all), tp.shape)
    out = pd.DataFrame(
        {"tp": tp, "pp": pp, "dp": dp, "gpus": tp * pp * dp, "global_batch": batch, "valid": ok}
    )
    for c in ("iter_s", "comm_exposed_s", "compute_s", "mem_total_gb"):
        out[c] = np.nan
    out["oom"] = False
    if ok.any():
        st = Strategies.of(tp=tp[ok], pp=pp[ok], dp=dp[ok], micro_batch=mb, global_batch=batch[ok], zero=zero)
        r = evaluate(model, system, st)
        n = int(ok.sum())
        out.loc[ok, "iter_s"] = np.broadcast_to(r["iter_s"], (n,))
        out.loc[ok, "comm_exposed_s"] = np.broadcast_to(r["comm_exposed_s"], (n,))
        out.loc[ok, "compute_s"] = np.broadcast_to(r["compute_s"], (n,))
        out.loc[ok, "mem_total_gb"] = np.broadcast_to(r["mem_total_bytes"], (n,)) / 1e9
        out.loc[ok, "oom"] = np.broadcast_to(r["oom"], (n,))
    out["comm_share"] = out["comm_exposed_s"] / out["iter_s"]
    return out


def maps(system: System, spec: MapSpec) -> Maps:
    model = load_model(spec.model)
    t1, d1 = np.meshgrid(spec.tp, spec.dp, indexing="ij")
    tp_dp = _grid(
        model, system, t1.ravel(), 1, d1.ravel(), spec.micro_batch, spec.micro_batch * d1.ravel(), spec.zero
    )
    t2, p2 = np.meshgrid(spec.tp, spec.pp, indexing="ij")
    t2, p2 = t2.ravel(), p2.ravel()
    dp2 = np.where(spec.gpus % (t2 * p2) == 0, spec.gpus // (t2 * p2), 0)
    tp_pp = _grid(model, system, t2, p2, dp2, spec.micro_batch, spec.global_batch, spec.zero)
    return Maps(spec, tp_dp, tp_pp)


def run_search(system: System, spec: SearchSpec) -> SearchOut:
    from calib.analytic.formulas import RECOMPUTE_NAMES

    model = load_model(spec.model)
    res = search(model, system, spec.gpus, spec.global_batch, Space(), spec.top)
    top = res.top
    if not top.empty:
        top = top.assign(recompute=[RECOMPUTE_NAMES[i] for i in top["recompute"]])
        rest = top[["compute_s", "tp_s", "pp_s", "dp_exposed_s", "bubble_s"]].sum(axis=1)
        top = top.assign(optimizer_s=(top["iter_s"] - rest).clip(lower=0.0))
    return SearchOut(spec, top, res.n_strategies, res.n_feasible, res.seconds)


def run_validation(spec: PredictSpec, v: ValidateSpec) -> ValidationOut:
    from calib.analytic.validate import validate
    from calib.analytic.vtable import read_table

    path = table_path(spec, v.table)
    df, fmt = read_table(path, "auto")
    res = validate(df, str(path), None, v.calibrate_on, None, v.calibrate_on is None, "network", 0)
    return ValidationOut(v, str(path), fmt, res.split, res.rows, res.summary)


def machine_label(system: System) -> str:
    hw, cal = system.hw, system.cal
    return f"{hw.name} ({hw.device}, {hw.gpus_per_node} GPUs/node, {hw.hbm_gb:g} GB HBM); calibration {cal.system}"
