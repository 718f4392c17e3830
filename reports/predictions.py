"""The numbers behind a report's prediction section, computed with analytic's public API.

Nothing here draws: each function returns plain tables (one row per configuration,
units in the column names) that the figure modules plot and the tests check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from calib.analytic.predict import Plan, predict
from calib.analytic.search import Space, search
from calib.analytic.specs import load_model
from calib.analytic.strategy import Strategies, valid_mask
from calib.analytic.timemodel import System, evaluate
from calib.reports.spec import MapSpec, PredictSpec, ScalingSpec, SearchSpec, ValidateSpec, table_path

from calib.core.errors import InputError


@dataclass(frozen=True)
class Maps:
    """Exposed communication per iteration over TP x DP (PP = 1) and TP x PP (fixed GPUs)."""

    spec: MapSpec
    tp_dp: pd.DataFrame  # tp, dp, pp, gpus, valid, oom, iter_s, comm_exposed_s, comm_share
    tp_pp: pd.DataFrame


@dataclass(frozen=True)
class SearchOut:
    spec: SearchSpec
    top: pd.DataFrame
    n_strategies: int
    n_feasible: int
    seconds: float


@dataclass(frozen=True)
class ValidationOut:
    spec: ValidateSpec
    path: str
    format: str
    split: str
    rows: pd.DataFrame  # label, group, role, quantity, measured, predicted, err_pct, ...
    summary: dict


@dataclass(frozen=True)
class Predictions:
    machine: str  # e.g. "polaris (NVIDIA A100-SXM4-40GB, calibration polaris)"
    hbm_gb: float | None
    scaling: pd.DataFrame | None = None  # model, zero + analytic.predict columns
    scaling_spec: ScalingSpec | None = None
    maps: Maps | None = None
    search: SearchOut | None = None
    validations: tuple[ValidationOut, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


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
    res = validate(df, str(path), None, v.calibrate_on, None, v.calibrate_on is None, "compute", 0)
    return ValidationOut(v, str(path), fmt, res.split, res.rows, res.summary)


def machine_label(system: System) -> str:
    hw, cal = system.hw, system.cal
    return f"{hw.name} ({hw.device}, {hw.gpus_per_node} GPUs/node, {hw.hbm_gb:g} GB HBM); calibration {cal.system}"
