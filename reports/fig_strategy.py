"""Parallel-strategy figures: TP x DP and TP x PP communication maps (seed 004's model-
parallel study as heatmaps), the top strategies of a search, and predicted against
measured performance on published tables (seed 004 Fig. 15 style, held-out rows).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.reports import style as S
from calib.reports.predictions import Maps, SearchOut, ValidationOut
from matplotlib.colors import LogNorm


def _heatmap(ax, df: pd.DataFrame, rows: str, cols: str, title: str, xlabel: str, norm) -> object:
    rv = sorted(df[rows].unique())
    cv = sorted(df[cols].unique())
    grid = np.full((len(rv), len(cv)), np.nan)
    for _, r in df.iterrows():
        if r["valid"]:
            grid[rv.index(r[rows]), cv.index(r[cols])] = r["comm_exposed_s"]
    im = ax.imshow(np.where(grid > 0, grid, np.nan), origin="lower", cmap="viridis", norm=norm, aspect="auto")
    ax.set_facecolor("#EEEEEE")
    ok = df[df["valid"] & ~df["oom"]]
    best = ok.loc[ok["iter_s"].idxmin()] if len(ok) else None
    for _, r in df.iterrows():
        i, j = rv.index(r[rows]), cv.index(r[cols])
        if not r["valid"]:
            ax.text(j, i, "invalid", ha="center", va="center", fontsize=6.5, color="#666666")
            continue
        v = r["comm_exposed_s"]
        txt = f"{v:.2g} s\n{100 * r['comm_share']:.0f}%" + ("\nOOM" if r["oom"] else "")
        dark = v > 0 and norm(v) < 0.55
        ax.text(j, i, txt, ha="center", va="center", fontsize=6.5, color="white" if dark else "black")
        if r["oom"]:
            ax.add_patch(_rect(j, i, hatch="//", edge="#FFFFFF80"))
    if best is not None:
        ax.add_patch(_rect(cv.index(best[cols]), rv.index(best[rows]), edge="#D55E00", lw=2.2))
    ax.set_xticks(range(len(cv)), [str(c) for c in cv])
    ax.set_yticks(range(len(rv)), [str(r) for r in rv])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("TP (tensor-parallel size)")
    ax.set_title(title)
    ax.grid(False)
    return im


def _rect(j: int, i: int, hatch: str | None = None, edge: str = "black", lw: float = 0.5):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch=hatch, edgecolor=edge, lw=lw)


def comm_maps(maps: Maps) -> S.Drawn:
    """Exposed communication (s per iteration, and % of the iteration) over TP x DP and TP x PP."""
    sp = maps.spec
    both = pd.concat([maps.tp_dp.assign(map="tp_dp"), maps.tp_pp.assign(map="tp_pp")], ignore_index=True)
    vals = both.loc[both["valid"] & (both["comm_exposed_s"] > 0), "comm_exposed_s"]
    norm = LogNorm(vmin=float(vals.min()), vmax=float(vals.max())) if len(vals) else LogNorm(1e-3, 1)
    fig, axes = S.new_figure(1, 2, figsize=(12.0, 0.9 + 0.62 * max(len(sp.tp), 3)), squeeze=False)
    _heatmap(axes[0, 0], maps.tp_dp, "tp", "dp",
             f"TP × DP (PP = 1, GPUs = TP·DP, batch {sp.micro_batch}·DP)", "DP (data-parallel size)", norm)  # fmt: skip
    im = _heatmap(axes[0, 1], maps.tp_pp, "tp", "pp",
                  f"TP × PP on {sp.gpus} GPUs (DP = {sp.gpus}/(TP·PP), batch {sp.global_batch})",
                  "PP (pipeline stages)", norm)  # fmt: skip
    cb = fig.colorbar(im, ax=axes[0, :].tolist(), shrink=0.9, pad=0.02)
    cb.set_label("exposed communication per iteration (s)")
    from matplotlib.ticker import FuncFormatter

    cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    cb.ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.1g}"[0] in "25" else ""))
    fig.suptitle(f"{sp.model}, ZeRO-{sp.zero}: communication maps (cell: seconds, % of iteration; "
                 "orange box: fastest iteration that fits)", fontsize=10)  # fmt: skip
    return S.Drawn(fig, both)


SEARCH_PARTS = {
    "compute_s": ("compute", "kernel"),
    "tp_s": ("TP", "tp"),
    "pp_s": ("PP", "pp"),
    "dp_exposed_s": ("DP/ZeRO exposed", "allreduce"),
    "bubble_s": ("bubble", "bubble"),
    "optimizer_s": ("optimizer", "optimizer"),
}


def strategy_label(r) -> str:
    parts = [f"TP{r['tp']} PP{r['pp']} DP{r['dp']}", f"mb{r['micro_batch']}"]
    if r["interleave"] > 1:
        parts.append(f"v{r['interleave']}")
    parts.append(f"ZeRO-{r['zero']}")
    if r["recompute"] != "none":
        parts.append(f"{r['recompute']} recompute")
    if r["seq_parallel"]:
        parts.append("seq-parallel")
    if r["dp_overlap"]:
        parts.append("DP overlap")
    return " ".join(parts)


def search_bars(out: SearchOut) -> S.Drawn | None:
    top = out.top
    if top.empty:
        return None
    fig, ax = S.new_figure(figsize=(9.0, max(2.8, 0.9 + 0.33 * len(top))))
    y = np.arange(len(top))[::-1]
    left = np.zeros(len(top))
    for col, (lab, bucket) in SEARCH_PARTS.items():
        w = top[col].to_numpy(float)
        ax.barh(y, w, left=left, color=S.color(bucket), label=lab, height=0.7)
        left += w
    ax.set_yticks(y, [f"#{r['rank']} {strategy_label(r)}" for _, r in top.iterrows()])
    ax.set_xlabel("predicted time per iteration (s)")
    sp = out.spec
    ax.set_title(f"top {len(top)} of {out.n_strategies:,} strategies ({out.n_feasible:,} fit in memory): "
                 f"{sp.model} on {sp.gpus} GPUs, batch {sp.global_batch}")  # fmt: skip
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(axis="y", visible=False)
    cols = ["rank", "tp", "pp", "dp", "micro_batch", "interleave", "zero", "recompute", "seq_parallel", "dp_overlap",
            "iter_s", *SEARCH_PARTS, "tokens_per_s", "tflops_per_gpu", "mfu", "mem_total_gb"]  # fmt: skip
    return S.Drawn(fig, top[[c for c in cols if c in top.columns]])


def validation(v: ValidationOut) -> S.Drawn:
    """Left: predicted against measured (calibration rows hollow, held-out filled, +-10 %
    band); right: per-row error, held-out rows labelled (seed 004 Fig. 15)."""
    rows = v.rows.reset_index(drop=True)
    unit = {"iter_s": "iteration time (s)", "tflops_per_gpu": "TFLOP/s per GPU",
            "tokens_per_s_per_gpu": "tokens/s per GPU"}.get(str(rows["quantity"].iloc[0]), "value")  # fmt: skip
    fig, axes = S.new_figure(1, 2, figsize=(11.0, 3.8), gridspec_kw={"width_ratios": [1, 1.5]}, squeeze=False)
    ax = axes[0, 0]
    held = rows["role"] == "held-out"
    lo = float(min(rows["measured"].min(), rows["predicted"].min())) * 0.85
    hi = float(max(rows["measured"].max(), rows["predicted"].max())) * 1.15
    xs = np.array([lo, hi])
    ax.plot(xs, xs, color="black", lw=0.8)
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="#999999", alpha=0.2, lw=0, label="±10 %")
    ax.scatter(
        rows.loc[held, "measured"],
        rows.loc[held, "predicted"],
        color="#0072B2",
        s=28,
        zorder=3,
        label="held-out",
    )
    ax.scatter(rows.loc[~held, "measured"], rows.loc[~held, "predicted"], facecolor="none", edgecolor="#0072B2",
               s=28, zorder=3, label="calibration rows")  # fmt: skip
    if hi / lo > 20:
        ax.set_xscale("log")
        ax.set_yscale("log")
        S.plain_log_axis(ax.xaxis)
        S.plain_log_axis(ax.yaxis)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {unit}")
    ax.set_ylabel(f"predicted {unit}")
    ax.set_title("predicted vs measured")
    ax.legend(loc="upper left", frameon=False)
    ax = axes[0, 1]
    x = np.arange(len(rows))
    colors = np.where(held, "#0072B2", "#BBBBBB")
    ax.bar(x, rows["err_pct"], color=colors, width=0.7)
    for xi, e, h in zip(x, rows["err_pct"], held):
        if h:
            ax.text(xi, e, f"{e:+.1f}", ha="center", va="bottom" if e >= 0 else "top", fontsize=6.5)
    ax.axhline(0, color="black", lw=0.8)
    for b in (-10, 10):
        ax.axhline(b, color="#999999", lw=0.8, ls=":")
    ax.set_xticks(x, [S.short(lab, 28) for lab in rows["label"]], rotation=60, ha="right", fontsize=6.5)
    ax.set_ylabel("error: predicted / measured − 1 (%)")
    s = v.summary
    ax.set_title(f"held-out rows: median |err| {s['median_abs_pct']:.1f} %, max {s['max_abs_pct']:.1f} % "
                 f"(grey: calibration rows)" if s["n_heldout"] else "no held-out rows")  # fmt: skip
    fig.suptitle(f"{v.format} table, {v.split}", fontsize=10)
    return S.Drawn(fig, rows)
