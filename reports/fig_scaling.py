"""Predicted ZeRO-1/2/3 scaling (seed 004 Fig. 12-14 style), scaling efficiency per
model and memory per GPU against HBM, from :func:`reports.predictions.scaling_table`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.reports import style as S


def zero_bars(table: pd.DataFrame, zero: int) -> S.Drawn | None:
    """One panel per model: iteration time split into compute and communication per GPU
    count (stacked, exposed communication), speedup on the right axis; OOM hatched."""
    df = table[table["zero"] == zero]
    if df.empty:
        return None
    models = list(dict.fromkeys(df["model"]))
    ncol = min(3, len(models))
    nrow = int(np.ceil(len(models) / ncol))
    fig, axes = S.new_figure(nrow, ncol, figsize=(4.3 * ncol, 3.0 * nrow + 0.6), squeeze=False)
    used: dict[str, object] = {}
    for i, name in enumerate(models):
        ax = axes[i // ncol, i % ncol]
        d = df[df["model"] == name].sort_values("gpus")
        x = np.arange(len(d))
        bottom = np.zeros(len(d))
        oom = d["oom"].to_numpy(bool)
        for col, bucket in S.PREDICTED.items():
            h = d[col].to_numpy(float)
            if not h.any():
                continue
            bars = ax.bar(
                x, h, bottom=bottom, color=S.color(bucket), width=0.75, edgecolor="white", linewidth=0.3
            )
            used.setdefault(bucket, bars)
            bottom += h
        for xi, top, o in zip(x, bottom, oom):
            if o:
                ax.bar(xi, top, width=0.75, fill=False, hatch=S.HATCH_OOM, edgecolor="#444444", linewidth=0.4)
                ax.text(xi, top, "OOM", ha="center", va="bottom", fontsize=7, color="black")
        ax.set_xticks(x, [str(g) for g in d["gpus"]])
        ax.set_xlabel("GPUs")
        ax.set_ylabel("time per iteration (s)")
        ax.set_ylim(0, bottom.max() * 1.18 if bottom.max() > 0 else 1)
        ax.set_title(f"{S.short(name, 24)} ({d['params_b'].iloc[0]:.1f} B params)")
        ax2 = ax.twinx()
        ax2.plot(x, d["speedup"], color="black", marker="o", ms=3.5, lw=1.2, label="predicted speedup")
        ideal = d["gpus"].to_numpy(float) / float(d["gpus"].iloc[0])
        ax2.plot(x, ideal, color="black", ls=":", lw=0.9, label="ideal speedup")
        ax2.set_yscale("log", base=2)
        S.plain_log_axis(ax2.yaxis, base=2)
        ax2.set_ylabel(f"speedup vs {int(d['gpus'].iloc[0])} GPUs")
        ax2.grid(False)
        ax2.spines["right"].set_visible(True)
        if i == 0:
            used["speedup"] = ax2.lines[0]
            used["ideal"] = ax2.lines[1]
    for k in range(len(models), nrow * ncol):
        axes[k // ncol, k % ncol].set_visible(False)
    handles = [used[k] for k in used]
    labels = [
        S.label(k) if k in S.BUCKETS else ("predicted speedup" if k == "speedup" else "ideal speedup")
        for k in used
    ]
    fig.legend(handles, labels, loc="outside lower center", ncol=min(6, len(handles)), frameon=False)
    fig.suptitle(f"ZeRO-{zero}: predicted time per iteration and speedup (weak scaling)", fontsize=11)
    cols = [
        "model",
        "zero",
        "gpus",
        "iter_s",
        "iter_s_lo",
        "iter_s_hi",
        *S.PREDICTED,
        "speedup",
        "scaling_eff",
        "oom",
    ]
    return S.Drawn(fig, df[[c for c in cols if c in df.columns]].reset_index(drop=True))


def efficiency(table: pd.DataFrame) -> S.Drawn | None:
    """Scaling efficiency against GPUs, one panel per ZeRO stage, one line per model."""
    if table is None or table.empty:
        return None
    zeros = sorted(table["zero"].unique())
    fig, axes = S.new_figure(1, len(zeros), figsize=(4.0 * len(zeros), 3.3), squeeze=False, sharey=True)
    models = list(dict.fromkeys(table["model"]))
    for j, z in enumerate(zeros):
        ax = axes[0, j]
        for i, name in enumerate(models):
            d = table[(table["zero"] == z) & (table["model"] == name)].sort_values("gpus")
            col = S.SERIES[i % len(S.SERIES)]
            ax.plot(
                d["gpus"], 100 * d["scaling_eff"], color=col, marker=S.ZERO_STYLE[int(z)][0], ms=4, label=name
            )
            o = d[d["oom"]]
            ax.scatter(o["gpus"], 100 * o["scaling_eff"], s=60, facecolor="none", edgecolor="black", zorder=4)
        ax.set_xscale("log", base=2)
        S.plain_log_axis(ax.xaxis, base=2)
        ax.set_xlabel("GPUs")
        ax.set_title(f"ZeRO-{int(z)}")
    lo = float(100 * table["scaling_eff"].min())
    for ax in axes[0]:
        ax.set_ylim(max(0.0, lo - 10.0), 102)
    axes[0, 0].set_ylabel("scaling efficiency (%)")
    axes[0, -1].legend(
        loc="lower left", frameon=False, fontsize=7, title="model (circled: OOM)", title_fontsize=7
    )
    data = table[["model", "zero", "gpus", "speedup", "scaling_eff", "oom"]].reset_index(drop=True)
    return S.Drawn(fig, data)


def memory(table: pd.DataFrame, hbm_gb: float | None) -> S.Drawn | None:
    """Memory per GPU by part at the smallest GPU count, per model and ZeRO stage, against HBM."""
    if table is None or table.empty:
        return None
    zeros = sorted(table["zero"].unique())
    g0, g1 = int(table["gpus"].min()), int(table["gpus"].max())
    fig, axes = S.new_figure(1, len(zeros), figsize=(4.2 * len(zeros), 3.6), squeeze=False, sharey=True)
    rows = []
    for j, z in enumerate(zeros):
        ax = axes[0, j]
        d = table[(table["zero"] == z) & (table["gpus"] == g0)].reset_index(drop=True)
        big = table[(table["zero"] == z) & (table["gpus"] == g1)].set_index("model")["mem_total_gb"]
        x = np.arange(len(d))
        bottom = np.zeros(len(d))
        for col, (lab, colr) in S.MEMORY.items():
            h = d[col].to_numpy(float)
            ax.bar(x, h, bottom=bottom, color=colr, label=lab, width=0.7)
            bottom += h
        ax.scatter(x, [big.get(m, np.nan) for m in d["model"]], marker="D", color="black", s=18, zorder=4,
                   label=f"total at {g1} GPUs")  # fmt: skip
        if hbm_gb:
            ax.axhline(
                hbm_gb, color="#D55E00", lw=1.2, ls="--", label=f"HBM {hbm_gb:g} GB (out of memory above)"
            )
        for xi, top, o in zip(x, bottom, d["oom"]):
            if o:
                ax.text(xi, top, "OOM", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [S.short(m, 12) for m in d["model"]], rotation=30, ha="right")
        ax.set_title(f"ZeRO-{int(z)}, {g0} GPUs")
        for _, r in d.iterrows():
            rows.append({"zero": int(z), "gpus": g0, "model": r["model"], **{c: r[c] for c in S.MEMORY},
                         "mem_total_gb": r["mem_total_gb"], "hbm_gb": hbm_gb, "oom": bool(r["oom"]),
                         f"mem_total_gb_at_{g1}": big.get(r["model"], np.nan)})  # fmt: skip
    axes[0, 0].set_ylabel("memory per GPU (GB)")
    axes[0, -1].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return S.Drawn(fig, pd.DataFrame(rows))


def scaling_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per model and ZeRO stage: time and share of communication at the smallest and largest
    GPU count, the speedup and efficiency at the largest, and which counts run out of memory."""
    rows = []
    for (name, z), d in table.groupby(["model", "zero"], sort=False):
        d = d.sort_values("gpus")
        a, b = d.iloc[0], d.iloc[-1]
        rows.append({
            "model": name, "ZeRO": int(z), "params B": round(float(a["params_b"]), 2),
            f"iter s @{int(a['gpus'])}": a["iter_s"], f"iter s @{int(b['gpus'])}": b["iter_s"],
            f"comm % @{int(b['gpus'])}": 100 * b["comm_exposed_s"] / b["iter_s"],
            f"speedup @{int(b['gpus'])}": b["speedup"], "scaling eff %": 100 * b["scaling_eff"],
            "OOM at": ", ".join(str(int(g)) for g in d.loc[d["oom"], "gpus"]) or "-",
        })  # fmt: skip
    return pd.DataFrame(rows)
