"""90 % prediction intervals of iteration times from a validation fit.

A fit of k efficiencies to n measured rows (``calib validate --calibrate-on ...``, log
residuals) leaves two errors, both from its own data: the parameters' -- their standard
errors, propagated by re-evaluating each configuration with one parameter moved up by one
standard error (finite differences, as the device model's interval does) -- and the rows'
scatter about the fitted model, s^2 = RSS / (n - k), which holds what the parameters cannot
(the model's own structure).  For a new configuration drawn like the calibration rows the
prediction interval of log time is the regression one,

    half = t_{0.95, n - k} sqrt(s^2 + sigma_p^2)

(Student t with the fit's residual degrees of freedom; none left: no interval), i.e. the
time within [t e^-half, t e^half] -- in log time, as the fit's residuals are.  It says
nothing of configurations unlike the calibration rows (another schedule, scale or device, a
transfer): ``calib validate`` reports how many held-out rows it covers, so the claim is
checked on rows the fit never saw.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from calib.analytic.machine import ATTN_EFF_RATIO_KEY, VECTOR_PASSES_KEY

LEVEL = 0.90
#: fitted quantities an interval moves (a System field, the GEMM curve's y_max / x_half, or
#: the inter-node bus bandwidth's scale, moved by a relative amount)
TERMS = ("gemm_y_max", "gemm_x_half_flop", "vector_passes", "attn_eff_ratio", "net_busbw_scale")


def moved(system, name: str, delta: float):
    """``system`` with the fitted quantity ``name`` moved by ``delta`` (its own units; for the
    network scale, relative: the inter-node busbw times 1 + delta)."""
    if name == "net_busbw_scale":
        from calib.analytic.vfit import scaled_network

        return scaled_network(system, 1.0 + delta)
    if name == "vector_passes":
        return replace(system, vector_passes=system.vector_passes + delta)
    if name == "attn_eff_ratio":
        return replace(system, attn_eff_ratio=system.attn_eff_ratio + delta)
    curve = system.cal.gemm_efficiency_curve
    field = "y_max" if name == "gemm_y_max" else "x_half"
    p = getattr(curve, field)
    curve = replace(curve, **{field: replace(p, value=p.value + delta)})
    return replace(system, cal=replace(system.cal, gemm_efficiency_curve=curve))


def half_width(rel_sigma_param, rmse_log: float, n_rows: int, n_params: int) -> np.ndarray | None:
    """Half-width in log time, t_{0.95, n-k} sqrt(s^2 + sigma_p^2), s^2 = n rmse^2 / (n - k);
    None without a residual degree of freedom."""
    from scipy.special import stdtrit  # Student t quantile, without importing scipy.stats

    dof = int(n_rows) - int(n_params)
    if dof < 1 or not np.isfinite(rmse_log):
        return None
    s2 = n_rows * rmse_log**2 / dof
    sp = np.asarray(rel_sigma_param, dtype=float)
    return stdtrit(dof, 0.5 + LEVEL / 2.0) * np.sqrt(s2 + sp * sp)


def param_sigma(times, stderrs: dict[str, float], base_s) -> np.ndarray:
    """Relative error of ``base_s`` from the fitted terms: sqrt(sum (t(theta_i + se_i) / t - 1)^2);
    ``times(name, se)`` re-evaluates with one term moved."""
    base = np.asarray(base_s, dtype=float)
    var = np.zeros_like(base)
    for name, se in stderrs.items():
        if se is not None and np.isfinite(se) and se > 0:
            var = var + (np.asarray(times(name, se), dtype=float) / base - 1.0) ** 2
    return np.sqrt(var)


def _fit_record(cal) -> dict:
    """The validation fit stored by ``--save-calibration`` (``provenance.fit``, under a
    transfer ``provenance.source.fit``); {} for a calibration no validation fitted."""
    prov = cal.provenance or {}
    src = prov.get("source")
    fit = prov.get("fit") or (src.get("fit") if isinstance(src, dict) else None)
    return fit if isinstance(fit, dict) else {}


def fit_stats(cal) -> dict | None:
    """The fit's (n rows, k parameters, rmse); None for a calibration no validation fitted."""
    fit = _fit_record(cal)
    if "n_calibration_rows" not in fit:
        return None
    k = sum(1 for t in TERMS if t in fit)
    return {
        "n": int(fit["n_calibration_rows"]),
        "k": k,
        "rmse": float(fit.get("calibration_rmse_log", np.nan)),
    }


def saved_stderrs(system) -> dict[str, float]:
    """Standard errors of a validation-fitted system's terms: the GEMM curve's own, and the
    element-wise traffic's and attention ratio's stored in provenance."""
    out = {}
    curve = system.cal.gemm_efficiency_curve
    if curve is not None and curve.y_max.stderr is not None:
        out["gemm_y_max"] = float(curve.y_max.stderr)
    if curve is not None and curve.x_half.stderr is not None:
        out["gemm_x_half_flop"] = float(curve.x_half.stderr)
    prov = system.cal.provenance or {}
    for key, name in ((VECTOR_PASSES_KEY, "vector_passes"), (ATTN_EFF_RATIO_KEY, "attn_eff_ratio")):
        v = prov.get(key)
        if isinstance(v, dict) and isinstance(v.get("stderr"), (int, float)):
            out[name] = float(v["stderr"])
    fit = _fit_record(system.cal)
    if fit.get("net_busbw_scale") and isinstance(fit.get("net_busbw_scale_stderr"), (int, float)):
        out["net_busbw_scale"] = float(fit["net_busbw_scale_stderr"]) / float(fit["net_busbw_scale"])
    return out


def validation_interval(model, system, st, iter_s) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """(lower, upper, notes) of each strategy's iteration time under a validation-fitted
    calibration, or None when the calibration carries no such fit (or no residual dof)."""
    from calib.analytic.timemodel import evaluate

    stats_ = fit_stats(system.cal)
    if stats_ is None:
        return None
    it = np.asarray(iter_s, dtype=float)

    def times(name, se):
        return evaluate(model, moved(system, name, se), st, lean=True)["iter_s"]

    half = half_width(param_sigma(times, saved_stderrs(system), it), stats_["rmse"], stats_["n"], stats_["k"])
    if half is None:
        return None
    notes = [
        f"{LEVEL:.0%} interval (iter_s_lo..iter_s_hi): the validation fit's parameter errors and the scatter "
        f"of its {stats_['n']} calibration rows about it (Student t, {stats_['n'] - stats_['k']} dof); it holds "
        "configurations like those rows, not another schedule, scale or device"
    ]
    if "transferred_from" in (system.cal.provenance or {}):
        notes.append("transferred calibration: the interval does not hold the transfer's error")
    return it * np.exp(-half), it * np.exp(half), notes


# ---- validation tables: each row's interval and the held-out coverage ----------------
def with_saved_interval(rows, table, systems: dict):
    """Rows predicted with one saved validation fit (``--calibration NAME --fit none``) get
    that fit's interval (above); it does not hold a transfer's error or that of
    configurations unlike its calibration rows -- the coverage shows how far it carries."""
    if len({id(s.cal) for s in systems.values()}) != 1:
        return rows
    system = next(iter(systems.values()))
    stats_ = fit_stats(system.cal)
    if stats_ is None:
        return rows
    prm = {f"{n}_stderr": se for n, se in saved_stderrs(system).items()}
    prm.update(calibration_rmse_log=stats_["rmse"], n_calibration_rows=stats_["n"])
    return with_interval(rows, table, systems, prm)


def coverage(held) -> dict:
    """How many held-out rows with an interval fall inside it, and its median half-width."""
    if "interval_pct" not in held or held["interval_pct"].isna().all():
        return {}
    has = held["interval_pct"].notna()
    return {
        "n_inside_interval": int(held.loc[has, "inside"].astype(bool).sum()),
        "n_with_interval": int(has.sum()),
        "median_interval_pct": float(held.loc[has, "interval_pct"].median()),
    }


def with_interval(rows, table, fitted: dict, prm: dict):
    """Each row of a validation table (analytic.validate.Table) with its 90 % interval from
    the fit (the parameters' errors and the calibration rows' scatter) and whether the
    measured value falls inside it."""
    stderrs = {n: prm[n + "_stderr"] for n in TERMS if n + "_stderr" in prm}
    if "net_busbw_scale" in stderrs and prm.get("net_busbw_scale"):  # moved relatively
        stderrs["net_busbw_scale"] = stderrs["net_busbw_scale"] / prm["net_busbw_scale"]
    base = rows["pred_iter_s"].to_numpy(dtype=float)

    def times(name, se):
        return table.iter_s({h: moved(sy, name, se) for h, sy in fitted.items()})[0]

    sigma = param_sigma(times, stderrs, base)
    half = half_width(
        sigma, prm.get("calibration_rmse_log", np.nan), prm.get("n_calibration_rows", 0), len(stderrs)
    )
    if half is None:
        return rows
    pred, meas = rows["predicted"].to_numpy(dtype=float), rows["measured"].to_numpy(dtype=float)
    ratio = np.where(table.inverse, pred / meas, meas / pred)  # measured time / predicted time
    return rows.assign(interval_pct=100.0 * np.expm1(half), inside=np.abs(np.log(ratio)) <= half)
