"""Fit the device model (:mod:`calibrate.device_model`) from GPU traces and GEMM benchmarks.

Each term is fitted from the data that isolates it, with scipy, and carries a standard
error from its fit's covariance (or the spread across runs):

* GEMM roofline: every traced matmul shape (median kernel time) and every ``calib bench
  gemm`` sample of at least 50 us (shorter bench timings hold the launch latency the
  kernel durations of a trace do not);
* attention (:mod:`device_attention`), streamed bytes, optimizer: kernel time of their
  classes per run;
* host and gaps: the unprofiled step times measured beside the traces.

Memory-bound bytes per token-layer, kernels and host operators per layer are measured
per implementation family (:class:`Family`).  Activation memory per token-layer is
fitted when the runs record their peak memory, else the stated reference default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd
from calib.calibrate.device_attention import ATTN_HEAD_TILE, fit_attention
from calib.calibrate.device_compile import compiled_runs, fit_compiled_families
from calib.calibrate.device_facts import RunFacts
from calib.calibrate.device_fp8 import fit_fp8_casts, fit_fp8_gemm
from calib.calibrate.device_mla import fit_mla
from calib.calibrate.device_model import (
    ADAM_BYTES_PER_PARAM,
    DeviceModel,
    Family,
    GemmModel,
    act_count,
)
from calib.calibrate.device_moe import fit_moe
from calib.calibrate.params import (
    DEFAULT,
    FITTED,
    FIXED,
    UNIDENTIFIABLE,
    FitQuality,
    Param,
    lstsq_stderr,
    stderr_or_none,
)
from scipy.optimize import least_squares, nnls

BENCH_MIN_S = 50e-6
#: Reference activation memory: the measured peak over the hand-counted activation bytes
#: (device_model.ACT_COUNT) per implementation family, and logit bytes per token and
#: vocabulary entry, derived by fixtures/traces/h100/memory_reference.py from the peak
#: memory measured on the H100 reference runs (fixtures/traces/h100/measured_steps.json).
#: Used with status "default" when the traced runs of a system did not record their own
#: peak memory; a family never measured takes its hand count as it is (scale 1).
REFERENCE_ACT_SCALE = {"gelu/fp32-autocast": 1.427, "swiglu/bf16": 0.994}
REFERENCE_LOGIT_BYTES = 12.1
REFERENCE_SOURCE = "reference H100 runs (fixtures/traces/h100/measured_steps.json)"


def _quality(pred: np.ndarray, meas: np.ndarray, note: str = "") -> FitQuality:
    rel = pred / meas - 1.0
    ss = float(np.sum((meas - meas.mean()) ** 2))
    r2 = 1.0 - float(np.sum((pred - meas) ** 2)) / ss if ss > 0 else None
    return FitQuality(n_points=len(meas), r2=r2, rmse=float(np.sqrt(np.mean((pred - meas) ** 2))),
                      max_abs_rel_err=float(np.max(np.abs(rel))) if len(rel) else None,
                      residuals=tuple(float(x) for x in rel[:200]), note=note)  # fmt: skip


# ---- GEMMs --------------------------------------------------------------------------
def gemm_points(runs: Sequence[RunFacts], bench: pd.DataFrame) -> pd.DataFrame:
    rows = [
        f.gemms[~f.gemms["fp8"].astype(bool)].assign(source=f.name)
        for f in runs
        if "gemm" not in f.flagged and len(f.gemms)
    ]
    if len(bench):
        b = bench[bench["time_s"] >= BENCH_MIN_S]
        rows.append(
            b.rename(columns={"time_s": "dur_s"})[["m", "n", "k", "batch", "dur_s"]].assign(
                count=1.0, source="bench"
            )
        )
    if not rows:
        return pd.DataFrame(columns=["m", "n", "k", "batch", "dur_s", "count", "source"])
    return pd.concat(rows, ignore_index=True)


def fit_gemm(points: pd.DataFrame, hbm_tbps: float = 0.0) -> GemmModel:
    """The GEMM roofline from traced and benchmarked shapes; operands never stream faster
    than the datasheet HBM bandwidth (``hbm_tbps``, when known)."""
    m, n, k, b, t = (points[c].to_numpy(float) for c in ("m", "n", "k", "batch", "dur_s"))
    un = [(x % 8 != 0) for x in (m, n, k)]
    have = [bool(u.any()) for u in un]

    def model(p):
        g = _gemm(p)
        return g.time_s(m, n, k, b)

    def _gemm(p):
        return GemmModel(*(Param(v) for v in (p[0], p[1], p[2], p[3], p[4], p[5])))

    x0 = [800.0, 2.5, 5e-6, 0.2, 0.2, 0.2]
    lo = [1.0, 0.05, 0.0, 0.01, 0.01, 0.01]
    hi = [1e5, hbm_tbps if hbm_tbps > 0 else 1e3, 1e-3, 1.0, 1.0, 1.0]
    x0[1] = min(x0[1], 0.9 * hi[1])
    # weight each shape by the time it takes per step (count x duration): the step's total
    # is what the model must get right; bench samples count once
    c = points["count"].to_numpy(float)
    w = np.sqrt(c * t / np.mean(c * t))
    r = least_squares(lambda p: w * np.log(model(p) / t), x0, bounds=(lo, hi))
    se = lstsq_stderr(r.jac, r.fun)
    names = ("rate_tflops", "operand_tbps", "fixed_s", "unaligned_m", "unaligned_n", "unaligned_k")
    units = ("TFLOP/s", "TB/s", "s", "", "", "")
    params = {}
    for i, (nm, u) in enumerate(zip(names, units, strict=True)):
        if i >= 3 and not have[i - 3]:
            params[nm] = Param(0.2, unit=u, status=DEFAULT,
                               note="no traced or benchmarked matmul with this dimension unaligned; default 0.2")  # fmt: skip
        elif i == 1 and r.x[1] >= 0.99 * hi[1]:
            params[nm] = Param(float(hi[1]), unit=u, status=DEFAULT,
                               note="no operand-bound matmul measured: at the datasheet HBM bandwidth")  # fmt: skip
        else:
            params[nm] = Param(float(r.x[i]), stderr_or_none(se[i]), unit=u, status=FITTED)
    pred = model(r.x)
    q = _quality(pred, t, note=f"log-residual fit over {len(t)} matmul shapes")
    return GemmModel(**params, quality=q)


# ---- streamed bytes, optimizer --------------------------------------------------------
STREAM_KINDS = {"act": ("d", "ffn"), "weight": ("param", "embed"), "vocab": ("vocab",)}


def fit_stream(runs: Sequence[RunFacts]) -> dict[str, Param]:
    """Achieved bandwidth (input bytes) of memory-bound kernels per kind -- element-wise
    work on activations, casts and adds on weights, reductions over logits -- and one
    fixed seconds per kernel, by non-negative least squares on absolute seconds (the
    groups that take the time decide)."""
    kinds = list(STREAM_KINDS)
    rows = []
    for f in runs:
        for j, kind in enumerate(kinds):
            for g in STREAM_KINDS[kind]:
                r = f.groups.loc[g]
                if r["seconds"] > 0 and r["bytes"] > 0:
                    x = np.zeros(len(kinds) + 1)
                    x[j], x[-1] = r["bytes"] / 1e12, r["kernels"]
                    rows.append((*x, r["seconds"]))
    X = np.array(rows, dtype=float)
    if len(X) < len(kinds) + 2:
        note = "too few sized memory-bound kernels"
        return {"act": Param(2.0, unit="TB/s", status=DEFAULT, note=note),
                "t0": Param(3e-6, unit="s", status=DEFAULT, note=note)}  # fmt: skip
    A, y = X[:, :-1], X[:, -1]
    c, _ = nnls(A, y)
    se = lstsq_stderr(A, A @ c - y)
    out = {}
    for j, kind in enumerate(kinds):
        if c[j] > 0 and np.count_nonzero(A[:, j]):
            bw = 1.0 / c[j]
            out[kind] = Param(float(bw), stderr_or_none(se[j] * bw * bw), "TB/s")
    out.setdefault("act", Param(2.0, unit="TB/s", status=DEFAULT, note="no activation kernels with sizes"))
    out["t0"] = Param(float(c[-1]), stderr_or_none(se[-1]), "s")
    return out


def fit_optimizer(runs: Sequence[RunFacts]) -> tuple[Param, Param | None]:
    """The fused optimizer step: a fixed cost per step plus the Adam state bytes at an
    achieved bandwidth (least squares over runs of several sizes); the mean bandwidth
    alone from fewer than three runs."""
    pts = [(f.params * ADAM_BYTES_PER_PARAM[f.weights], f.class_s["optimizer"])
           for f in runs if f.class_s.get("optimizer", 0) > 0]  # fmt: skip
    if not pts:
        return Param(2.0, unit="TB/s", status=DEFAULT, note="no fused optimizer kernels traced"), None
    b, t = np.array(pts).T
    if len(pts) >= 3:
        A = np.column_stack([np.ones_like(b), b / 1e12])
        c, _ = nnls(A, t)
        if c[1] > 0:
            se = lstsq_stderr(A, A @ c - t)
            bw = 1.0 / c[1]
            return Param(float(bw), stderr_or_none(se[1] * bw * bw), "TB/s"), Param(
                float(c[0]), stderr_or_none(se[0]), "s"
            )
    bws = b / t / 1e12
    se = float(np.std(bws, ddof=1) / np.sqrt(len(bws))) if len(bws) > 1 else None
    return Param(float(np.mean(bws)), se, "TB/s"), None


# ---- families -------------------------------------------------------------------------
def _linear_in_layers(
    Ls: np.ndarray, ys: np.ndarray, shared_intercept: float | None, unit: str
) -> tuple[Param, Param]:
    """y = per_layer * L + per_step, from runs of one family."""
    if len(np.unique(Ls)) >= 2:
        A = np.column_stack([Ls, np.ones_like(Ls)])
        c, *_ = np.linalg.lstsq(A, ys, rcond=None)
        se = lstsq_stderr(A, A @ c - ys)
        return Param(float(c[0]), stderr_or_none(se[0]), unit), Param(
            float(c[1]), stderr_or_none(se[1]), unit
        )
    step = shared_intercept if shared_intercept is not None else 0.0
    note = "one layer count traced: per-step part taken from the other families"
    return (
        Param(float(np.mean((ys - step) / Ls)), None, unit, UNIDENTIFIABLE, note),
        Param(step, None, unit, UNIDENTIFIABLE, note),
    )


def _mean_param(xs: list[float], unit: str) -> Param:
    xs = [x for x in xs if np.isfinite(x)]
    if not xs:
        return Param(0.0, unit=unit, status=DEFAULT, note="not measured")
    se = float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else None
    return Param(float(np.mean(xs)), se, unit, FITTED if len(xs) > 1 else UNIDENTIFIABLE,
                 "" if len(xs) > 1 else "one run: no spread")  # fmt: skip


def unsized_bytes(groups: pd.DataFrame, stream_tbps: float, t0_s: float) -> float:
    """Bytes the memory-bound kernels without a width (``device_facts.groups`` "unsized")
    stand for: their time beyond the fixed cost per kernel, at the achieved bandwidth."""
    g = groups.loc["unsized"]
    return max(g["seconds"] - g["kernels"] * t0_s, 0.0) * stream_tbps * 1e12


def fit_families(
    runs: Sequence[RunFacts], stream: Param, t0: Param, act: dict[str, Param]
) -> tuple[Family, ...]:
    by: dict[str, list[RunFacts]] = {}
    for f in runs:
        by.setdefault(f.family_key, []).append(f)
    # per-step intercepts shared by families with a single layer count
    inter_k = inter_h = None
    for fs in by.values():
        Ls = np.array([f.L for f in fs], float)
        if len(np.unique(Ls)) >= 2:
            inter_k = _linear_in_layers(Ls, np.array([f.groups["kernels"].sum() for f in fs]), None, "")[
                1
            ].value
            inter_h = _linear_in_layers(Ls, np.array([f.host_ops for f in fs]), None, "")[1].value
            break
    out = []
    for key, fs in sorted(by.items()):
        bd, bf, bv, bp, be = [], [], [], [], []
        for f in fs:
            gr = f.groups
            unsized = unsized_bytes(gr, stream.value, t0.value)
            bd.append((gr.loc["d", "bytes"] + unsized) / (f.T * f.L * f.d))
            bf.append(gr.loc["ffn", "bytes"] / (f.T * f.L * f.ffn))
            bv.append(gr.loc["vocab", "bytes"] / (f.T * f.V))
            bp.append(gr.loc["param", "bytes"] / max(f.params - f.V * f.d * (1 if f.tied else 2), 1.0))
            be.append(gr.loc["embed", "bytes"] / (f.V * f.d))
        Ls = np.array([f.L for f in fs], float)
        kl, ks = _linear_in_layers(Ls, np.array([f.groups["kernels"].sum() for f in fs]), inter_k, "kernels")
        hl, hs = _linear_in_layers(Ls, np.array([f.host_ops for f in fs]), inter_h, "ops")
        out.append(Family(
            mlp=fs[0].mlp, weights=fs[0].weights, bytes_d=_mean_param(bd, "B"), bytes_ffn=_mean_param(bf, "B"),
            bytes_vocab=_mean_param(bv, "B"), bytes_param=_mean_param(bp, "B"), bytes_embed=_mean_param(be, "B"), kernels_layer=kl,
            kernels_step=ks, host_ops_layer=hl, host_ops_step=hs, act_scale=act[key], runs=tuple(f.name for f in fs),
        ))  # fmt: skip
    return tuple(out)


# ---- memory ---------------------------------------------------------------------------
def fit_memory(runs: Sequence[RunFacts], keys: Sequence[str]) -> tuple[dict[str, Param], Param]:
    """Activation bytes per token-layer-d per family and logit bytes, from measured peaks."""
    from calib.calibrate.device_model import STATIC_BYTES_PER_PARAM

    measured = [f for f in runs if f.peak_mem_bytes]
    fams = sorted({f.family_key for f in measured})
    if len(measured) >= len(fams) + 1:
        A = np.zeros((len(measured), len(fams) + 1))
        y = np.zeros(len(measured))
        for i, f in enumerate(measured):
            A[i, fams.index(f.family_key)] = (
                f.T * f.L * float(act_count(f.family_key, f.d, f.kv / f.a, f.ffn))
            )
            A[i, -1] = f.T * f.V
            y[i] = f.peak_mem_bytes - f.params * STATIC_BYTES_PER_PARAM[f.weights]
        W = A / y[:, None]
        c, _ = nnls(W, np.ones(len(y)))
        se = lstsq_stderr(W, W @ c - 1.0)
        act = {k: Param(float(c[i]), stderr_or_none(se[i]), "") for i, k in enumerate(fams)}
        logit = Param(float(c[-1]), stderr_or_none(se[-1]), "B")
    else:
        act, logit = (
            {},
            Param(REFERENCE_LOGIT_BYTES, unit="B", status=DEFAULT, note=f"from the {REFERENCE_SOURCE}"),
        )
    for k in keys:
        if k not in act:
            ref = REFERENCE_ACT_SCALE.get(k, 1.0)
            act[k] = Param(ref, unit="", status=DEFAULT,
                           note=f"no measured peak memory for {k}: from the {REFERENCE_SOURCE}")  # fmt: skip
    return act, logit


# ---- host -----------------------------------------------------------------------------
def fit_host(
    runs: Sequence[RunFacts], stated_overhead: float | None
) -> tuple[Param, Param, Param, list[str]]:
    """Host seconds per operator (unprofiled), device idle gap per step, profiler overhead.

    A step takes max(device busy + gap, host issue time unprofiled); the profiled host
    issue time is (1 + overhead) times the unprofiled one.  Runs whose unprofiled step
    is far above their device busy time identify the overhead; otherwise it is bounded
    below by the runs that were host-bound only while profiled.
    """
    notes: list[str] = []
    timed = [f for f in runs if f.step_s and np.isfinite(f.host_issue_s) and f.host_ops > 0]
    if not timed:
        notes.append("no unprofiled step times (run_config.json): host and gap terms are defaults")
        return (Param(8e-6, unit="s", status=DEFAULT, note="no unprofiled steps"), Param(0.0, unit="s", status=DEFAULT, note="no unprofiled steps"),
                Param(stated_overhead or 0.0, status=DEFAULT, note="no unprofiled steps"), notes)  # fmt: skip
    gaps = np.array([f.step_s - f.busy_s for f in timed])
    med_gap = float(np.median(gaps))
    host_bound = [f for f, g in zip(timed, gaps, strict=True) if g > 2.0 * med_gap + 1e-3]
    device_bound = [f for f, g in zip(timed, gaps, strict=True) if not (g > 2.0 * med_gap + 1e-3)]
    gap_vals = [f.step_s - f.busy_s for f in device_bound] or list(gaps)
    gap = _mean_param(gap_vals, "s")
    if host_bound:
        phis = [f.host_issue_s / f.step_s - 1.0 for f in host_bound]
        phi = _mean_param(phis, "")
        phi = replace(
            phi, note=f"from {len(host_bound)} host-bound run(s): profiled host issue / unprofiled step - 1"
        )
    elif stated_overhead is not None:
        phi = Param(stated_overhead, unit="", status=FIXED, note="stated (profiler_overhead)")
    else:
        bound = max([f.host_issue_s / f.step_s - 1.0 for f in timed] + [0.0])
        phi = Param(bound, unit="", status=UNIDENTIFIABLE, note=OVERHEAD_LOWER_BOUND)
        notes.append(f"profiler overhead not identifiable (no host-bound run): lower bound {bound:.1%} used")
    c = host_per_op(timed, phi.value, None)
    return c, gap, phi, notes


def host_per_op(runs: Sequence[RunFacts], phi: float, family: str | None) -> Param:
    """Unprofiled host seconds per operator: profiled issue time / ops / (1 + overhead).

    Only runs that were host-bound while profiled (issue time >= 90 % of the iteration)
    show the host's own pace; a device-bound host waits on the full launch queue.
    ``family``: that family's runs (autocast, for one, adds host work per operator),
    falling back to all runs.
    """
    timed = [f for f in runs if f.step_s and np.isfinite(f.host_issue_s) and f.host_ops > 0]
    pace = [f for f in timed if f.host_issue_s >= 0.9 * f.wall_s] or timed
    own = [f for f in pace if family is None or f.family_key == family]
    use = own or pace
    p = _mean_param([f.host_issue_s / f.host_ops / (1.0 + phi) for f in use], "s")
    if family is not None and not own:
        p = replace(
            p, status=UNIDENTIFIABLE, note=f"no {family} run paced by its host: pooled from other families"
        )
    return p


OVERHEAD_LOWER_BOUND = "no host-bound run: the smallest overhead consistent with the runs (a lower bound)"


def overhead_is_lower_bound(dm: DeviceModel) -> bool:
    """No host-bound run fixed the profiler overhead: host times are upper bounds."""
    return dm.profiler_overhead.note == OVERHEAD_LOWER_BOUND


def host_free(dm: DeviceModel) -> DeviceModel:
    """The model with an instant host: the device-bound floor of every step."""
    zero = Param(0.0, unit="s", status=FIXED, note="host-free floor")
    return replace(
        dm, host_s_per_op=zero, families=tuple(replace(f, host_s_per_op=zero) for f in dm.families)
    )


def dense_runs(runs: Sequence[RunFacts]) -> tuple[list[RunFacts], str | None]:
    """The runs the dense terms are fitted on, and a note naming any left out: an FP8,
    MoE or torch.compile run (RunFacts.variant) would bend the GEMM roofline and the
    memory-bound terms of the eager dense runs the device model describes."""
    dense = [f for f in runs if not f.variant]
    if dense and len(dense) < len(runs):
        left = ", ".join(f"{f.name} ({f.variant})" for f in runs if f.variant)
        return dense, f"left out of the device fit (it describes eager dense runs): {left}"
    if not dense and runs:
        kinds = ", ".join(sorted({f.variant for f in runs}))
        return list(runs), f"every traced run is {kinds}: the dense terms are fitted on them as they are"
    return list(runs), None


def fit_device(runs: Sequence[RunFacts], bench: pd.DataFrame, device: str, peak_tflops: float, hbm_tbps: float,
               peak_source: str, stated_overhead: float | None = None) -> DeviceModel:  # fmt: skip
    """Every term of the device model from ``runs`` (and benchmark samples)."""
    traced = list(runs)
    runs, note = dense_runs(runs)
    notes = [note] if note else []
    flagged = sorted({c for f in runs for c in f.flagged})
    if flagged:
        notes.append(f"left out of the fit (physics warnings at ingest): kernel classes {', '.join(flagged)}")
    gemm = fit_gemm(gemm_points(runs, bench), hbm_tbps)
    c1, c2, c3 = fit_attention(runs)
    kinds = fit_stream(runs)
    bw, t0 = kinds["act"], kinds["t0"]
    opt, opt_fixed = fit_optimizer(runs)
    act, logit = fit_memory(runs, sorted({f.family_key for f in runs}))
    host, gap, phi, host_notes = fit_host(runs, stated_overhead)
    fams = tuple(
        replace(f, host_s_per_op=host_per_op(runs, phi.value, f.key)) for f in fit_families(runs, bw, t0, act)
    )
    notes.extend(host_notes)
    dm = DeviceModel(
        device=device, peak_tflops=peak_tflops, hbm_tbps=hbm_tbps, peak_source=peak_source, gemm=gemm,
        attn_s_per_flop=c1, attn_s_per_io=c2, attn_s_per_score=c3, attn_head_tile=ATTN_HEAD_TILE, stream_tbps=bw, kernel_fixed_s=t0, optimizer_tbps=opt,
        weight_tbps=kinds.get("weight"), vocab_tbps=kinds.get("vocab"), optimizer_fixed_s=opt_fixed,
        host_s_per_op=host, step_gap_s=gap, profiler_overhead=phi, logit_bytes=logit, families=fams,
        notes=tuple(notes), fp8_gemm_speedup=fit_fp8_gemm(traced, gemm),
    )  # fmt: skip
    dm = replace(dm, fp8_cast_bytes_per_elem=fit_fp8_casts(traced, dm))
    compiled = fit_compiled_families([*runs, *compiled_runs(traced)], dm) if len(runs) < len(traced) else ()
    if compiled:
        names = ", ".join(n for fam in compiled for n in fam.runs)
        notes = [*dm.notes, f"torch.compile family fitted on {names} (against the eager model)"]
        dm = replace(dm, families=dm.families + compiled, notes=tuple(notes))
    mla = fit_mla(traced, dm)  # against the eager dense model (device_mla)
    if mla is not None:
        dm = replace(dm, mla=mla, notes=(*dm.notes, f"MLA terms measured on {', '.join(mla.runs)}"))
    moe = fit_moe(traced, dm)  # against the eager dense model and the MLA terms (device_moe)
    if moe is not None:
        dm = replace(dm, moe=moe, notes=(*dm.notes, f"MoE routing terms measured on {', '.join(moe.runs)}"))
    return dm
