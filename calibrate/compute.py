"""Compute factors from trace runs: k1, k2, GEMM efficiency and dispatch cost per operator.

x, the work per operator, is the mean FLOPs of one matmul operator in an iteration
(``gemm_flops / n_gemms`` of the ``buckets`` table, traces recorded with shapes).  Per
run (median over its ranks and iterations, so repeated iterations are not counted as
independent evidence):

* k1 = kernel / (kernel + intra-op + inter-op): seed 004's kernel share of compute.
  "Other" idle (waiting on synchronisation or data) is neither kernel nor dispatch and
  is left out, as in the paper's split.
* k2 = (GEMM + attention kernel time) / kernel time (``kernels`` table, classes of
  ``ingest.schema.TRANSFORMER_CLASSES``).
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
from scipy.optimize import OptimizeWarning, curve_fit

from calibrate.calibration import DEFAULT, FITTED, FIXED, UNIDENTIFIABLE, FitQuality, Param, Saturating
from ingest.errors import InputError
from ingest.rundir import Run
from ingest.schema import TRANSFORMER_CLASSES

MIN_LEVELS_GAMMA = 8
LEVEL_RATIO = 1.5  # x values closer than this are one work level


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


def work_levels(x: np.ndarray) -> np.ndarray:
    """Distinct work levels: sorted x values more than :data:`LEVEL_RATIO` apart.

    Runs of one model under different frameworks differ by a few percent in mean FLOPs
    per matmul; that is one level, not a curve.
    """
    xs = np.sort(np.asarray(x, dtype=float))
    if not len(xs):
        return xs
    starts = np.concatenate([[True], xs[1:] / xs[:-1] > LEVEL_RATIO])
    # a level is the geometric mean of its members
    ids = np.cumsum(starts) - 1
    return np.exp(np.bincount(ids, np.log(xs)) / np.bincount(ids))


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
                "GEMM efficiency needs the device's dense peak: pass --peak-tflops or run calib bench gemm"
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


# ---- GEMM microbenchmark samples (``calib bench gemm``) ---------------------------------
#: trace dtype names (Kineto ``Input type``) -> torch dtype names of ``gemm_samples``
TRACE_DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "half": "float16",
    "bfloat16": "bfloat16",
}


@dataclass(frozen=True)
class MeasuredPeak:
    """The best sustained matmul throughput of a system's GEMM benchmark.

    Not a datasheet peak: the highest TFLOP/s any benchmarked shape sustained (each
    sample is the median of repeated back-to-back calls), in the dtype the traces train
    in when the benchmark ran it.  GEMM efficiencies are then fractions of this number.
    """

    tflops: float
    dtype: str
    shape: str
    device: str
    samples: int
    note: str


def bench_gemm_samples(runs: tuple[Run, ...]) -> pd.DataFrame:
    """Every ``gemm_samples`` row of ``runs`` (bench runs of ``calib bench gemm``), with its run."""
    frames = [r.table("gemm_samples").assign(run=r.meta.name) for r in runs if r.has("gemm_samples")]
    if not frames:
        return pd.DataFrame(
            columns=["run", "device", "dtype", "m", "n", "k", "batch", "flops", "time_s", "tflops"]
        )
    g = pd.concat(frames, ignore_index=True)
    return g[(g["time_s"] > 0) & (g["flops"] > 0) & np.isfinite(g["tflops"])].reset_index(drop=True)


def traced_gemm_dtype(trace_runs: tuple[Run, ...]) -> str | None:
    """The dtype (torch name) carrying most matmul FLOPs in the traces' ``gemms`` tables."""
    frames = [r.table("gemms")[["dtype", "flops"]] for r in trace_runs if r.has("gemms")]
    if not frames:
        return None
    g = pd.concat(frames, ignore_index=True)
    if g.empty:
        return None
    top = str(g.groupby("dtype")["flops"].sum().idxmax())
    return TRACE_DTYPES.get(top, top)


def measured_peak(samples: pd.DataFrame, dtype: str | None) -> MeasuredPeak | None:
    """The best sustained TFLOP/s of ``samples`` in ``dtype`` (else the fastest dtype benchmarked)."""
    if samples.empty:
        return None
    dtypes = sorted(samples["dtype"].astype(str).unique())
    note = ""
    if dtype in dtypes:
        use = dtype
    else:
        use = str(samples.groupby("dtype")["tflops"].max().idxmax())
        note = (
            f"the traces train in {dtype}, which the GEMM benchmark did not run; "
            if dtype
            else "no traced matmul dtype to match; "
        ) + f"peak taken from {use} (benchmarked: {', '.join(dtypes)})"
    s = samples[samples["dtype"].astype(str) == use]
    best = s.loc[s["tflops"].idxmax()]
    shape = f"{int(best['m'])}x{int(best['n'])}x{int(best['k'])}" + (
        f" x{int(best['batch'])}" if int(best["batch"]) > 1 else ""
    )
    return MeasuredPeak(
        tflops=float(best["tflops"]),
        dtype=use,
        shape=shape,
        device=str(best["device"]),
        samples=int(len(s)),
        note=note,
    )


def bench_efficiency(samples: pd.DataFrame, peak_tflops: float, dtype: str) -> pd.DataFrame:
    """GEMM efficiency points of the benchmark: x_flops (per call), eff = TFLOP/s / peak, shapes.

    Repeated runs of one shape are one point (median TFLOP/s), like a work level of the traces.
    """
    s = samples[samples["dtype"].astype(str) == dtype]
    if s.empty:
        return pd.DataFrame(columns=["x_flops", "eff", "shapes"])
    agg = s.groupby(["m", "n", "k", "batch"]).agg(x_flops=("flops", "first"), tflops=("tflops", "median"))
    out = pd.DataFrame({"x_flops": agg["x_flops"], "eff": agg["tflops"] / peak_tflops, "shapes": 1})
    return out.sort_values("x_flops", kind="stable").reset_index(drop=True)


# ---- ranks sharing a node's compute ------------------------------------------------------
def node_points(trace_runs: tuple[Run, ...]) -> pd.DataFrame:
    """Per trace run: ranks on its node, framework, work level and compute seconds per GFLOP per rank.

    Compute = the iteration's wall time less its exposed communication (``buckets``),
    median over ranks and iterations; work = the matmul FLOPs of the rank's iteration.
    Ingest records no host names, so a run's ranks are taken to share one node (true of
    every locally launched CPU run); for GPU runs, where ranks never share a device, the
    fit below then simply finds no slowdown.
    """
    rows = []
    for run in trace_runs:
        if not run.has("buckets"):
            continue
        b = run.table("buckets")
        b = b[(b["gemm_flops"] > 0) & (b["wall_s"] > 0)]
        if b.empty:
            continue
        compute = (b["wall_s"] - b["comm_exposed_s"]).clip(lower=0)
        rows.append(
            {
                "run": run.meta.name,
                "framework": run.meta.framework.name,
                "ranks_per_node": int(run.meta.world_size or b["rank"].nunique()),
                "x_flops": float(np.median(b["gemm_flops"] / b["n_gemms"].where(b["n_gemms"] > 0))),
                "compute_s_per_gflop": float(np.median(compute / (b["gemm_flops"] / 1e9))),
                "iterations": int(len(b)),
            }
        )
    return pd.DataFrame(
        rows,
        columns=["run", "framework", "ranks_per_node", "x_flops", "compute_s_per_gflop", "iterations"],
    )


def _share(r: np.ndarray, slots: float) -> np.ndarray:
    """Time-sharing factor of r ranks on ``slots`` compute slots: max(1, r / slots)."""
    return np.maximum(1.0, r / slots)


def fit_compute_slots(
    points: pd.DataFrame, devices_per_node: int, *, where: str
) -> tuple[Param, pd.DataFrame]:
    """Effective compute slots per node S from the per-rank slowdown with ranks per node.

    r ranks on a node with S slots (devices, or cores / threads per rank) each get
    min(1, S / r) of one: per-rank compute time grows by max(1, r / S).  Runs of one
    model and framework (same work level) at different r are compared with the one at
    the fewest ranks: c_r / c_r0 = max(1, r/S) / max(1, r0/S).  Each comparison implies
    an S in [1, devices_per_node]; S is their median (robust to a run caught by a burst
    of load from other jobs).  With no slowdown S sits at the stated devices per node (a
    bound, not a fit); with one ranks-per-node level it is that default.  Returns S and
    the comparisons (run, r, r0, slowdown, implied_slots).
    """
    cols = ["run", "framework", "ranks_per_node", "base_ranks", "slowdown"]  # + implied_slots
    dev = float(max(devices_per_node, 1))
    default = Param(
        dev,
        unit="slots",
        status=DEFAULT,
        note=f"= devices per node ({devices_per_node}): no trace runs of one model at two ranks-per-node counts",
    )
    pts = points.dropna(subset=["x_flops", "compute_s_per_gflop"])
    if pts.empty:
        return default, pd.DataFrame(columns=cols)
    level = np.zeros(len(pts), int)
    xs = pts["x_flops"].to_numpy(float)
    order = np.argsort(xs, kind="stable")
    starts = np.concatenate([[True], xs[order][1:] / xs[order][:-1] > LEVEL_RATIO])
    level[order] = np.cumsum(starts) - 1
    pts = pts.assign(level=level)
    base = pts.loc[pts.groupby(["framework", "level"])["ranks_per_node"].idxmin()]
    merged = pts.merge(
        base[["framework", "level", "ranks_per_node", "compute_s_per_gflop"]].rename(
            columns={"ranks_per_node": "base_ranks", "compute_s_per_gflop": "base_s_per_gflop"}
        ),
        on=["framework", "level"],
    )
    cmp = merged[merged["ranks_per_node"] > merged["base_ranks"]]
    cmp = cmp.assign(slowdown=cmp["compute_s_per_gflop"] / cmp["base_s_per_gflop"])
    if cmp.empty:
        return default, pd.DataFrame(columns=cols)
    r = cmp["ranks_per_node"].to_numpy(float)
    r0 = cmp["base_ranks"].to_numpy(float)
    y = np.log(cmp["slowdown"].to_numpy(float))
    grid = np.exp(np.linspace(0.0, np.log(dev), 2001)) if dev > 1 else np.array([1.0])
    model = np.log(_share(r[None, :], grid[:, None]) / _share(r0[None, :], grid[:, None]))
    # each comparison's own S (the grid point its slowdown implies; ties -> the largest S),
    # then their median: one run caught by a burst of load on a shared host moves a
    # least-squares fit, not the median
    miss = np.abs(model - y[None, :])
    own = grid[len(grid) - 1 - np.argmin(miss[::-1], axis=0)]
    s = float(np.median(own))
    rmax = int(r.max())
    table = cmp[cols].reset_index(drop=True).assign(implied_slots=own)
    slow = ", ".join(f"{a:.2f}x at {int(b)} vs {int(c)} ranks" for a, b, c in zip(cmp["slowdown"], r, r0))
    if np.isclose(s, dev):
        note = (
            f"no slowdown beyond time-sharing of {devices_per_node} device(s) per node seen up to {rmax} ranks "
            f"per node ({slow}); S = devices per node (a bound)"
        )
        return Param(dev, unit="slots", status=UNIDENTIFIABLE, note=note), table
    n = len(own)
    # the median's standard error: sqrt(pi / 2) * sigma / sqrt(n), sigma from the spread of the runs
    stderr = float(np.sqrt(np.pi / 2) * np.std(own, ddof=1) / np.sqrt(n)) if n > 1 else None
    status = FITTED
    note = (
        f"median over {n} comparison(s) of the slots each slowdown implies; per-rank compute slowdown {slow}"
    )
    if np.isclose(s, 1.0):
        status = UNIDENTIFIABLE
        note += "; at least as slow as one slot shared by all ranks (S = 1 is a bound)"
    return Param(s, stderr=stderr, unit="slots", status=status, note=note), table
