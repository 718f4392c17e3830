"""Least-squares fits of the compute efficiencies a measured table can identify.

Used by :mod:`analytic.validate` (``network``, the default fit): the GEMM-efficiency plateau y_max (with k2 folded in),
optionally its half-saturation work x_half, the element-wise HBM traffic factor and the
attention core's efficiency over the GEMMs' (``attn_eff_ratio``: fused attention kernels
are not GEMMs -- online softmax, exponentials on the special-function units, a recomputing
backward -- and a trace-fitted device model times them on their own), each bounded to its
physical range; with ``network`` also the inter-node bus bandwidth's scale over the
machine's stated one (:func:`scaled_network`: what the software reached).  The element-wise
factor, the attention ratio and the network scale are kept only where the calibration rows
identify them (the GEMM plateau, which every row sees, always stays; until stop 21 the
element-wise factor was always fitted, and on small splits ran to a bound and crowded out a
network scale the rows did identify)
(at least one residual degree of freedom, and the estimate significantly different from
zero: |value| / stderr at least Student's t at 97.5 % with the fit's residual degrees of
freedom -- 12.7 with one, 2.0 with many -- i.e. rows whose attention share differs:
different sequence lengths or widths); otherwise the fit is repeated without it and the
system's value stands (the stated defaults: 5 passes, ratio 1, scale 1), said in ``not_identified`` (several: backward elimination, the
least identified first; with no residual degree of freedom to judge them by, the one whose
relative change moves the calibration rows least, :func:`_elasticity`).  The GEMM plateau's upper bound is the
device's measured maximum achievable matmul over its peak, where the preset has one.  A
parameter that ends on a bound is named in the fit's ``at_bound`` lines: the fit wanted a
value outside that range, so the parameter absorbs model error rather than measuring an
efficiency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import UTC, datetime

import numpy as np
from calib.analytic.machine import ATTN_EFF_RATIO_KEY, VECTOR_PASSES_KEY, achievable_fraction
from calib.analytic.timemodel import System
from calib.calibrate.calibration import FITTED, FIXED, Calibration, FitQuality, Param, Saturating
from scipy.optimize import least_squares

from calib.core.errors import InputError

FITS = ("compute", "network", "gemm", "ymax", "none")

#: End-to-end times cannot separate the transformer-kernel share k2 from the GEMM
#: efficiency (both scale the same FLOP time), so a fit folds k2 into gemm_y_max.
K2_FOLDED = Saturating(
    y_max=Param(1.0, status=FIXED, note="folded into gemm_y_max by a validation fit"),
    x_half=Param(0.0, unit="FLOP", status=FIXED, note="constant form"),
    gamma=Param(1.0, status=FIXED, note="constant form"),
)


def with_gemm(
    system: System, y_max: float, x_half: float, stderr: Sequence[float | None] = (None, None), note: str = ""
) -> System:
    curve = Saturating(
        y_max=Param(y_max, stderr=stderr[0], unit="", note=note),
        x_half=Param(x_half, stderr=stderr[1], unit="FLOP", note=note),
        gamma=Param(1.0, status=FIXED, note="dispatch-limited form"),
    )
    return replace(system, cal=replace(system.cal, gemm_efficiency_curve=curve))


#: fit name -> fitted quantities (log10 for x_half)
FIT_PARAMS = {
    "compute": ("gemm_y_max", "vector_passes", "attn_eff_ratio"),
    # + the inter-node bus bandwidth over the machine's stated one, as the software ran it
    # (kept only where identified, like the attention ratio)
    "network": ("gemm_y_max", "vector_passes", "attn_eff_ratio", "net_busbw_scale"),
    "gemm": ("gemm_y_max", "gemm_x_half_flop"),
    "ymax": ("gemm_y_max",),
}
_START = {"gemm_y_max": 0.6, "gemm_x_half_flop": 9.3, "vector_passes": 5.0, "attn_eff_ratio": 1.0,
          "net_busbw_scale": 1.0}  # fmt: skip
_BOUNDS = {
    "gemm_y_max": (0.05, 1.0),
    "gemm_x_half_flop": (6.0, 14.0),
    "vector_passes": (0.0, 40.0),
    # the model counts the attention core as 4 b s^2 d forward, not causal: a causal kernel
    # at the GEMMs' own efficiency would read as 2
    "attn_eff_ratio": (0.1, 2.0),
    # a stack reaching 2 % .. 150 % of the spec's inter-node busbw (the spec's is a derated plateau)
    "net_busbw_scale": (0.02, 1.5),
}
_SCALE = {"gemm_y_max": 0.1, "gemm_x_half_flop": 1.0, "vector_passes": 1.0, "attn_eff_ratio": 0.1,
          "net_busbw_scale": 0.1}  # fmt: skip
#: a fitted parameter is identified when |estimate| / stderr reaches Student's t at this
#: quantile with the fit's residual degrees of freedom (two-sided 95 %)
IDENTIFIED_QUANTILE = 0.975
#: dropped (the system's value: a stated default) when the rows do not identify them; only the
#: GEMM plateau, which every row sees, always stays
_OPTIONAL = ("vector_passes", "attn_eff_ratio", "net_busbw_scale")


def _apply(
    systems: dict[str, System],
    names: Sequence[str],
    theta: np.ndarray,
    se: np.ndarray | None = None,
    note: str = "",
) -> dict[str, System]:
    vals = dict(zip(names, theta))
    # a standard error that cannot be estimated (no residual dof) is stored as None, not 0
    errs = {n: (float(e) if np.isfinite(e) else None) for n, e in zip(names, se)} if se is not None else {}
    out = {}
    for h, s in systems.items():
        curve = s.cal.gemm_efficiency_curve
        y = vals.get("gemm_y_max", curve.y_max.value if curve else 0.75)
        xh = (
            10.0 ** vals["gemm_x_half_flop"]
            if "gemm_x_half_flop" in vals
            else (curve.x_half.value if curve else 2e9)
        )
        xh_se = (
            xh * np.log(10.0) * errs["gemm_x_half_flop"] if errs.get("gemm_x_half_flop") is not None else None
        )
        if "gemm_y_max" in vals:  # one stack efficiency, no device beyond its own best
            y = min(float(y), _device_cap(s))
            s = with_gemm(s, y, float(xh), (errs.get("gemm_y_max"), xh_se), note)
            s = replace(s, cal=replace(s.cal, k2_curve=K2_FOLDED))
        if "vector_passes" in vals:
            s = replace(s, vector_passes=float(vals["vector_passes"]))
        if "attn_eff_ratio" in vals:
            s = replace(s, attn_eff_ratio=float(vals["attn_eff_ratio"]))
        if "net_busbw_scale" in vals:
            s = scaled_network(s, float(vals["net_busbw_scale"]), errs.get("net_busbw_scale"), note)
        out[h] = s
    return out


def scaled_network(system: System, factor: float, stderr: float | None = None, note: str = "") -> System:
    """``system`` with the bus bandwidth of every collective curve across nodes times
    ``factor`` (the curves inside a node unchanged): what the measured rows say the software
    reached of the machine's inter-node bandwidth.  The curves carry the factor's error."""
    curves = tuple(
        replace(c, busbw_gbps=replace(c.busbw_gbps, value=c.busbw_gbps.value * factor, status=FITTED,
                stderr=None if stderr is None else c.busbw_gbps.value * stderr, note=note or c.busbw_gbps.note))
        if c.n_nodes > 1 else c
        for c in system.cal.collectives
    )  # fmt: skip
    return replace(system, cal=replace(system.cal, collectives=curves))


def fit(
    table, systems: dict[str, System], rows: np.ndarray, kind: str = "network"
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
    if n_rows < len(names):  # no more parameters than rows (one row: y_max alone)
        names = names[: max(n_rows, 1)]
    cap = _ymax_cap(systems)
    names, res, se, lo, hi = _least_squares(sub, systems, names, n_rows, cap)
    # backward elimination: the least identified optional parameter goes first and the rest
    # are judged again without it (an optional parameter needs residual degrees of freedom)
    not_identified = []
    while True:
        dof = n_rows - len(names)
        # ties (no dof, or a singular fit: no finite errors) drop the one the rows move least first
        weak = [(_strength(res.x[i], se[i], dof), _elasticity(res, i), n) for i, n in enumerate(names) if n in _OPTIONAL]  # fmt: skip
        weak = [w for w in weak if w[0] < 1.0]
        if not weak:
            break
        n = min(weak)[2]
        i = names.index(n)
        why = "no residual degree of freedom" if dof < 1 else f"{res.x[i]:.3g} +- {se[i]:.2g}"
        not_identified.append(f"{n} not identified by the calibration rows ({why}): {_kept(systems, n)} kept")
        names, res, se, lo, hi = _least_squares(sub, systems, tuple(x for x in names if x != n), n_rows, cap)
    note = f"fitted to {n_rows} measured row(s) of a validation table"
    fitted = _apply(systems, names, res.x, se, note)
    rel = np.expm1(res.fun)
    params = {"fit": kind, "n_calibration_rows": n_rows, "at_bound": at_bounds(names, res.x, lo, hi),
              "bound_hits": bound_hits(names, res.x, lo, hi)}  # fmt: skip
    if not_identified:
        params["not_identified"] = not_identified
    if n_rows - len(names) < 1:
        params["notes"] = [
            f"{n_rows} row(s) for {len(names)} parameter(s): an exact fit, no residual degree of freedom, "
            "so no standard error can be estimated (and no interval given)"
        ]
    if "gemm_y_max" in names:
        y = float(res.x[names.index("gemm_y_max")])
        held = sorted({f"{h} {_device_cap(s):.4g}" for h, s in systems.items() if _device_cap(s) < y})
        if held:  # a mixed table: some devices' rows stop at their own measured best
            params.setdefault("notes", []).append(
                f"gemm_y_max {y:.4g} holds up to each device's measured maximum achievable matmul: the rows "
                f"of {', '.join(held)} run at that (a GEMM does not beat its device's best)"
            )
    for n, v, e in zip(names, res.x, se):
        if not np.isfinite(e):
            params[n], params[n + "_stderr"] = float(10.0**v if n == "gemm_x_half_flop" else v), None
        elif n == "gemm_x_half_flop":
            params[n], params[n + "_stderr"] = float(10.0**v), float(10.0**v * np.log(10.0) * e)
        else:
            params[n], params[n + "_stderr"] = float(v), float(e)
    quality = FitQuality(
        n_points=n_rows, rmse=float(np.sqrt(np.mean(res.fun**2))), max_abs_rel_err=float(np.max(np.abs(rel)))
    )
    params["calibration_rmse_log"] = quality.rmse
    params["calibration_max_abs_pct"] = 100.0 * quality.max_abs_rel_err
    return fitted, params


def _kept(systems: dict[str, System], name: str) -> str:
    """What stands for an unidentified parameter: the stated default, or a calibration's value."""
    if name != "vector_passes":
        return "stated default 1"
    from calib.analytic.timemodel import VECTOR_PASSES

    v = next(iter(systems.values())).vector_passes
    return f"stated default {v:g}" if v == VECTOR_PASSES else f"the calibration's {v:.3g}"


def _device_cap(system: System) -> float:
    """No GEMM beats its device's measured maximum achievable matmul (k2, folded in, only
    lowers it): that fraction of peak where measured, else 1."""
    f = achievable_fraction(system.hw)
    return 1.0 if f is None else min(1.0, float(f))


def _ymax_cap(systems: dict[str, System]) -> float:
    """The fitted plateau's upper bound: the largest device cap of the table's machines.  Each
    machine's rows take the plateau up to its own cap (:func:`_apply`), so a table that mixes
    devices is not held to the lowest one's best (until stop 31: the least cap for every row)."""
    return max(_device_cap(s) for s in systems.values())


def _least_squares(sub, systems: dict[str, System], names: Sequence[str], n_rows: int, ymax_cap: float = 1.0):
    """(names, result, standard errors, lower, upper) of the bounded log-residual fit."""
    names = tuple(names)

    def resid(theta: np.ndarray) -> np.ndarray:
        return np.log(sub.predicted(_apply(systems, names, theta)) / sub.measured)

    bounds = {**_BOUNDS, "gemm_y_max": (_BOUNDS["gemm_y_max"][0], ymax_cap)}
    x0 = np.array([min(_START[n], 0.95 * bounds[n][1]) for n in names])
    lo, hi = (np.array([bounds[n][i] for n in names]) for i in (0, 1))
    with np.errstate(all="ignore"):
        bad = ~np.isfinite(resid(x0))
    if bad.any():  # a row the model cannot time (an absurd shape or layout): no fit through it
        label = sub.df["label"].iloc[int(np.flatnonzero(bad)[0])]
        raise InputError(
            None, f"calibration row '{label}': the model's prediction is not finite, so it cannot be fitted"
        )
    res = least_squares(resid, x0, bounds=(lo, hi), x_scale=np.array([_SCALE[n] for n in names]))
    if n_rows - len(names) < 1:  # an exact fit: no residual to estimate an error from
        return list(names), res, np.full(len(names), np.nan), lo, hi
    s2 = float(res.fun @ res.fun) / (n_rows - len(names))
    try:
        se = np.sqrt(np.clip(np.diag(np.linalg.inv(res.jac.T @ res.jac) * s2), 0.0, None))
    except np.linalg.LinAlgError:
        se = np.full(len(names), np.nan)
    return list(names), res, se, lo, hi


def _elasticity(res, i: int) -> float:
    """How much the calibration rows' log times move per relative change of parameter i:
    |x_i| * ||d residuals / d x_i|| (dimensionless, so parameters of any unit compare)."""
    return float(abs(res.x[i]) * np.linalg.norm(res.jac[:, i]))


def _strength(value: float, stderr: float, dof: int) -> float:
    """|estimate| / (stderr x Student's t): identified at 1 or more; 0 without a residual
    degree of freedom or a finite error."""
    if dof < 1 or not np.isfinite(stderr) or stderr <= 0:
        return 0.0 if dof < 1 or not np.isfinite(stderr) else np.inf
    from scipy.special import stdtrit  # Student t quantile, without importing scipy.stats

    return abs(value) / (float(stdtrit(int(dof), IDENTIFIED_QUANTILE)) * stderr)


def bound_hits(names: Sequence[str], x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[tuple]:
    """(parameter, side, bound as printed, value, value as printed) of every fitted parameter
    that ended on (within 0.1 % of the range of) a bound: the fit wanted a value outside the
    physical range, so the parameter absorbs model error."""
    out = []
    for n, v, a, b in zip(names, x, lo, hi):
        tol = 1e-3 * (b - a)
        side, bound = ("lower", a) if v - a <= tol else ("upper", b) if b - v <= tol else (None, None)
        if side is None:
            continue
        shown = (lambda u: f"{10.0**u:.3g}") if n == "gemm_x_half_flop" else (lambda u: f"{u:.4g}")
        out.append((n, side, shown(bound), float(v), shown(v)))
    return out


def at_bounds(names: Sequence[str], x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> list[str]:
    """One line per fitted parameter that ended on a bound (:func:`bound_hits`)."""
    return [f"{n} = {v} is at its {side} bound {b}" for n, side, b, _, v in bound_hits(names, x, lo, hi)]


def fitted_calibration(system: System, name: str, params: dict, source: str) -> Calibration:
    """The calibration a validation fit amounts to, named ``name``: the machine's own with
    the fitted GEMM-efficiency curve (k2 folded in) and, when fitted, the element-wise
    traffic factor and the attention efficiency ratio with their standard errors (in
    ``provenance``)."""
    cal = system.cal
    prov = {
        "source": f"validation fit on a measured table ({source})",
        "fit": {k: v for k, v in params.items() if not isinstance(v, list) or k == "at_bound"},
        "validation_hardware": system.hw.name,
    }
    fitted_note = f"fitted to {params['n_calibration_rows']} measured row(s) of a validation table"
    for field, key, unit in (("vector_passes", VECTOR_PASSES_KEY, "HBM passes"), ("attn_eff_ratio", ATTN_EFF_RATIO_KEY, "")):  # fmt: skip
        if field in params:
            prov[key] = asdict(Param(params[field], params.get(field + "_stderr"), unit, note=fitted_note))
    note = f"compute efficiencies fitted by a validation of {source}; collectives as in the base machine"
    return replace(
        cal,
        system=name,
        provenance=prov,
        notes=(*cal.notes, note),
        created=datetime.now(UTC).replace(microsecond=0).isoformat(),
    )
