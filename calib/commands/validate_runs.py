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
    pct = lambda v: "-" if not np.isfinite(v) else f"{v * 100:+.1f}%"  # noqa: E731
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
