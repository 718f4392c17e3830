"""Figures and tables of a calibration: collective bus bandwidth against message size
(measured points and fitted curves per span), eff_{g->n} against GPUs (measured and
fitted, with the +-1 sigma band of the per-step latency), and the parameter table with
each value's uncertainty and status.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
from calib.calibrate.calibration import Calibration, Param
from calib.reports import style as S

from calib.core.collective_names import busbw_factor

SCALE_SHADES = ("#1b9e77", "#7570b3", "#d95f02", "#e7298a", "#66a61e", "#a6761d")


def _fmt_param(p: Param | None, scale: float = 1.0, digits: int = 3) -> str:
    if p is None:
        return "-"
    text = f"{p.value * scale:.{digits}g}"
    if p.stderr is not None and np.isfinite(p.stderr):
        text += f" ± {p.stderr * scale:.2g}"
    return text


def busbw_frame(cal: Calibration, series: tuple, model_gpus: tuple[int, ...]) -> pd.DataFrame:
    rows = []
    for s in series:
        f = float(busbw_factor(s.collective, s.n_gpus))
        f = 1.0 if not np.isfinite(f) else f
        for b, t in zip(s.bytes, s.time_s):
            rows.append((s.collective, s.n_gpus, s.n_nodes, "measured", float(b), float(b) * f / t / 1e9))
    for c in cal.collectives:
        lo = min((seg.min_bytes for seg in c.segments), default=1024.0)
        hi = max((seg.max_bytes for seg in c.segments), default=float(2**30))
        xs = np.geomspace(lo, hi, 80)
        for b, v in zip(xs, c.busbw_curve_gbps(xs)):
            rows.append((c.collective, c.n_gpus, c.n_nodes, "fit", float(b), float(v)))
    gpn = cal.gpus_per_node
    colls = sorted({c.collective for c in cal.collectives})
    measured_max = max((c.n_gpus for c in cal.collectives), default=0)
    xs = np.geomspace(1024.0, float(2**30), 60)
    for n in model_gpus:
        if n <= measured_max:
            continue
        for coll in colls:
            t = cal.collective_time_s(coll, xs, n)
            f = float(busbw_factor(coll, n))
            for b, v in zip(xs, xs * f / t / 1e9):
                rows.append((coll, int(n), int(np.ceil(n / gpn)), "model", float(b), float(v)))
    return pd.DataFrame(rows, columns=["collective", "n_gpus", "n_nodes", "kind", "bytes", "busbw_gbps"])


def busbw(cal: Calibration, series: tuple, model_gpus: tuple[int, ...] = (512,)) -> S.Drawn | None:
    """One panel per collective: busbw (GB/s) against message size, per scale."""
    df = busbw_frame(cal, series, model_gpus)
    if df.empty:
        return None
    colls = sorted(df["collective"].unique())
    ncol = min(3, len(colls))
    nrow = int(np.ceil(len(colls) / ncol))
    fig, axes = S.new_figure(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
    for i, coll in enumerate(colls):
        ax = axes[i // ncol, i % ncol]
        d = df[df["collective"] == coll]
        scales = sorted(d.loc[d["kind"] != "model", "n_gpus"].unique())
        for j, n in enumerate(scales):
            shade = SCALE_SHADES[j % len(SCALE_SHADES)]
            nodes = int(d.loc[d["n_gpus"] == n, "n_nodes"].iloc[0])
            m = d[(d["n_gpus"] == n) & (d["kind"] == "measured")]
            f = d[(d["n_gpus"] == n) & (d["kind"] == "fit")]
            span = "intra-node" if nodes <= 1 else f"{nodes} nodes"
            if len(m):
                ax.scatter(
                    m["bytes"],
                    m["busbw_gbps"],
                    s=12,
                    color=shade,
                    zorder=3,
                    label=f"measured, {n} GPUs ({span})",
                )
            if len(f):
                ax.plot(f["bytes"], f["busbw_gbps"], color=shade, lw=1.4, label=f"fit, {n} GPUs")
        for n in sorted(d.loc[d["kind"] == "model", "n_gpus"].unique()):
            mm = d[(d["n_gpus"] == n) & (d["kind"] == "model")]
            ax.plot(mm["bytes"], mm["busbw_gbps"], color="black", ls="--", lw=1.1,
                    label=f"model, {n} GPUs ({int(mm['n_nodes'].iloc[0])} nodes)")  # fmt: skip
        ax.set_xscale("log", base=2)
        lo = max(2.0, float(d["bytes"].min()))
        ticks = [2.0**k for k in range(int(np.log2(lo)), 31, 4)]
        ax.set_xticks(ticks, [S.bytes_label(t) for t in ticks])
        ax.set_xlabel("message size (nccl-tests size, bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(coll, color=S.COLLECTIVES.get(coll, "black"))
        ax.legend(loc="upper left", frameon=False, fontsize=7)
    for k in range(len(colls), nrow * ncol):
        axes[k // ncol, k % ncol].set_visible(False)
    return S.Drawn(fig, df)


def eff_frame(cal: Calibration, max_gpus: int) -> pd.DataFrame:
    rows = []
    for coll, net in sorted(cal.network.items()):
        ns = np.unique(np.geomspace(net.g_gpus, max(max_gpus, net.g_gpus * 2), 60).round().astype(int))
        eff = net.eff(ns)
        lam = net.params.get("lambda_s")
        lo = hi = eff
        if lam is not None and lam.stderr is not None and np.isfinite(lam.stderr) and lam.stderr > 0:
            bands = []
            for v in (max(lam.value - lam.stderr, 0.0), lam.value + lam.stderr):
                bands.append(replace(net, params={**net.params, "lambda_s": replace(lam, value=v)}).eff(ns))
            lo, hi = np.minimum(*bands), np.maximum(*bands)
        for n, e, a, b in zip(ns, eff, lo, hi):
            rows.append((coll, int(n), "fit", float(e), float(a), float(b)))
        for n, e in net.measured:
            rows.append((coll, int(n), "measured", float(e), np.nan, np.nan))
    return pd.DataFrame(rows, columns=["collective", "n_gpus", "kind", "eff", "eff_lo", "eff_hi"])


def eff(cal: Calibration, max_gpus: int = 2160) -> S.Drawn | None:
    """eff_{g->n} against GPUs: the fitted form, its +-1 sigma band, the measured points."""
    df = eff_frame(cal, max_gpus)
    if df.empty:
        return None
    fig, ax = S.new_figure(figsize=(9.0, 3.6))
    for coll in sorted(df["collective"].unique()):
        d = df[df["collective"] == coll]
        col = S.COLLECTIVES.get(coll, "black")
        f = d[d["kind"] == "fit"]
        ax.plot(f["n_gpus"], f["eff"], color=col, lw=1.6, label=f"{coll}: fit ({cal.network[coll].form})")
        ax.fill_between(f["n_gpus"], f["eff_lo"], f["eff_hi"], color=col, alpha=0.18, lw=0)
        m = d[d["kind"] == "measured"]
        ax.scatter(
            m["n_gpus"], m["eff"], color=col, edgecolor="black", zorder=3, s=30, label=f"{coll}: measured"
        )
    measured_max = df.loc[df["kind"] == "measured", "n_gpus"].max()
    if np.isfinite(measured_max):
        ax.axvline(measured_max, color="black", lw=0.8, ls=":")
        ax.text(measured_max * 1.08, 0.04, "extrapolation →", fontsize=8, transform=ax.get_xaxis_transform())
        ax.text(
            measured_max / 1.08,
            0.04,
            "← measured",
            fontsize=8,
            ha="right",
            transform=ax.get_xaxis_transform(),
        )
    ax.set_xscale("log", base=2)
    S.plain_log_axis(ax.xaxis, base=2)
    ax.set_xlabel("GPUs n")
    ax.set_ylabel("eff g→n (busbw at n / busbw at g)")
    ax.set_ylim(0, 1.05)
    ax.set_title("network efficiency eff g→n (shaded: ±1σ of the per-step latency λ)", loc="left")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return S.Drawn(fig, df)


def parameter_table(cal: Calibration) -> pd.DataFrame:
    """Every fitted or defaulted number with its uncertainty, status and fit quality."""
    rows = []
    for c in sorted(cal.collectives, key=lambda c: (c.collective, c.n_gpus)):
        q = c.quality
        rows.append({
            "factor": f"{c.collective} curve", "scale": f"{c.n_gpus} GPUs / {c.n_nodes} nodes",
            "value": f"α {_fmt_param(c.alpha_s, 1e6)} µs; plateau busbw {_fmt_param(c.busbw_gbps)} GB/s; "
                     f"{len(c.segments) or 1} regime(s)",
            "status": c.busbw_gbps.status,
            "fit": _quality(q),
        })  # fmt: skip
    for coll, net in sorted(cal.network.items()):
        lam = net.params.get("lambda_s")
        val = f"λ {_fmt_param(lam, 1e6)} µs/step; " if lam is not None else ""
        val += ", ".join(f"eff({n})={float(net.eff(n)):.3f}" for n in (512, 2160))
        rows.append({"factor": f"eff g→n {coll}", "scale": f"g = {net.g_gpus} GPUs, form {net.form}", "value": val,
                     "status": lam.status if lam is not None else "-", "fit": _quality(net.quality)})  # fmt: skip
    for name, curve in (
        ("k1", cal.k1_curve),
        ("k2", cal.k2_curve),
        ("GEMM efficiency", cal.gemm_efficiency_curve),
    ):
        if curve is None:
            continue
        rows.append({"factor": name, "scale": "y = y_max / (1 + (x_half / x)^γ)",
                     "value": f"y_max {_fmt_param(curve.y_max)}, x_half {_fmt_param(curve.x_half)} FLOP",
                     "status": curve.y_max.status, "fit": _quality(curve.quality)})  # fmt: skip
    for key, p in sorted(cal.dispatch.items()):
        rows.append({"factor": key.replace("_s_per_op", " dispatch"), "scale": "per operator",
                     "value": f"{_fmt_param(p, 1e6)} µs", "status": p.status, "fit": ""})  # fmt: skip
    return pd.DataFrame(rows, columns=["factor", "scale", "value", "status", "fit"])


def _quality(q) -> str:
    return "" if q is None else q.summary(", ")
