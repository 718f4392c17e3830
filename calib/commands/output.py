"""Text, JSON and CSV renderings of predictions, searches and validations.

Terminal tables are grouped (time, memory, throughput) so each stays readable; JSON and
CSV carry every column with its unit in the name.  Files are written atomically.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from calib.core.atomic import write_text
from calib.core.errors import InputError

TIME_COLUMNS = {
    "iter_s": "iter",
    "kernel_transformer_s": "kernel",
    "kernel_other_s": "other-kern",
    "dispatch_intra_s": "intra-op",
    "dispatch_inter_s": "inter-op",
    "tp_s": "TP",
    "pp_s": "PP",
    "ep_cp_exposed_s": "EP/CP",
    "dp_allreduce_exposed_s": "DP-AR",
    "dp_allgather_exposed_s": "DP-AG",
    "dp_reducescatter_exposed_s": "DP-RS",
    "bubble_s": "bubble",
    "optimizer_s": "optim",
    "comm_overlapped_s": "overlapped",
}
MEMORY_COLUMNS = {
    "mem_weights_gb": "weights",
    "mem_grads_gb": "grads",
    "mem_optimizer_gb": "optimizer",
    "mem_activations_gb": "activations",
    "mem_total_gb": "total",
    "hbm_gb": "HBM",
}
RATE_COLUMNS = {
    "tokens_per_s": "tokens/s",
    "tflops_per_gpu": "TFLOP/s/GPU",
    "mfu": "MFU",
    "speedup": "speedup",
    "scaling_eff": "scaling eff",
    "speedup_comm_model": "comm-model speedup",
}
LAYOUT = {
    "gpus": "GPUs",
    "tp": "TP",
    "cp": "CP",
    "ep": "EP",
    "pp": "PP",
    "dp": "DP",
    "zero": "ZeRO",
    "micro_batch": "mb",
    "microbatches": "m",
    "global_batch": "B",
}


def _sig(df: pd.DataFrame, cols: dict[str, str], digits: int = 4) -> pd.DataFrame:
    """Display copy with ``digits`` significant digits (tables of a few rows)."""
    return df[list(cols)].rename(columns=cols).map(lambda x: f"{x:.{digits}g}")


def predict_text(table: pd.DataFrame, header: list[str], notes: list[str]) -> str:
    lay = table[list(LAYOUT)].rename(columns=LAYOUT)
    time = _sig(table, TIME_COLUMNS)
    if "iter_s_lo" in table:  # the 90 % prediction interval beside the point estimate
        band = (
            table["iter_s_lo"].map(lambda v: f"{v:.4g}") + ".." + table["iter_s_hi"].map(lambda v: f"{v:.4g}")
        )
        time.insert(1, "90% interval", band.to_numpy())
    mem = table[list(MEMORY_COLUMNS)].rename(columns=MEMORY_COLUMNS).round(1)
    mem["OOM"] = np.where(
        table["oom"], "OOM: " + table.get("oom_term", pd.Series("", index=table.index)), "ok"
    )
    rate = table[list(RATE_COLUMNS)].rename(columns=RATE_COLUMNS).copy()
    rate["MFU"] = (rate["MFU"] * 100).round(1).astype(str) + "%"
    rate["tokens/s"] = rate["tokens/s"].map(lambda v: f"{v:,.0f}")
    for c in ("TFLOP/s/GPU",):
        rate[c] = rate[c].round(1)
    for c in ("speedup", "scaling eff", "comm-model speedup"):
        rate[c] = rate[c].map(lambda v: "n/a" if not np.isfinite(v) else f"{v:.3f}")
    out = [*header, ""]
    out += ["layout", _indent(lay.to_string(index=False)), ""]
    out += [
        "time per iteration, seconds (communication columns are the exposed part)",
        _indent(pd.concat([lay[["GPUs"]], time], axis=1).to_string(index=False)),
        "",
    ]
    out += ["memory per GPU, GB", _indent(pd.concat([lay[["GPUs"]], mem], axis=1).to_string(index=False)), ""]
    out += [
        "throughput and scaling",
        _indent(pd.concat([lay[["GPUs"]], rate], axis=1).to_string(index=False)),
    ]
    if notes:
        out += ["", *[f"note: {n}" for n in notes]]
    return "\n".join(out) + "\n"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def jsonable(obj):
    """Plain JSON types: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def records(df: pd.DataFrame) -> list[dict]:
    return jsonable(df.to_dict(orient="records"))


def dumps(obj) -> str:
    return json.dumps(jsonable(obj), indent=2, allow_nan=False) + "\n"


def emit(text: str, out: str | Path | None) -> str | None:
    """Write ``text`` atomically to ``out`` (temporary name, then rename); or return it for stdout."""
    if out is None or str(out) == "-":
        return text
    path = Path(out)
    if path.is_dir():
        raise InputError("--out", f"{path} is a directory")
    if not path.parent.is_dir():
        raise InputError("--out", f"cannot write {path}: no such directory")
    try:
        write_text(path, text)
    except OSError as exc:
        raise InputError("--out", f"cannot write {path}: {exc.strerror or exc}") from None
    return None


SEARCH_COLUMNS = {
    "rank": "#", "gpus": "GPUs", "tp": "TP", "tp_c": "TP cols", "cp": "CP", "ep": "EP", "pp": "PP", "dp": "DP", "micro_batch": "mb", "microbatches": "m",
    "interleave": "v", "schedule": "schedule", "zero": "ZeRO", "shard": "shard", "recompute": "recompute", "seq_parallel": "SP", "dp_overlap": "ovl",
    "iter_s": "iter s", "tokens_per_s": "tokens/s", "tflops_per_gpu": "TFLOP/s/GPU", "mfu": "MFU",
    "compute_s": "compute s", "comm_exposed_s": "comm s", "bubble_s": "bubble s", "tp_s": "TP s",
    "ep_cp_exposed_s": "EP/CP s", "dp_exposed_s": "DP s", "mem_total_gb": "mem GB",
    "energy_j_per_token": "J/token", "power_w_per_gpu": "W/GPU",
}  # fmt: skip


def _search_view(table: pd.DataFrame) -> pd.DataFrame:
    cols = [c for c in SEARCH_COLUMNS if c in table.columns]
    if "shard" in cols and not table["shard"].any():  # no hybrid sharding searched
        cols.remove("shard")
    view = table[cols].rename(columns=SEARCH_COLUMNS).copy()
    for c in ("SP", "ovl"):
        if c in view:
            view[c] = np.where(view[c], "y", "-")
    view["MFU"] = (view["MFU"] * 100).round(1).astype(str) + "%"
    view["tokens/s"] = view["tokens/s"].map(lambda v: f"{v:,.0f}")
    for c in ("iter s", "compute s", "comm s", "bubble s", "TP s", "EP/CP s", "DP s"):
        if c in view:
            view[c] = view[c].map(lambda v: f"{v:.4g}")
    if "iter_s_lo" in table:  # the 90 % prediction interval
        band = (
            table["iter_s_lo"].map(lambda v: f"{v:.4g}") + ".." + table["iter_s_hi"].map(lambda v: f"{v:.4g}")
        )
        view.insert(view.columns.get_loc("iter s") + 1, "90% interval", band.to_numpy())
    for c in ("TFLOP/s/GPU", "mem GB", "W/GPU"):
        if c in view:
            view[c] = view[c].round(1)
    if "J/token" in view:
        view["J/token"] = view["J/token"].map(lambda v: f"{v:.4g}")
    return view


def search_text(summary: dict, table: pd.DataFrame, per_gpus: pd.DataFrame | None, notes: list[str]) -> str:
    g = summary["gpus"]
    gpus = f"{len(g)} GPU counts ({g[0]}..{g[-1]})" if isinstance(g, list) else f"{g} GPUs"
    out = [
        f"model {summary['model']} on {gpus}, global batch {summary['global_batch']}; machine {summary['machine']} "
        f"(calibration {summary['calibration']})",
        f"{summary['strategies']:,} valid strategies ({summary['feasible']:,} fit in memory) evaluated in "
        f"{summary['seconds']:.3f} s = {summary['strategies_per_s']:,.0f} strategies/s",
        "",
    ]
    if table.empty and not summary["strategies"]:
        out.append("no valid strategy: no layout divides the GPU count, heads, layers and batch as required")
    elif table.empty:
        out.append("no strategy fits in device memory")
    else:
        out += ["best strategies", _indent(_search_view(table).to_string(index=False))]
    if per_gpus is not None and not per_gpus.empty:
        view = _search_view(per_gpus)
        out += [
            "",
            "best strategy per GPU count",
            _indent(view.drop(columns=["#"], errors="ignore").to_string(index=False)),
        ]
    if notes:
        out += ["", *[f"note: {n}" for n in notes]]
    return "\n".join(out) + "\n"


def validate_text(info: dict, rows: pd.DataFrame) -> str:
    s = info["summary"]
    out = [f"table {info['table']} ({info['format']}, {info['rows']} rows); {info['split']}"]
    fit = {k: v for k, v in info["fit"].items() if k not in ("fit", "at_bound", "not_identified", "notes")}
    if fit:
        parts = []
        for k, v in fit.items():
            if k.endswith("_stderr"):
                continue
            err = fit.get(k + "_stderr")
            if isinstance(v, list):
                parts.append(f"{k} {v[0]:.4g}..{v[1]:.4g}")
            elif isinstance(v, float):
                parts.append(
                    f"{k} {v:.4g}" + (f" +- {err:.2g}" if err is not None and np.isfinite(err) else "")
                )
            else:
                parts.append(f"{k} {v}")
        out.append(f"fit ({info['fit'].get('fit')}): " + ", ".join(parts))
    if s["n_heldout"]:
        out.append(
            f"held-out rows {s['n_heldout']}: median |err| {s['median_abs_pct']:.2f} %, mean {s['mean_abs_pct']:.2f} %, "
            f"max {s['max_abs_pct']:.2f} %"
            + (
                f"; signed median {s['median_signed_pct']:+.2f} %, predicted above the measured value in "
                f"{s['n_predicted_above']} of {s['n_heldout']}"
                if s.get("median_signed_pct") is not None
                else ""
            )
        )
    if s.get("by_group"):
        out.append(
            "held-out by group: "
            + "; ".join(
                f"{g} {v['n']} rows, median |err| {v['median_abs_pct']:.2f} % (signed {v['median_signed_pct']:+.2f} %)"
                for g, v in s["by_group"].items()
            )
        )
    if s.get("n_inside_interval") is not None:
        out.append(
            f"held-out rows inside their 90 % interval: {s['n_inside_interval']} of {s['n_with_interval']} "
            f"(median half-width {s['median_interval_pct']:.1f} %; the fit's parameter errors and its "
            "calibration rows' scatter, analytic/fit_interval.py)"
        )
    if s.get("unfitted_median_abs_pct") is not None:
        worse = s["unfitted_median_abs_pct"] < s["median_abs_pct"]
        out.append(
            f"{'warning: ' if worse else ''}the same rows without the fit: median |err| "
            f"{s['unfitted_median_abs_pct']:.2f} %, max {s['unfitted_max_abs_pct']:.2f} %"
            + (" (the fit does worse than none)" if worse else "")
        )
    out += [
        f"warning: fitted {b} (the fit wanted a value outside it)" for b in info["fit"].get("at_bound", [])
    ]
    out += [f"note: {b}" for b in (*info["fit"].get("not_identified", []), *info["fit"].get("notes", []))]
    if "n_predicted_oom" in s:
        terms = ", ".join(f"{k} {v}" for k, v in s["predicted_oom_terms"].items())
        out.append(
            f"memory: {s['n_predicted_oom']} of {s['n_rows']} measured (trained) configurations predicted not to fit"
            + (f" (overflowing term: {terms})" if terms else "")
        )
    if info.get("saved_calibration"):
        out.append(f"fitted efficiencies saved as calibration {info['saved_calibration']}")
    cols = ["label", "group", "role", "quantity", "measured", "predicted", "err_pct"]
    if "hardware_override" in rows and (rows["hardware_override"] != "").any():
        cols.append("hardware_override")
    view = rows[cols].copy()
    view["measured"] = view["measured"].map(lambda v: f"{v:.4g}")
    view["predicted"] = view["predicted"].map(lambda v: f"{v:.4g}")
    view["err_pct"] = view["err_pct"].map(lambda v: f"{v:+.2f}")
    if "interval_pct" in rows and rows["interval_pct"].notna().any():  # the fit's 90 % interval
        inside = rows["inside"].map(lambda v: "in" if v is True or v == 1 else "OUT")
        view["90% ±"] = [
            "" if np.isnan(h) else f"{h:.3g} % {i}" for h, i in zip(rows["interval_pct"], inside, strict=True)
        ]
    if rows["oom"].any():
        view["note"] = np.where(rows["oom"], "model says OOM: " + rows["oom_term"].astype(str), "")
    out += ["", _indent(view.rename(columns={"err_pct": "err %"}).to_string(index=False))]
    return "\n".join(out) + "\n"
