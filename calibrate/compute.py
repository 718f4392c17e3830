"""Compute factors from trace runs: k1, k2, GEMM efficiency and dispatch cost per operator.

x, the work per operator, is the mean FLOPs of one matmul operator in an iteration
(``gemm_flops / n_gemms`` of the ``buckets`` table, traces recorded with shapes).  Per
run (median over its ranks and iterations, so repeated iterations are not counted as
independent evidence):

* k1 = kernel / (kernel + intra-op + inter-op): seed 004's kernel share of compute.
  "Other" idle (waiting on synchronisation or data) is neither kernel nor dispatch and
  is left out, as in the paper's split.
* k2 = (GEMM + attention kernel time) / kernel time (``kernels`` table, classes of
  ``calib.core.schema.TRANSFORMER_CLASSES``).
* GEMM efficiency = FLOPs / duration / peak of each matmul shape (``gemms`` table),
  the median over calls of a shape; needs the device's dense peak (``--peak-tflops``).
* dispatch: intra-op and inter-op seconds per operator (``intra_op_s / n_ops``).

k1 and k2 are fitted as :class:`Saturating` curves of x with gamma = 1 -- the
dispatch-limited form: a fixed host cost per operator and device time proportional to
x give kernel share x / (x + x_half) -- by ``scipy.optimize.curve_fit`` with relative
residuals; GEMM efficiency fits gamma too when it has >= 8 work levels spanning >= 10x.
Fewer than two work levels cannot separate y_max from x_half: the curve is anchored at
the measured level and both parameters are marked unidentifiable.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from calib.calibrate.calibration import DEFAULT, FITTED, FIXED, UNIDENTIFIABLE, FitQuality, Param, Saturating
from calib.calibrate.levels import LEVEL_RATIO, work_levels  # noqa: F401 - re-exported
from scipy.optimize import OptimizeWarning, curve_fit

from calib.core.errors import InputError
from calib.core.rundir import Run
from calib.core.schema import TRANSFORMER_CLASSES

MIN_LEVELS_GAMMA = 8


@dataclass(frozen=True)
class ComputeFit:
    """The compute factors a trace set supports; None where it supports nothing."""

    k1: Saturating | None
    k2: Saturating | None
    gemm_efficiency: Saturating | None
    dispatch: dict[str, Param]
    points: pd.DataFrame  # one row per run: run, x_flops, k1, k2, intra/inter per op
    notes: tuple[str, ...]
    gemm_points: pd.DataFrame | None = None  # x_flops, eff, shapes, source (trace level / bench shape)


def run_points(runs: tuple[Run, ...], profiler_overhead: float | None = None) -> pd.DataFrame:
    """Per-run medians of x, k1, k2 and dispatch per operator (vectorised over iterations).

    ``profiler_overhead``: profiled / unprofiled step time of the traced runs (> 1).  The
    profiler's cost is host time per operator, so the excess busy * (1 - 1/overhead) is
    taken out of the iteration's dispatch (intra- and inter-op in proportion, never below
    zero) before k1 and the per-operator costs are computed: they then describe the
    unprofiled run the model predicts.
    """
    rows = []
    for run in runs:
        if not run.has("buckets"):
            continue
        b = run.table("buckets")
        if b.empty:
            continue
        intra, inter = b["intra_op_s"].astype(float), b["inter_op_s"].astype(float)
        busy = b["kernel_s"] + intra + inter
        if profiler_overhead and profiler_overhead > 1.0:
            dispatch = intra + inter
            excess = busy * (1.0 - 1.0 / profiler_overhead)
            keep = ((dispatch - excess) / dispatch.where(dispatch > 0)).clip(0.0, 1.0).fillna(1.0)
            intra, inter = intra * keep, inter * keep
            busy = b["kernel_s"] + intra + inter
        per = pd.DataFrame(
            {
                "rank": b["rank"],
                "iteration": b["iteration"],
                "x_flops": np.where(
                    b["n_gemms"] > 0, b["gemm_flops"] / b["n_gemms"].where(b["n_gemms"] > 0), np.nan
                ),
                "k1": np.where(busy > 0, b["kernel_s"] / busy.where(busy > 0), np.nan),
                "intra_per_op_s": intra / b["n_ops"].where(b["n_ops"] > 0),
                "inter_per_op_s": inter / b["n_ops"].where(b["n_ops"] > 0),
                "kernel_s": b["kernel_s"],
            }
        )
        if run.has("kernels"):
            k = run.table("kernels")
            tr = k[k["kernel_class"].isin(TRANSFORMER_CLASSES)].groupby(["rank", "iteration"])["time_s"].sum()
            per = per.merge(tr.rename("transformer_s").reset_index(), on=["rank", "iteration"], how="left")
            per["k2"] = per["transformer_s"].fillna(0.0) / per["kernel_s"].where(per["kernel_s"] > 0)
        else:
            per["k2"] = np.nan
        med = per[["x_flops", "k1", "k2", "intra_per_op_s", "inter_per_op_s"]].median()
        rows.append({"run": run.meta.name, "n_iterations": len(per), **med.to_dict()})
    return pd.DataFrame(
        rows, columns=["run", "n_iterations", "x_flops", "k1", "k2", "intra_per_op_s", "inter_per_op_s"]
    )


def gemm_points(runs: tuple[Run, ...], peak_tflops: float) -> pd.DataFrame:
    """Median efficiency per matmul shape over all runs: x_flops, eff, calls."""
    frames = [r.table("gemms") for r in runs if r.has("gemms")]
    if not frames:
        return pd.DataFrame(columns=["x_flops", "eff", "calls"])
    g = pd.concat(frames, ignore_index=True)
    g = g[(g["dur_s"] > 0) & (g["flops"] > 0)]
    g = g.assign(eff=g["flops"] / g["dur_s"] / (peak_tflops * 1e12))
    agg = g.groupby(["m", "n", "k", "batch", "dtype"]).agg(
        x_flops=("flops", "first"), eff=("eff", "median"), calls=("eff", "size")
    )
    return agg.reset_index(drop=True).sort_values("x_flops", kind="stable").reset_index(drop=True)


def level_efficiency(shapes: pd.DataFrame) -> pd.DataFrame:
    """Efficiency per work level: total FLOPs over total time of the shapes at that level.

    Shapes of equal FLOPs run at different speeds (layouts, transposes in backward); the
    model times all of them with one efficiency, so the right aggregate is the
    time-weighted one, sum(flops) / sum(flops / eff), with every call counted.
    """
    if shapes.empty:
        return shapes
    xs = shapes["x_flops"].to_numpy(float)
    order = np.argsort(xs, kind="stable")
    starts = np.concatenate([[True], xs[order][1:] / xs[order][:-1] > LEVEL_RATIO])
    level = np.empty(len(xs), int)
    level[order] = np.cumsum(starts) - 1
    work = shapes["x_flops"] * shapes["calls"]
    df = pd.DataFrame({"level": level, "work": work, "time": work / shapes["eff"], "logx": np.log(xs)})
    agg = df.groupby("level").agg(
        work=("work", "sum"), time=("time", "sum"), logx=("logx", "mean"), shapes=("work", "size")
    )
    return pd.DataFrame(
        {"x_flops": np.exp(agg["logx"]), "eff": agg["work"] / agg["time"], "shapes": agg["shapes"]}
    )


def _sat(x: np.ndarray, y_max: float, x_half: float, gamma: float) -> np.ndarray:
    return y_max / (1.0 + (x_half / x) ** gamma)


def fit_saturating(
    x: np.ndarray,
    y: np.ndarray,
    *,
    name: str,
    y_cap: float,
    default: Saturating,
    where: str,
    free_gamma: bool = False,
    unit: str = "",
) -> Saturating:
    """Fit y = y_max / (1 + (x_half/x)^gamma) with relative residuals; honest when degenerate."""
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    x, y = x[ok], y[ok]
    if len(x) == 0:
        return default
    levels = work_levels(x)
    if len(levels) < 2:
        y0, x0 = float(np.median(y)), float(np.median(x))
        y_max = max(default.y_max.value, y0 * 1.05)
        note = (
            f"one work level ({x0:.3g} FLOP per matmul, {len(y)} run(s), {name} = {y0:.3f}): y_max and x_half "
            "cannot be separated; curve anchored at the measured point with the default y_max. "
            "Trace >= 2 model sizes to fit it"
        )
        q = FitQuality(
            n_points=int(len(y)),
            residuals=tuple(float(v) for v in (_sat(x, y_max, x0 * (y_max / y0 - 1), 1) / y - 1)),
            note=note,
        )
        return Saturating(
            y_max=Param(y_max, unit=unit, status=UNIDENTIFIABLE, note=note),
            x_half=Param(x0 * (y_max / y0 - 1.0), unit="FLOP", status=UNIDENTIFIABLE, note=note),
            gamma=Param(1.0, status=FIXED, note="dispatch-limited form"),
            quality=q,
        )
    fit_gamma = free_gamma and len(levels) >= MIN_LEVELS_GAMMA and (x.max() / x.min()) >= 10
    p0 = [min(max(y.max() * 1.1, 1e-6), y_cap), float(np.median(x))]
    lo, hi = [1e-9, x.min() * 1e-4], [y_cap, x.max() * 1e4]
    f = _sat if fit_gamma else (lambda xx, a, b: _sat(xx, a, b, 1.0))
    if fit_gamma:
        p0, lo, hi = p0 + [1.0], lo + [0.25], hi + [4.0]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)
            popt, pcov = curve_fit(f, x, y, p0=p0, sigma=y, bounds=(lo, hi), maxfev=20000)
    except (RuntimeError, ValueError) as exc:
        raise InputError(
            where, f"{name} curve did not converge on {len(y)} points at {len(levels)} work levels ({exc})"
        ) from None
    dof = len(y) - len(popt)
    se = (
        np.sqrt(np.clip(np.diag(pcov), 0, None))
        if dof > 0 and np.all(np.isfinite(pcov))
        else [None] * len(popt)
    )
    pred = f(x, *popt)
    rel = pred / y - 1.0
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    q = FitQuality(
        n_points=int(len(y)),
        r2=1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else None,
        rmse=float(np.sqrt(np.mean((pred - y) ** 2))),
        max_abs_rel_err=float(np.max(np.abs(rel))),
        residuals=tuple(float(v) for v in rel),
        note=f"{len(levels)} work levels, x from {x.min():.3g} to {x.max():.3g} FLOP per matmul",
    )

    def par(i: int, unit_: str, label: str) -> Param:
        s = se[i]
        at_bound = np.isclose(popt[i], hi[i], rtol=1e-6) or np.isclose(popt[i], lo[i], rtol=1e-6)
        s = None if s is None or at_bound or not np.isfinite(s) else float(s)
        note = f"{label} at its bound" if at_bound else ""
        if s is not None and s > abs(popt[i]):
            note = f"{label} poorly determined by these work levels (stderr > value)"
        return Param(float(popt[i]), stderr=s, unit=unit_, status=FITTED, note=note)

    return Saturating(
        y_max=par(0, unit, "y_max"),
        x_half=par(1, "FLOP", "x_half"),
        gamma=par(2, "", "gamma") if fit_gamma else Param(1.0, status=FIXED, note="dispatch-limited form"),
        quality=q,
    )


def fit_compute(
    trace_runs: tuple[Run, ...],
    *,
    peak_tflops: float | None,
    defaults: dict,
    where: str,
    gemm_samples: pd.DataFrame | None = None,
    gemm_dtype: str | None = None,
    gemm_trace_runs: tuple[Run, ...] | None = None,
    profiler_overhead: float | None = None,
) -> ComputeFit:
    """Fit what the trace runs support; everything else stays at ``defaults`` (status default).

    GEMM efficiency (with a peak) is fitted on the work levels of the traced matmuls of
    ``gemm_trace_runs`` (default: all trace runs; the caller leaves out runs whose ranks
    shared compute slots, whose matmuls ran time-shared) together with the shapes of
    ``gemm_samples`` (``calib bench gemm``) in ``gemm_dtype``.  ``profiler_overhead``:
    see :func:`run_points`.
    """
    notes: list[str] = []
    pts = run_points(trace_runs, profiler_overhead)
    gemm, gp = _fit_gemm(
        trace_runs if gemm_trace_runs is None else gemm_trace_runs,
        peak_tflops=peak_tflops,
        defaults=defaults,
        where=where,
        samples=gemm_samples,
        dtype=gemm_dtype,
        notes=notes,
    )
    if pts.empty:
        if trace_runs:
            notes.append("trace runs have no buckets")
        return ComputeFit(None, None, gemm, {}, pts, tuple(notes), gp)
    has_x = pts["x_flops"].notna()
    if not has_x.any():
        notes.append(
            "traces have no matmul shapes (record_shapes off): k1/k2 cannot be placed on the work axis"
        )
    k1 = (
        fit_saturating(
            pts.loc[has_x, "x_flops"].to_numpy(float),
            pts.loc[has_x, "k1"].to_numpy(float),
            name="k1",
            y_cap=1.0,
            default=defaults["k1"],
            where=where,
        )
        if has_x.any()
        else None
    )
    k2 = (
        fit_saturating(
            pts.loc[has_x, "x_flops"].to_numpy(float),
            pts.loc[has_x, "k2"].to_numpy(float),
            name="k2",
            y_cap=1.0,
            default=defaults["k2"],
            where=where,
        )
        if has_x.any()
        else None
    )
    dispatch = {}
    for key, col in (("intra_op_s_per_op", "intra_per_op_s"), ("inter_op_s_per_op", "inter_per_op_s")):
        v = pts[col].dropna().to_numpy(float)
        if len(v):
            se = float(np.std(v, ddof=1) / np.sqrt(len(v))) if len(v) > 1 else None
            dispatch[key] = Param(
                float(np.median(v)),
                stderr=se,
                unit="s",
                status=FITTED,
                note=f"median over {len(v)} run(s) of per-iteration {col.split('_')[0]}-op time / "
                "outermost operators",
            )
    return ComputeFit(k1, k2, gemm, dispatch, pts, tuple(notes), gp)


def _fit_gemm(
    runs: tuple[Run, ...],
    *,
    peak_tflops: float | None,
    defaults: dict,
    where: str,
    samples: pd.DataFrame | None,
    dtype: str | None,
    notes: list[str],
) -> tuple[Saturating | None, pd.DataFrame | None]:
    if not peak_tflops:
        if runs:
            notes.append(
                "GEMM efficiency needs the device's dense peak: give peak_tflops or GEMM benchmark samples"
            )
        return None, None
    parts = []
    traced = level_efficiency(gemm_points(runs, peak_tflops))
    if len(traced):
        parts.append(traced.assign(source="trace"))
    if samples is not None and len(samples) and dtype:
        bench = bench_efficiency(samples, peak_tflops, dtype)
        if len(traced) and len(bench):
            # the traced matmuls are what training runs (their shapes, caches and
            # neighbours, the time k1 and k2 are shares of); the benchmark's isolated
            # calls only extend the curve beyond the traced work levels
            lo, hi = traced["x_flops"].min() / LEVEL_RATIO, traced["x_flops"].max() * LEVEL_RATIO
            outside = (bench["x_flops"] < lo) | (bench["x_flops"] > hi)
            if (~outside).any():
                inside = bench[~outside]
                ratio = np.exp(
                    np.mean(np.log(inside["eff"].to_numpy(float)))
                    - np.mean(
                        np.log(np.interp(np.log(inside["x_flops"]), np.log(traced["x_flops"]), traced["eff"]))
                    )
                )
                notes.append(
                    f"GEMM benchmark within the traced work levels ({int((~outside).sum())} shapes): "
                    f"{ratio:.2f}x the traced matmuls' efficiency (geometric mean); the curve uses the traced "
                    "matmuls there and the benchmark only beyond them"
                )
            bench = bench[outside]
        if len(bench):
            parts.append(bench.assign(source="bench"))
    if not parts:
        if runs:
            notes.append("no matmul shapes in the traces: GEMM efficiency needs record_shapes")
        return None, None
    gp = pd.concat(parts, ignore_index=True).sort_values("x_flops", kind="stable").reset_index(drop=True)
    curve = fit_saturating(
        gp["x_flops"].to_numpy(float),
        gp["eff"].to_numpy(float),
        name="GEMM efficiency",
        y_cap=1.0,
        default=defaults["gemm"],
        where=where,
        free_gamma=True,
    )
    src = " + ".join(
        f"{(gp['source'] == k).sum()} {k} point(s)" for k in ("trace", "bench") if (gp["source"] == k).any()
    )
    if curve.quality is not None:
        curve = replace(curve, quality=replace(curve.quality, note=f"{curve.quality.note}; {src}"))
    return curve, gp


def default_note(param: Param, text: str) -> Param:
    return Param(param.value, stderr=None, unit=param.unit, status=DEFAULT, note=text)


# Re-exported: the measured peak and the compute slots live in their own modules.
from calib.calibrate.peak import (  # noqa: E402, F401
    TRACE_DTYPES,
    MeasuredPeak,
    bench_efficiency,
    bench_gemm_samples,
    measured_peak,
    traced_gemm_dtype,
)
from calib.calibrate.slots import fit_compute_slots, node_points  # noqa: E402, F401
