"""Predictions against measured tables, with honest held-out errors.

The model's compute efficiency (the GEMM-efficiency curve, which end-to-end times cannot
separate from k1 and k2) is fitted by least squares on log(predicted / measured) over a
*stated* subset of rows; errors are reported on the other rows only.  Three splits:

* ``calibrate_on``: row numbers (1-based), labels or ``group`` tags,
* ``holdout``: a seeded random fraction held out,
* leave-one-out: every row is predicted by a fit to all the others.

``fit="none"`` evaluates the calibration as given (no row is used for fitting).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from calib.analytic import formulas as F
from calib.analytic.machine import default_calibration
from calib.analytic.specs import load_hardware
from calib.analytic.strategy import Strategies, check_config, valid_mask
from calib.analytic.timemodel import System, comm_times, evaluate
from calib.analytic.vtable import model_columns
from calib.calibrate.calibration import FIXED, FitQuality, Param, Saturating
from scipy.optimize import least_squares

from calib.core.errors import InputError

FITS = ("compute", "gemm", "ymax", "none")
#: End-to-end times cannot separate the transformer-kernel share k2 from the GEMM
#: efficiency (both scale the same FLOP time), so a fit folds k2 into gemm_y_max.
K2_FOLDED = Saturating(
    y_max=Param(1.0, status=FIXED, note="folded into gemm_y_max by a validation fit"),
    x_half=Param(0.0, unit="FLOP", status=FIXED, note="constant form"),
    gamma=Param(1.0, status=FIXED, note="constant form"),
)


@dataclass(frozen=True)
class Validation:
    """Per-row results, the summary over held-out rows, and the fitted parameters."""

    rows: pd.DataFrame
    summary: dict
    params: dict
    split: str


def strategies_of(df: pd.DataFrame) -> Strategies:
    return Strategies.of(
        tp=df["tp"].to_numpy(), pp=df["pp"].to_numpy(), dp=(df["gpus"] // (df["tp"] * df["pp"])).to_numpy(),
        micro_batch=df["micro_batch"].to_numpy(), global_batch=df["global_batch"].to_numpy(),
        interleave=df["interleave"].to_numpy(), zero=df["zero"].to_numpy(),
        recompute=df["recompute"].map(F.RECOMPUTE_NAMES.index).to_numpy(),
        seq_parallel=df["seq_parallel"].to_numpy(), dp_overlap=df["dp_overlap"].to_numpy(),
        flash_attention=df["flash_attention"].to_numpy(),
    )  # fmt: skip


def check_rows(df: pd.DataFrame, where: str) -> None:
    """Every row must be a valid strategy; name the first bad row and its rule."""
    st = strategies_of(df)
    ok = valid_mask(model_columns(df), st) & (df["gpus"] % (df["tp"] * df["pp"]) == 0).to_numpy()
    if ok.all():
        return
    i = int(np.flatnonzero(~ok)[0])
    r = df.iloc[i]
    from calib.analytic.specs import ModelSpec

    model = ModelSpec(
        str(r["label"]),
        int(r["d_model"]),
        int(r["n_layers"]),
        int(r["n_heads"]),
        int(r["seq_len"]),
        int(r["vocab"]),
    )
    try:
        check_config(model, int(r["gpus"]), int(r["tp"]), int(r["pp"]), int(r["micro_batch"]), int(r["global_batch"]),
                     int(r["interleave"]), int(r["zero"]), F.RECOMPUTE_NAMES.index(r["recompute"]), bool(r["seq_parallel"]))  # fmt: skip
    except InputError as exc:
        raise InputError(where, f"row {i + 1} ({r['label']}): {exc.problem}") from None
    raise InputError(where, f"row {i + 1} ({r['label']}): invalid strategy")


def systems_for(df: pd.DataFrame, base: System | None, where: str) -> dict[str, System]:
    """One System per hardware named in the table (or ``base`` for every row)."""
    if base is not None:
        return {h: base for h in df["hardware"].unique()}
    if (df["hardware"] == "").any():
        i = int(np.flatnonzero((df["hardware"] == "").to_numpy())[0])
        raise InputError(where, f"row {i + 1}: no hardware column value; give a hardware spec or a system")
    out = {}
    for h in df["hardware"].unique():
        hw = load_hardware(h)
        out[h] = System(default_calibration(hw), hw)
    return out


def with_gemm(
    system: System, y_max: float, x_half: float, stderr: Sequence[float | None] = (None, None), note: str = ""
) -> System:
    curve = Saturating(
        y_max=Param(y_max, stderr=stderr[0], unit="", note=note),
        x_half=Param(x_half, stderr=stderr[1], unit="FLOP", note=note),
        gamma=Param(1.0, status=FIXED, note="dispatch-limited form"),
    )
    return replace(system, cal=replace(system.cal, gemm_efficiency_curve=curve))


@dataclass(frozen=True)
class Table:
    """A normalised table prepared once for repeated evaluation (fits call it many times)."""

    df: pd.DataFrame
    groups: tuple  # (hardware, row indices, ModelColumns, Strategies) per hardware
    measured: np.ndarray
    inverse: np.ndarray  # True where the measured quantity is a rate: predicted = scale / iter_s
    scale: np.ndarray
    quantity: np.ndarray
    _comm: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, df: pd.DataFrame) -> Table:
        df = df.reset_index(drop=True)
        groups = []
        for h in df["hardware"].unique():
            idx = np.flatnonzero((df["hardware"] == h).to_numpy())
            sub = df.iloc[idx]
            groups.append((h, idx, model_columns(sub), strategies_of(sub)))
        d, L, s, V = (df[c].to_numpy(dtype=float) for c in ("d_model", "n_layers", "seq_len", "vocab"))
        B = df["global_batch"].to_numpy(dtype=float)
        n = df["gpus"].to_numpy(dtype=float)
        rc = df["recompute"].map(F.RECOMPUTE_NAMES.index).to_numpy()
        flops = {
            "model": B * F.model_flops(1.0, s, d, L, V),
            "hardware": B * (F.training_flops_layers(1.0, s, d, L, rc) + F.lm_head_flops(1.0, s, d, V)),
            "megatron_eq3": F.megatron_eq3_flops(B, s, d, L, V),
        }
        conv = df["tflops_convention"].to_numpy()
        fl = np.select([conv == k for k in flops], list(flops.values()), default=np.nan)
        is_iter = df["measured_iter_s"].notna().to_numpy()
        is_tflops = ~is_iter & df["measured_tflops_per_gpu"].notna().to_numpy()
        measured = np.where(
            is_iter,
            df["measured_iter_s"],
            np.where(is_tflops, df["measured_tflops_per_gpu"], df["measured_tokens_per_s_per_gpu"]),
        )
        scale = np.where(is_tflops, fl / n / 1e12, B * s / n)
        quantity = np.where(is_iter, "iter_s", np.where(is_tflops, "tflops_per_gpu", "tokens_per_s_per_gpu"))
        return cls(df, tuple(groups), measured.astype(float), ~is_iter, scale, quantity)

    def subset(self, mask: np.ndarray) -> Table:
        return Table.of(self.df.loc[mask])

    def iter_s(self, systems: dict[str, System]) -> tuple[np.ndarray, np.ndarray]:
        it = np.empty(len(self.df))
        oom = np.zeros(len(self.df), dtype=bool)
        for h, idx, model, st in self.groups:
            system = systems[h]
            # fits change compute parameters only: reuse collective times per calibration
            key = (h, id(system.cal.collectives), id(system.cal.network), system.gpus_per_node)
            if key not in self._comm:
                self._comm[key] = comm_times(model, system, st)
            r = evaluate(model, system, st, self._comm[key])
            it[idx] = r["iter_s"]
            oom[idx] = r["oom"]
        return it, oom

    def predicted(self, systems: dict[str, System]) -> np.ndarray:
        it, _ = self.iter_s(systems)
        return np.where(self.inverse, self.scale / it, it)

    def rows(self, systems: dict[str, System]) -> pd.DataFrame:
        it, oom = self.iter_s(systems)
        pred = np.where(self.inverse, self.scale / it, it)
        return pd.DataFrame({
            "label": self.df["label"], "group": self.df["group"], "quantity": self.quantity,
            "measured": self.measured, "predicted": pred, "err_pct": (pred / self.measured - 1.0) * 100.0,
            "pred_iter_s": it, "oom": oom,
        })  # fmt: skip


def select_rows(df: pd.DataFrame, spec: str, where: str = "calibrate_on") -> np.ndarray:
    """Mask of rows named by 1-based numbers, ranges (3-5), labels or group tags, comma separated."""
    mask = np.zeros(len(df), dtype=bool)
    for tok in filter(None, (t.strip() for t in spec.split(","))):
        if tok.replace("-", "").isdigit() and tok[0] != "-":
            lo, _, hi = tok.partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
            if not 1 <= lo_i <= hi_i <= len(df):
                raise InputError(where, f"row range '{tok}' outside 1..{len(df)}")
            mask[lo_i - 1 : hi_i] = True
        elif (df["label"] == tok).any() or (df["group"] == tok).any():
            mask |= ((df["label"] == tok) | (df["group"] == tok)).to_numpy()
        else:
            raise InputError(where, f"'{tok}' is neither a row number, a label nor a group of the table")
    return mask


#: fit name -> fitted quantities (log10 for x_half)
FIT_PARAMS = {
    "compute": ("gemm_y_max", "vector_passes"),
    "gemm": ("gemm_y_max", "gemm_x_half_flop"),
    "ymax": ("gemm_y_max",),
}
_START = {"gemm_y_max": 0.6, "gemm_x_half_flop": 9.3, "vector_passes": 5.0}
_BOUNDS = {"gemm_y_max": (0.05, 1.0), "gemm_x_half_flop": (6.0, 14.0), "vector_passes": (0.0, 40.0)}
_SCALE = {"gemm_y_max": 0.1, "gemm_x_half_flop": 1.0, "vector_passes": 1.0}


def _apply(
    systems: dict[str, System],
    names: Sequence[str],
    theta: np.ndarray,
    se: np.ndarray | None = None,
    note: str = "",
) -> dict[str, System]:
    vals = dict(zip(names, theta))
    errs = dict(zip(names, se)) if se is not None else {}
    out = {}
    for h, s in systems.items():
        curve = s.cal.gemm_efficiency_curve
        y = vals.get("gemm_y_max", curve.y_max.value if curve else 0.75)
        xh = (
            10.0 ** vals["gemm_x_half_flop"]
            if "gemm_x_half_flop" in vals
            else (curve.x_half.value if curve else 2e9)
        )
        xh_se = xh * np.log(10.0) * errs["gemm_x_half_flop"] if "gemm_x_half_flop" in errs else None
        if "gemm_y_max" in vals:
            s = with_gemm(s, float(y), float(xh), (errs.get("gemm_y_max"), xh_se), note)
            s = replace(s, cal=replace(s.cal, k2_curve=K2_FOLDED))
        if "vector_passes" in vals:
            s = replace(s, vector_passes=float(vals["vector_passes"]))
        out[h] = s
    return out


def fit(
    table: Table, systems: dict[str, System], rows: np.ndarray, kind: str = "compute"
) -> tuple[dict[str, System], dict]:
    """Least-squares fit of the compute-efficiency parameters of ``kind`` on ``rows``.

    Residuals are log(predicted / measured) of the measured quantity; standard errors come
    from the Jacobian (covariance = (J^T J)^-1 * residual variance).
    """
    if kind == "none":
        return systems, {}
    if not rows.any():
        raise InputError("calibrate_on", "no calibration rows selected")
    sub = table.subset(rows)
    n_rows = int(rows.sum())
    names = FIT_PARAMS[kind]
    if n_rows < len(names):
        names = names[:1]

    def resid(theta: np.ndarray) -> np.ndarray:
        return np.log(sub.predicted(_apply(systems, names, theta)) / sub.measured)

    x0 = np.array([_START[n] for n in names])
    lo, hi = (np.array([_BOUNDS[n][i] for n in names]) for i in (0, 1))
    res = least_squares(resid, x0, bounds=(lo, hi), x_scale=np.array([_SCALE[n] for n in names]))
    dof = max(n_rows - len(names), 1)
    s2 = float(res.fun @ res.fun) / dof
    try:
        se = np.sqrt(np.clip(np.diag(np.linalg.inv(res.jac.T @ res.jac) * s2), 0.0, None))
    except np.linalg.LinAlgError:
        se = np.full(len(names), np.nan)
    note = f"fitted to {n_rows} measured row(s) of a validation table"
    fitted = _apply(systems, names, res.x, se, note)
    rel = np.expm1(res.fun)
    params = {"fit": kind, "n_calibration_rows": n_rows}
    for n, v, e in zip(names, res.x, se):
        if n == "gemm_x_half_flop":
            params[n], params[n + "_stderr"] = float(10.0**v), float(10.0**v * np.log(10.0) * e)
        else:
            params[n], params[n + "_stderr"] = float(v), float(e)
    quality = FitQuality(
        n_points=n_rows, rmse=float(np.sqrt(np.mean(res.fun**2))), max_abs_rel_err=float(np.max(np.abs(rel)))
    )
    params["calibration_rmse_log"] = quality.rmse
    params["calibration_max_abs_pct"] = 100.0 * quality.max_abs_rel_err
    return fitted, params


def summarise(errors_pct: np.ndarray) -> dict:
    e = np.abs(np.asarray(errors_pct, dtype=float))
    if e.size == 0:
        return {"n_heldout": 0, "median_abs_pct": None, "mean_abs_pct": None, "max_abs_pct": None}
    return {
        "n_heldout": int(e.size),
        "median_abs_pct": float(np.median(e)),
        "mean_abs_pct": float(np.mean(e)),
        "max_abs_pct": float(np.max(e)),
    }


def validate(
    df: pd.DataFrame,
    where: str,
    base: System | None = None,
    calibrate_on: str | None = None,
    holdout: float | None = None,
    loo: bool = False,
    fit_kind: str = "compute",
    seed: int = 0,
) -> Validation:
    """Run the model over a normalised table with the chosen split (see module docstring)."""
    if fit_kind not in FITS:
        raise InputError("fit", f"unknown fit '{fit_kind}' (known: {', '.join(FITS)})")
    if sum(x is not None and x is not False for x in (calibrate_on, holdout, loo or None)) > 1:
        raise InputError("calibrate_on", "give at most one of calibrate_on, holdout, loo")
    check_rows(df, where)
    systems = systems_for(df, base, where)
    table = Table.of(df)
    n = len(df)
    if fit_kind == "none":
        rows = table.rows(systems).assign(role="held-out")
        return Validation(
            rows, summarise(rows["err_pct"]), {"fit": "none"}, "no fit: the calibration as given"
        )
    if loo or (calibrate_on is None and holdout is None):
        if n < 2:
            raise InputError(where, "leave-one-out needs at least two rows")
        parts, params = [], []
        for i in range(n):  # one fit per fold (n fits), each vectorised over the table
            keep = np.arange(n) != i
            fitted, prm = fit(table, systems, keep, fit_kind)
            parts.append(table.subset(~keep).rows(fitted))
            params.append(prm)
        rows = pd.concat(parts, ignore_index=True).assign(role="held-out")
        prm = {"fit": fit_kind, "folds": n}
        for name in FIT_PARAMS[fit_kind]:
            vals = np.array([p[name] for p in params if name in p])
            if vals.size:
                prm[name + "_range"] = [float(vals.min()), float(vals.max())]
        return Validation(rows, summarise(rows["err_pct"]), prm, f"leave-one-out over {n} rows")
    if calibrate_on is not None:
        cal_rows = select_rows(df, calibrate_on)
        split = f"calibrated on {int(cal_rows.sum())} stated row(s): {calibrate_on}"
    else:
        if not 0 < holdout < 1:
            raise InputError("holdout", f"fraction must be in (0, 1), got {holdout}")
        rng = np.random.default_rng(seed)
        n_hold = min(max(1, int(round(holdout * n))), n - 1)
        held = np.zeros(n, dtype=bool)
        held[rng.choice(n, n_hold, replace=False)] = True
        cal_rows = ~held
        split = f"random hold-out of {n_hold}/{n} rows (seed {seed})"
    if cal_rows.all():
        raise InputError("calibrate_on", "every row is a calibration row; nothing is held out")
    fitted, prm = fit(table, systems, cal_rows, fit_kind)
    rows = table.rows(fitted).assign(role=np.where(cal_rows, "calibration", "held-out"))
    return Validation(rows, summarise(rows.loc[~cal_rows, "err_pct"]), prm, split)
