"""How well the device model predicts the traced runs: in-sample, leave-one-run-out and
each held-out prediction's 90 % interval (the table ``calib fit`` stores and
``calib validate --runs`` prints)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from calib.calibrate.device_facts import RunFacts
from calib.calibrate.device_fit import fit_device, host_free, overhead_is_lower_bound
from calib.calibrate.device_model import DeviceModel, interval_half_width, perturbations


def _predict(dm: DeviceModel, f: RunFacts) -> tuple[float, float]:
    from calib.calibrate.device_step import single_gpu

    p = single_gpu(
        dm,
        f.d,
        f.L,
        f.a,
        f.kv,
        f.ffn,
        f.s,
        f.V,
        f.b,
        f.mlp,
        tied=f.tied,
        params=f.params,
        weights=f.weights,
        compiled=f.compiled,
    )
    return float(p["step_s"]), float(p["mem_bytes"])


def param_sigma(dm: DeviceModel, f: RunFacts) -> float:
    """Relative standard error of a run's predicted step from the fitted terms' errors."""
    base, _ = _predict(dm, f)
    return float(np.sqrt(sum((_predict(p, f)[0] / base - 1.0) ** 2 for p in perturbations(dm))))


def check_runs(
    dm: DeviceModel, runs: Sequence[RunFacts], bench: pd.DataFrame, **fit_args
) -> tuple[dict, ...]:
    """In-sample and leave-one-run-out predictions of every run's unprofiled step time
    (and peak memory when measured), with each leave-one-out prediction's 90 % interval
    (the left-out run's own error never enters it): the honesty table ``calib fit``
    stores and ``calib validate --runs`` prints."""
    rows = []
    loo_sig: dict[str, float] = {}
    hinges: dict[str, float] = {}
    for f in runs:
        step_in, mem_in = _predict(dm, f)
        rest = [g for g in runs if g.name != f.name]
        step_loo = mem_loo = None
        if rest:
            loo = fit_device(rest, bench, dm.device, dm.peak_tflops, dm.hbm_tbps, dm.peak_source, **fit_args)
            step_loo, mem_loo = _predict(loo, f)
            if not f.peak_mem_bytes:  # memory terms from reference constants: no held-out check
                mem_loo = None
            loo_sig[f.name] = param_sigma(loo, f)
            floor = _predict(host_free(loo), f)[0]
            if overhead_is_lower_bound(loo) and step_loo > floor * (1.0 + 1e-9):
                hinges[f.name] = floor  # host-bound on an overhead known only from below
        rows.append({
            "run": f.name, "family": f.family_key, "measured_step_s": f.step_s, "insample_step_s": step_in,
            "loo_step_s": step_loo, "measured_mem_gb": f.peak_mem_bytes / 1e9 if f.peak_mem_bytes else None,
            "insample_mem_gb": mem_in / 1e9, "loo_mem_gb": None if mem_loo is None else mem_loo / 1e9,
            "profiled_wall_s": f.wall_s,
            "profiler_overhead": (f.wall_s / f.step_s - 1.0) if f.step_s else None,
        })  # fmt: skip
    for r in rows:
        if r["run"] in hinges:
            r["loo_floor_s"] = hinges[r["run"]]
    errs = {r["run"]: r["loo_step_s"] / r["measured_step_s"] - 1.0 for r in rows
            if r["loo_step_s"] and r["measured_step_s"]}  # fmt: skip
    kind = {r["run"]: _is_compiled(r) for r in rows}
    for r in rows:
        if r["run"] in errs:
            # model-error samples: the other runs whose prediction did not rest on the
            # unidentified overhead (that term's range enters as the floor instead)
            others = [e for k, e in errs.items() if k != r["run"] and k not in hinges]
            same = [
                e for k, e in errs.items() if k != r["run"] and k not in hinges and kind[k] == kind[r["run"]]
            ]
            others = same if len(same) >= MIN_KIND_RUNS else others
            half = float(interval_half_width(loo_sig.get(r["run"], 0.0), others))
            lo, hi = band(r["loo_step_s"], half, r.get("loo_floor_s"))
            r.update(loo_interval_rel=half, loo_lo_s=lo, loo_hi_s=hi,
                     loo_inside=bool(lo <= r["measured_step_s"] <= hi))  # fmt: skip
    return tuple(rows)


#: fewest leave-one-out errors of one implementation (eager, torch.compile) an interval
#: is built from alone; fewer pool every run's (stated)
MIN_KIND_RUNS = 3


def band(step_s, half, floor_s=None):
    """The interval [step (1 - h), step (1 + h)], its lower end extended down to the
    device-bound floor when the step is host-bound on a lower-bound overhead, and never
    below 0 (h >= 1: few runs or unidentified terms leave the step unbounded below)."""
    step_s = np.asarray(step_s, dtype=float)
    lo = step_s * (1.0 - half)
    if floor_s is not None:
        lo = np.minimum(lo, np.asarray(floor_s, dtype=float) * (1.0 - half))
    lo = np.maximum(lo, 0.0)
    return (float(lo), float(step_s * (1.0 + half))) if lo.ndim == 0 else (lo, step_s * (1.0 + half))


def _is_compiled(row) -> bool:
    return str(row.get("family", "")).endswith("/compiled")


def loo_rel_errors(dm: DeviceModel, compiled: bool | None = None) -> np.ndarray:
    """Relative leave-one-run-out errors of the step time (the interval's empirical part):
    of the runs of one implementation (eager or torch.compile, ``compiled``) where at
    least MIN_KIND_RUNS have them, else of every run."""
    rows = [
        r
        for r in dm.runs
        if r.get("loo_step_s") and r.get("measured_step_s") and r.get("loo_floor_s") is None
    ]
    if compiled is not None:
        own = [r for r in rows if _is_compiled(r) == compiled]
        rows = own if len(own) >= MIN_KIND_RUNS else rows
    return np.asarray([r["loo_step_s"] / r["measured_step_s"] - 1.0 for r in rows], dtype=float)


#: the variant tags whose runs the per-run table leaves to the analytic device path
VARIANT_KINDS = ("fp8", "moe", "mla")


def variant_rows(dm: DeviceModel, traced: Sequence[RunFacts]) -> tuple[dict, ...]:
    """The FP8, MoE and MLA runs (``RunFacts.variant``) that the dense per-run table leaves out:
    their measured step and peak memory, their shape, and their variant terms refitted
    without them -- the FP8 GEMM speed-up and cast bytes from the other FP8 runs, the MoE
    routing terms from the other MoE runs (none: the hand count), the MLA terms from the other
    dense MLA runs (none: the dense family's counts).  Their predictions need
    the analytic device path (FP8 casts, routed experts, MLA's projections), so the validation that shows the
    table makes them; the dense terms do not depend on these runs (``dense_runs``), unless
    every traced run is a variant one (the fit's notes then say so)."""
    from dataclasses import asdict, replace

    from calib.calibrate.device_fp8 import fit_fp8_casts, fit_fp8_gemm
    from calib.calibrate.device_mla import fit_mla
    from calib.calibrate.device_moe import fit_moe

    def js(term):
        return None if term is None else asdict(term)

    rows = []
    for f in traced:
        kinds = set(f.variant.split("+")) & set(VARIANT_KINDS)
        if not kinds:
            continue
        rest = [g for g in traced if g.name != f.name]
        held: dict = {}
        if "fp8" in kinds:
            speedup = fit_fp8_gemm(rest, dm.gemm)
            held["fp8_gemm_speedup"] = js(speedup)
            held["fp8_cast_bytes_per_elem"] = js(fit_fp8_casts(rest, replace(dm, fp8_gemm_speedup=speedup)))
        mla = fit_mla(rest, dm) if "mla" in kinds else dm.mla
        if "mla" in kinds:
            held["mla"] = js(mla)
        if "moe" in kinds:  # measured net of the MLA terms in hand (device_moe.excess)
            held["moe"] = js(fit_moe(rest, replace(dm, mla=mla)))
        rows.append({
            "run": f.name, "variant": f.variant, "measured_step_s": f.step_s,
            "measured_mem_gb": f.peak_mem_bytes / 1e9 if f.peak_mem_bytes else None,
            "shape": {"d": f.d, "L": f.L, "a": f.a, "kv": f.kv, "ffn": f.ffn, "s": f.s, "V": f.V, "b": f.b,
                      "mlp": f.mlp, "tied": f.tied, "experts": f.experts, "top_k": f.top_k,
                      "expert_ffn": f.expert_ffn, "shared_ffn": f.shared_ffn, "dense_layers": f.dense_layers,
                      **({"mla": dict(f.mla_shape)} if f.mla_shape else {})},
            "held_out_terms": held,
        })  # fmt: skip
    return tuple(rows)


def summary(dm: DeviceModel) -> str:
    """One line: how well the device model predicts the traced runs' unprofiled steps."""
    ins = [abs(r["insample_step_s"] / r["measured_step_s"] - 1) for r in dm.runs if r.get("measured_step_s")]
    loo = np.abs(loo_rel_errors(dm))
    if not ins:
        return f"device model of {dm.device} fitted from {len(dm.runs)} run(s); no unprofiled step times to check it"
    text = (f"device model: unprofiled step time of {len(ins)} traced run(s) in-sample median {np.median(ins):.1%} "
            f"max {max(ins):.1%}")  # fmt: skip
    if len(loo):
        text += f"; leave-one-run-out median {np.median(loo):.1%} max {np.max(loo):.1%}"
        hinged = [r["run"] for r in dm.runs if r.get("loo_floor_s") is not None]
        if hinged:  # their held-out step rests on an overhead known only from below
            text += f" (without {', '.join(hinged)}: host-bound on a lower-bound overhead)"
        inside = [r["loo_inside"] for r in dm.runs if "loo_inside" in r]
        halves = [r["loo_interval_rel"] for r in dm.runs if "loo_interval_rel" in r]
        if inside:
            text += (f", {sum(inside)}/{len(inside)} inside their 90 % interval "
                     f"(median half-width {np.median(halves):.1%})")  # fmt: skip
    if dm.variant_runs:  # predicted by the analytic device path where the table is shown
        text += f"; {len(dm.variant_runs)} FP8/MoE/MLA run(s) listed beside them, in-sample and held out"
    return text + " (per-run table: validation against the system's runs)"
