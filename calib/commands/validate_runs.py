"""``calib validate --runs SYSTEM``: the device model against every traced run of a system.

The table comes from the calibration (``calib fit`` stores it): each run's unprofiled step
time predicted in-sample and by a fit to the other runs (leave-one-run-out) with that
prediction's 90 % interval, and its peak memory predicted when a measurement exists (the
run's own ``peak_mem_bytes``, or a ``--measured`` JSON file).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from calib.core.errors import InputError


def measured_file(path: str | None) -> dict[str, dict]:
    """``{"runs": {name: {"step_s_unprofiled_median", "peak_mem_gb"}}}`` (measured_steps.json)."""
    if path is None:
        return {}
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"not a JSON file of measurements: {exc}") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, dict) or not all(isinstance(v, dict) for v in runs.values()):
        raise InputError(path, 'expected {"runs": {NAME: {"peak_mem_gb": ..., ...}}}')
    return runs


def table(dm, measured: dict[str, dict]) -> pd.DataFrame:
    """One row per traced run; errors are predicted / measured - 1."""
    rows = []
    for r in dm.runs:
        m = measured.get(r["run"], {})
        step = r.get("measured_step_s") or m.get("step_s_unprofiled_median")
        mem = r.get("measured_mem_gb") or m.get("peak_mem_gb")
        rows.append({
            "run": r["run"], "family": r["family"], "measured_ms": step * 1e3 if step else np.nan,
            "insample_ms": r["insample_step_s"] * 1e3, "loo_ms": (r.get("loo_step_s") or np.nan) * 1e3,
            "loo_lo_ms": r["loo_lo_s"] * 1e3 if r.get("loo_lo_s") else np.nan,
            "loo_hi_ms": r["loo_hi_s"] * 1e3 if r.get("loo_hi_s") else np.nan,
            "measured_mem_gb": mem if mem else np.nan, "insample_mem_gb": r.get("insample_mem_gb", np.nan),
            "loo_mem_gb": r.get("loo_mem_gb") or np.nan,
        })  # fmt: skip
    df = pd.DataFrame(rows)
    df["insample_err"] = df["insample_ms"] / df["measured_ms"] - 1.0
    df["loo_err"] = df["loo_ms"] / df["measured_ms"] - 1.0
    df["loo_inside"] = (df["measured_ms"] >= df["loo_lo_ms"]) & (df["measured_ms"] <= df["loo_hi_ms"])
    df["mem_err"] = df["insample_mem_gb"] / df["measured_mem_gb"] - 1.0
    df["loo_mem_err"] = df["loo_mem_gb"] / df["measured_mem_gb"] - 1.0
    return df


def _predict_variant(system, dm, row: dict) -> tuple[float, float]:
    """One FP8 or MoE run's unprofiled step (s) and peak memory (GB) on one GPU, by the
    analytic device path with device model ``dm`` (as ``calib predict --system`` runs it)."""
    from dataclasses import replace

    from calib.analytic.predict import Plan, predict
    from calib.analytic.specs import ModelSpec

    sh, kinds = row["shape"], set(row["variant"].split("+"))
    moe = "moe" in kinds and sh["experts"] > 0
    model = ModelSpec(
        name=row["run"], d_model=sh["d"], n_layers=sh["L"], n_heads=sh["a"], seq_len=sh["s"], vocab=sh["V"],
        ffn=sh["ffn"], kv_heads=sh["kv"], mlp=sh["mlp"], tied_embeddings=bool(sh["tied"]),
        n_experts=sh["experts"] if moe else 0, top_k=sh["top_k"] if moe else 0,
        expert_ffn=(sh.get("expert_ffn") or sh["ffn"]) if moe else None, **_structure(sh, moe),
    )  # fmt: skip
    plan = Plan(micro_batch=sh["b"], global_batch=sh["b"], flash_attention=True, fp8="fp8" in kinds,
                compiled="compiled" in kinds)  # fmt: skip
    view = replace(system, cal=replace(system.cal, device_model=dm))
    t = predict(model, view, [1], plan).table.iloc[0]
    return float(t["iter_s"]), float(t["mem_total_gb"])


def variant_table(system, dm) -> pd.DataFrame:
    """The FP8, MoE and MLA runs (``dm.variant_runs``): measured, predicted with every term
    (in-sample) and with their variant terms refitted without the run (held out: for the
    only MoE run, the hand count; for the only dense MLA run, the dense family's counts);
    errors are predicted / measured - 1."""
    from dataclasses import replace

    from calib.calibrate.device_model import MlaTerms, MoeTerms
    from calib.calibrate.params import Param

    kinds = {"moe": MoeTerms, "mla": MlaTerms}
    rows = []
    for r in dm.variant_runs:
        held = r.get("held_out_terms", {})
        terms = {k: None if v is None else kinds.get(k, Param).from_json(v) for k, v in held.items()}
        step_in = mem_in = step_out = mem_out = np.nan
        why = ""
        if "moe" in r["variant"].split("+") and not r["shape"]["experts"]:
            why = "not predicted: the capture did not state the number of experts"
        else:
            try:
                step_in, mem_in = _predict_variant(system, dm, r)
                step_out, mem_out = _predict_variant(system, replace(dm, **terms), r)
            except InputError as exc:  # a shape the predictor refuses: say so on the row
                why = f"not predicted: {exc}"
        rows.append({
            "run": r["run"], "variant": r["variant"],
            "measured_ms": r["measured_step_s"] * 1e3 if r.get("measured_step_s") else np.nan,
            "insample_ms": step_in * 1e3, "heldout_ms": step_out * 1e3,
            "measured_mem_gb": r.get("measured_mem_gb") or np.nan, "insample_mem_gb": mem_in,
            "heldout_mem_gb": mem_out,
            "heldout_from": why or ", ".join(_from(k, t) for k, t in terms.items()) or "-",
        })  # fmt: skip
    df = pd.DataFrame(rows, columns=["run", "variant", "measured_ms", "insample_ms", "heldout_ms",
                                     "measured_mem_gb", "insample_mem_gb", "heldout_mem_gb", "heldout_from"])  # fmt: skip
    df["insample_err"] = df["insample_ms"] / df["measured_ms"] - 1.0
    df["heldout_err"] = df["heldout_ms"] / df["measured_ms"] - 1.0
    df["mem_err"] = df["insample_mem_gb"] / df["measured_mem_gb"] - 1.0
    df["heldout_mem_err"] = df["heldout_mem_gb"] / df["measured_mem_gb"] - 1.0
    return df


def _structure(sh: dict, moe: bool) -> dict:
    """The ModelSpec fields of a variant row's MoE layer structure (shared experts, leading
    dense layers) and multi-head latent attention, where the capture stated them."""
    out: dict = {}
    f_e, shared = sh.get("expert_ffn") or sh["ffn"], sh.get("shared_ffn") or 0
    if moe and shared and shared % f_e == 0:
        out["shared_experts"] = shared // f_e
    if moe and sh.get("dense_layers"):
        out["dense_layers"] = sh["dense_layers"]
    m = sh.get("mla")
    if m:
        out.update(q_lora_rank=m["qr"] or None, kv_lora_rank=m["kvr"] or None, qk_rope_head_dim=m["rope"] or None,
                   qk_head_dim=(m["nope"] + m["rope"]) or None, v_head_dim=m["vh"] or None)  # fmt: skip
    return out


def _from(key: str, term) -> str:
    """Where a held-out prediction's variant term came from."""
    what = {
        "fp8_gemm_speedup": "FP8 GEMM speed-up",
        "fp8_cast_bytes_per_elem": "FP8 casts",
        "moe": "MoE routing",
        "mla": "MLA",
    }
    if term is None:
        return f"{what[key]}: stated default (no other run)"
    runs = term.runs if hasattr(term, "runs") else None
    return f"{what[key]}: " + (", ".join(runs) if runs else term.note.split(";")[0])


def pct(v: float) -> str:
    """A relative error as a signed percentage, '-' where there is none."""
    return "-" if not np.isfinite(v) else f"{v * 100:+.1f}%"


def summary(df: pd.DataFrame) -> dict:
    def stats(col: str) -> dict:
        e = df[col].abs().dropna()
        return {
            "n": int(len(e)),
            "median": float(e.median()) if len(e) else None,
            "max": float(e.max()) if len(e) else None,
        }

    half = ((df["loo_hi_ms"] - df["loo_lo_ms"]) / 2 / df["loo_ms"]).dropna()
    return {
        "step_insample": stats("insample_err"), "step_loo": stats("loo_err"),
        "loo_inside": int(df["loo_inside"].sum()), "loo_runs": int(df["loo_err"].notna().sum()),
        "loo_interval_half_width_median": float(half.median()) if len(half) else None,
        "memory_insample": stats("mem_err"), "memory_loo": stats("loo_mem_err"),
    }  # fmt: skip


def text(system: str, df: pd.DataFrame, s: dict, notes: list[str]) -> str:
    view = pd.DataFrame({
        "run": df["run"], "measured ms": df["measured_ms"].round(1), "in-sample ms": df["insample_ms"].round(1),
        "err": df["insample_err"].map(pct), "LOO ms": df["loo_ms"].round(1), "LOO err": df["loo_err"].map(pct),
        "LOO 90% interval ms": df["loo_lo_ms"].round(1).astype(str) + ".." + df["loo_hi_ms"].round(1).astype(str),
        "inside": np.where(df["loo_inside"], "yes", "no"), "mem GB": df["measured_mem_gb"].round(1),
        "pred GB": df["insample_mem_gb"].round(1), "mem err": df["mem_err"].map(pct),
    })  # fmt: skip

    def f(d):
        return "-" if d["median"] is None else f"median {d['median']:.1%}, max {d['max']:.1%} ({d['n']} runs)"  # noqa: E731

    out = [
        f"device model of {system}: each traced run's unprofiled step time and peak memory",
        "",
        view.to_string(index=False),
        "",
        f"step time in-sample: {f(s['step_insample'])}",
        f"step time leave-one-run-out: {f(s['step_loo'])}",
        f"inside their leave-one-out 90% interval: {s['loo_inside']}/{s['loo_runs']}"
        + (f" (median half-width {s['loo_interval_half_width_median']:.1%})" if s["loo_interval_half_width_median"] else ""),
        f"peak memory in-sample: {f(s['memory_insample'])}",
        f"peak memory leave-one-run-out: {f(s['memory_loo'])}",
    ]  # fmt: skip
    return "\n".join(out + [f"note: {n}" for n in notes]) + "\n"


def csv(df: pd.DataFrame, vdf: pd.DataFrame) -> str:
    """Both tables in one CSV, told apart by a ``table`` column (runs, variant_runs)."""
    parts = [df.assign(table="runs")] + ([vdf.assign(table="variant_runs")] if len(vdf) else [])
    return pd.concat(parts, ignore_index=True).to_csv(index=False)


def variant_text(df: pd.DataFrame) -> str:
    """The FP8, MoE and MLA runs' table (:func:`variant_table`) as text."""
    if df.empty:
        return ""
    view = pd.DataFrame({
        "run": df["run"], "variant": df["variant"], "measured ms": df["measured_ms"].round(1),
        "in-sample ms": df["insample_ms"].round(1), "err": df["insample_err"].map(pct),
        "held-out ms": df["heldout_ms"].round(1), "held-out err": df["heldout_err"].map(pct),
        "mem GB": df["measured_mem_gb"].round(1), "pred GB": df["insample_mem_gb"].round(1),
        "mem err": df["mem_err"].map(pct), "held-out mem err": df["heldout_mem_err"].map(pct),
    })  # fmt: skip
    src = [f"  {r}: {f}" for r, f in zip(df["run"], df["heldout_from"], strict=True)]
    return "\n".join([
        "", "FP8, MoE and MLA runs (analytic device path; held out: their variant terms refitted without the run)",
        "", view.to_string(index=False), "", "held-out variant terms measured on:", *src,
    ]) + "\n"  # fmt: skip
