"""Figures and tables of traced runs: buckets per rank and iteration (seed 004 Fig. 10,
12-14 style), kernel-class shares (Table 6 style) and the compute dissection across runs.

Every function takes runs read through ``calib.core.rundir`` and returns a :class:`Drawn`
(figure + the numbers drawn) or a table; names from traces are passed through
:func:`reports.style.short` for axes and are escaped by the HTML/Markdown writers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.calibrate.calibration import Calibration
from calib.reports import style as S

from calib.core.rundir import Run
from calib.core.schema import KERNEL_CLASSES

MAX_BARS = 96  # above this, iterations are averaged per rank


def bucket_frame(run: Run) -> pd.DataFrame:
    """The stacked segments of each rank x iteration; they sum to ``wall_s`` exactly."""
    b = run.table("buckets").sort_values(["rank", "iteration"], kind="stable")
    return pd.DataFrame(
        {
            "rank": b["rank"].to_numpy(),
            "iteration": b["iteration"].to_numpy(),
            "wall_s": b["wall_s"].to_numpy(),
            "comm_exposed_s": b["comm_exposed_s"].to_numpy(),
            "comm_overlapped_s": (b["comm_s"] - b["comm_exposed_s"]).to_numpy(),
            "compute_kernel_s": (b["kernel_s"] - b["memcpy_s"]).to_numpy(),
            "memcpy_s": b["memcpy_s"].to_numpy(),
            "intra_op_s": b["intra_op_s"].to_numpy(),
            "inter_op_s": b["inter_op_s"].to_numpy(),
            "other_s": b["other_s"].to_numpy(),
        }
    )


def bucket_bars(run: Run) -> S.Drawn:
    """Stacked bars, one per rank and iteration, in seconds (averaged per rank when many)."""
    df = bucket_frame(run)
    averaged = len(df) > MAX_BARS
    if averaged:
        df = df.groupby("rank", as_index=False).mean(numeric_only=True).assign(iteration=-1)
    n = len(df)
    fig, ax = S.new_figure(figsize=(max(7.0, min(12.0, 3.2 + 0.32 * n)), 3.4))
    x = np.arange(n)
    bottom = np.zeros(n)
    for col, bucket in S.MEASURED.items():
        h = df[col].to_numpy()
        if not h.any():
            continue
        ax.bar(x, h, bottom=bottom, color=S.color(bucket), label=S.label(bucket), width=0.8,
               hatch="//" if bucket == "comm_overlapped" else None, edgecolor="white", linewidth=0.3)  # fmt: skip
        bottom += h
    labels = [f"r{r}" if averaged or it < 0 else f"r{r}·{it}" for r, it in zip(df["rank"], df["iteration"])]
    step = max(1, n // 40)
    ax.set_xticks(x[::step], labels[::step], rotation=90 if n > 12 else 0)
    ax.set_xlabel("rank · iteration (ProfilerStep)" if not averaged else "rank (mean over iterations)")
    ax.set_ylabel("time per iteration (s)")
    ax.set_title(f"{S.short(run.meta.name, 60)}: time buckets per rank and iteration", loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_xlim(-0.6, n - 0.4)
    return S.Drawn(fig, df)


def class_frame(runs: list[Run]) -> pd.DataFrame:
    """Kernel-class share of kernel time per run (%), summed over ranks and iterations."""
    rows = []
    for run in runs:
        if not run.has("kernels"):
            continue
        k = run.table("kernels")
        tot = k.groupby("kernel_class")["time_s"].sum()
        total = float(tot.sum())
        if total <= 0:
            continue
        rows.append({"run": run.meta.name, **{c: 100.0 * float(tot.get(c, 0.0)) / total for c in KERNEL_CLASSES},
                     "kernel_s": total})  # fmt: skip
    return pd.DataFrame(rows, columns=["run", *KERNEL_CLASSES, "kernel_s"])


def class_shares(runs: list[Run]) -> S.Drawn | None:
    """One 100 % bar per run: the kernel classes of seed 004 Table 6."""
    df = class_frame(runs)
    if df.empty:
        return None
    fig, ax = S.new_figure(figsize=(9.0, max(3.0, 0.9 + 0.36 * len(df))))
    y = np.arange(len(df))[::-1]
    left = np.zeros(len(df))
    for c in KERNEL_CLASSES:
        w = df[c].to_numpy()
        if not w.any():
            continue
        ax.barh(y, w, left=left, color=S.KERNEL_CLASSES[c], label=c.replace("_", "/"), height=0.7)
        for yi, l0, wi in zip(y, left, w):
            if wi >= 8:
                ax.text(l0 + wi / 2, yi, f"{wi:.0f}%", ha="center", va="center", fontsize=7,
                        color="white" if c in ("gemm", "attention", "memcpy", "memset") else "black")  # fmt: skip
        left += w
    ax.set_yticks(y, [S.short(r, 32) for r in df["run"]])
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of kernel execution time (%)")
    ax.set_title("kernel classes per run (seed 004 Table 6)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.grid(axis="y", visible=False)
    return S.Drawn(fig, df)


def dissection_frame(runs: list[Run]) -> pd.DataFrame:
    """Per run: kernel / intra-op / inter-op shares of compute (seed 004 Fig. 10), k1, k2, x."""
    from calib.calibrate.compute import run_points

    rows = []
    pts = run_points(tuple(runs)).set_index("run") if runs else pd.DataFrame()
    for run in runs:
        if not run.has("buckets"):
            continue
        b = run.table("buckets")
        kern, intra, inter = (float(b[c].sum()) for c in ("kernel_s", "intra_op_s", "inter_op_s"))
        busy = kern + intra + inter
        if busy <= 0:
            continue
        p = pts.loc[run.meta.name] if run.meta.name in pts.index else None
        rows.append({
            "run": run.meta.name, "device": str(b["device"].iloc[0]) if len(b) else "",
            "kernel_pct": 100 * kern / busy, "intra_op_pct": 100 * intra / busy, "inter_op_pct": 100 * inter / busy,
            "x_flops": float(p["x_flops"]) if p is not None else np.nan,
            "k1": float(p["k1"]) if p is not None else np.nan, "k2": float(p["k2"]) if p is not None else np.nan,
        })  # fmt: skip
    df = pd.DataFrame(
        rows, columns=["run", "device", "kernel_pct", "intra_op_pct", "inter_op_pct", "x_flops", "k1", "k2"]
    )
    return df.sort_values(["device", "x_flops", "run"], kind="stable", na_position="first").reset_index(
        drop=True
    )


def compute_dissection(runs: list[Run], cal: Calibration | None) -> S.Drawn | None:
    """Left: compute split into kernel and dispatch per run; right: k1 and k2 against work per operator."""
    df = dissection_frame(runs)
    if df.empty:
        return None
    has_x = df["x_flops"].notna().any()
    fig, axes = S.new_figure(1, 2 if has_x else 1, figsize=(11.0 if has_x else 7.0, 0.9 + max(2.6, 0.34 * len(df))),
                             gridspec_kw={"width_ratios": [1.3, 1]} if has_x else None, squeeze=False)  # fmt: skip
    ax = axes[0, 0]
    y = np.arange(len(df))[::-1]
    left = np.zeros(len(df))
    for col, bucket in (("kernel_pct", "kernel"), ("intra_op_pct", "intra_op"), ("inter_op_pct", "inter_op")):
        w = df[col].to_numpy()
        ax.barh(y, w, left=left, color=S.color(bucket), label=S.label(bucket), height=0.7)
        for yi, l0, wi in zip(y, left, w):
            if wi >= 9:
                ax.text(l0 + wi / 2, yi, f"{wi:.0f}%", ha="center", va="center", fontsize=7,
                        color="white" if bucket == "kernel" else "black")  # fmt: skip
        left += w
    ax.set_yticks(y, [S.short(f"{r} ({d})", 34) for r, d in zip(df["run"], df["device"])])
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of compute time: kernel + intra-op + inter-op (%)")
    ax.set_title("compute dissection (seed 004 Fig. 10)")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncol=3, frameon=False)
    ax.grid(axis="y", visible=False)
    if has_x:
        ax = axes[0, 1]
        pts = df[df["x_flops"].notna()]
        ax.scatter(
            pts["x_flops"],
            pts["k1"],
            color=S.color("kernel"),
            label="k1 measured (kernel share of compute)",
            zorder=3,
        )
        for _, r in pts.iterrows():
            ax.annotate(S.short(r["run"], 18), (r["x_flops"], r["k1"]), xytext=(4, 3), textcoords="offset points",
                        fontsize=6, color="#444444")  # fmt: skip
        ax.scatter(pts["x_flops"], pts["k2"], color=S.KERNEL_CLASSES["gemm"], marker="^",
                   label="k2 measured (GEMM+attention share of kernel)", zorder=3)  # fmt: skip
        if cal is not None and cal.k1_curve is not None and cal.k1_curve.y_max.status == "fitted":
            xs = np.geomspace(pts["x_flops"].min() / 3, pts["x_flops"].max() * 3, 100)
            ax.plot(xs, cal.k1(xs), color=S.color("kernel"), label=f"k1 fit ({S.short(cal.system, 20)})")
            if cal.k2_curve is not None and cal.k2_curve.y_max.status == "fitted":
                ax.plot(
                    xs,
                    cal.k2(xs),
                    color=S.KERNEL_CLASSES["gemm"],
                    ls="--",
                    label=f"k2 fit ({S.short(cal.system, 20)})",
                )
        ax.set_xscale("log")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("work per operator x (FLOP per matmul)")
        ax.set_ylabel("share (fraction)")
        ax.set_title("k1, k2 against work per operator")
        ax.legend(loc="upper left", frameon=False, fontsize=7)
    return S.Drawn(fig, df)


def overview(runs: list[Run]) -> pd.DataFrame:
    """One row per run: what it is and its mean bucket shares (% of wall time)."""
    rows = []
    for run in runs:
        m = run.meta
        fw = m.framework.name + (
            f" ZeRO-{m.framework.zero_stage}" if m.framework.zero_stage is not None else ""
        )
        row = {"run": m.name, "system": m.system or "", "kind": m.kind, "ranks": f"{len(m.ranks)}/{m.world_size or '?'}",
               "backend": m.backend or "", "device": ", ".join(m.devices), "framework": fw}  # fmt: skip
        if m.kind == "trace" and run.has("buckets"):
            b = run.table("buckets")
            wall = float(b["wall_s"].sum())
            row["iterations"] = int(b["iteration"].nunique())
            row["mean wall s"] = float(b["wall_s"].mean())
            for c, lab in (("comm_s", "comm %"), ("comm_exposed_s", "exposed comm %"), ("kernel_s", "kernel %"),
                           ("intra_op_s", "intra-op %"), ("inter_op_s", "inter-op %"), ("other_s", "other %")):  # fmt: skip
                row[lab] = 100.0 * float(b[c].sum()) / wall if wall > 0 else np.nan
        elif run.has("samples"):
            row["iterations"] = int(len(run.table("samples")))
        rows.append(row)
    return pd.DataFrame(rows)


def table6(run: Run, top: int = 6) -> pd.DataFrame:
    """Seed 004 Table 6: the largest kernel classes and intra-op operators, % of their bucket."""
    rows = []
    if run.has("kernels"):
        k = run.table("kernels").groupby("kernel_class")["time_s"].sum().sort_values(ascending=False)
        tot = float(k.sum())
        for c, v in k.head(top).items():
            if v > 0:
                rows.append(
                    {
                        "bucket": "kernel",
                        "operator": str(c),
                        "time %": 100 * float(v) / tot,
                        "time s": float(v),
                    }
                )
    if run.has("dispatch_ops"):
        d = run.table("dispatch_ops").groupby("op")["intra_op_s"].sum().sort_values(ascending=False)
        tot = float(d.sum())
        for op, v in d.head(top).items():
            if v > 0 and tot > 0:
                rows.append(
                    {
                        "bucket": "intra-op",
                        "operator": str(op),
                        "time %": 100 * float(v) / tot,
                        "time s": float(v),
                    }
                )
    return pd.DataFrame(rows, columns=["bucket", "operator", "time %", "time s"])


def top_kernels(run: Run, top: int = 8) -> pd.DataFrame:
    if not run.has("kernel_stats"):
        return pd.DataFrame()
    k = run.table("kernel_stats")
    g = k.groupby(["name", "kernel_class"], as_index=False).agg(
        count=("count", "sum"), total_s=("dur_sum_s", "sum")
    )
    g["mean_us"] = 1e6 * g["total_s"] / g["count"].where(g["count"] > 0)
    return g.sort_values("total_s", ascending=False, kind="stable").head(top).reset_index(drop=True)


def collective_summary(run: Run, top: int = 10) -> pd.DataFrame:
    if not run.has("collectives"):
        return pd.DataFrame()
    c = run.table("collectives")
    if c.empty:
        return pd.DataFrame()
    g = c.groupby(
        ["collective", "pg_name", "pg_role", "dtype", "bytes", "group_size"], as_index=False, dropna=False
    ).agg(count=("dur_s", "size"), mean_s=("dur_s", "mean"), busbw_gbps=("busbw_gbps", "median"))
    g["total_s"] = g["count"] * g["mean_s"]
    return g.sort_values("total_s", ascending=False, kind="stable").head(top).reset_index(drop=True)
