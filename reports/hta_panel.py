"""HTA's view of a GPU trace beside calib's buckets: idle-time breakdown and kernel-launch
statistics (Holistic Trace Analysis, ``traceinsight``, imported lazily here only).

HTA reads the original trace files, which a run records in ``run.json`` (path and
sha256).  The panel is drawn only when HTA is installed, the run has device kernels and
its files are still where ingest found them with the same checksum; otherwise the
report says why it is missing.

What the numbers mean (traceinsight 0.6.1): idle time is per *stream* -- ``host_wait``
(the stream waits for the host to launch work), ``kernel_wait`` (gaps below 30 µs
between consecutive kernels) and ``other``; calib's idle buckets are per *device* (no
stream busy): intra-op and inter-op dispatch and other host waits.  Launch statistics
pair each ``cudaLaunchKernel`` with its kernel: CPU launch duration, GPU duration and
the delay from the end of the launch call to the kernel's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from calib.reports import style as S

from calib.core.rundir import Run, sha256_file

RUNTIME_CUTOFF_US = 50  # HTA defaults: launch calls slower than this are outliers
LAUNCH_DELAY_CUTOFF_US = 100
MAX_STREAMS = 4


@dataclass(frozen=True)
class HtaResult:
    run: str
    idle: pd.DataFrame  # rank, stream, idle_category, idle_time_us
    launch: pd.DataFrame  # rank, cpu_duration_us, gpu_duration_us, launch_delay_us
    calib_idle: pd.DataFrame  # rank, intra_op_us, inter_op_us, other_us


def available() -> bool:
    from calib.core.hta import available as hta_available

    return hta_available()


def is_gpu_run(run: Run) -> bool:
    if run.meta.kind != "trace" or not run.has("buckets"):
        return False
    return bool((run.table("buckets")["device"] == "gpu").any())


def source_files(run: Run) -> tuple[list[Path], str]:
    """The run's trace files if all are present and unchanged, else ([], why)."""
    files = []
    for src in run.meta.sources:
        p = Path(src.path)
        if not p.is_file():
            return [], f"source trace {src.path} is no longer there"
        if src.sha256 and sha256_file(p) != src.sha256:
            return [], f"source trace {src.path} changed since ingest (sha256 differs)"
        files.append(p)
    return (files, "") if files else ([], "run records no source files")


def analyse(run: Run) -> tuple[HtaResult | None, str]:
    """Run HTA on the run's traces; (None, why) when it cannot."""
    if not available():
        return None, "HTA (traceinsight) is not installed: pip install 'calib[hta]'"
    files, why = source_files(run)
    if not files:
        return None, why
    from calib.core.hta import trace_analysis

    try:
        with trace_analysis(files, quiet=True) as ta:
            ranks = sorted(ta.t.traces)  # HTA's default is rank 0 only
            idle, _ = ta.get_idle_time_breakdown(ranks=ranks, visualize=False)
            launch = ta.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False)
    except Exception as exc:  # noqa: BLE001 - HTA's own failures become a note, not a crash
        return None, f"HTA could not analyse the trace ({type(exc).__name__}: {str(exc)[:120]})"
    idle = idle.rename(columns={"idle_time": "idle_time_us"})[
        ["rank", "stream", "idle_category", "idle_time_us"]
    ]
    frames = [
        df.rename(
            columns={
                "cpu_duration": "cpu_duration_us",
                "gpu_duration": "gpu_duration_us",
                "launch_delay": "launch_delay_us",
            }
        ).assign(rank=int(r))  # fmt: skip
        for r, df in launch.items()
    ]
    cols = ["rank", "cpu_duration_us", "gpu_duration_us", "launch_delay_us"]
    launch_df = pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)
    b = run.table("buckets")
    calib_idle = (
        b.groupby("rank")[["intra_op_s", "inter_op_s", "other_s"]].sum().mul(1e6)
        .rename(columns=lambda c: c.replace("_s", "_us")).reset_index()
    )  # fmt: skip
    return HtaResult(run.meta.name, idle, launch_df, calib_idle), ""


def launch_table(res: HtaResult) -> pd.DataFrame:
    """Per rank: HTA's launch statistics in a few numbers."""
    rows = []
    for r, d in res.launch.groupby("rank"):
        cpu, gpu, delay = (
            d[c].to_numpy(float) for c in ("cpu_duration_us", "gpu_duration_us", "launch_delay_us")
        )
        rows.append({
            "rank": int(r), "launches": len(d), "median launch µs": np.median(cpu), "median kernel µs": np.median(gpu),
            "kernels shorter than launch %": 100 * float(np.mean(gpu < cpu)),
            "median launch delay µs": np.median(delay), "p95 launch delay µs": np.percentile(delay, 95),
            f"launch > {RUNTIME_CUTOFF_US} µs": int((cpu > RUNTIME_CUTOFF_US).sum()),
            f"delay > {LAUNCH_DELAY_CUTOFF_US} µs": int((delay > LAUNCH_DELAY_CUTOFF_US).sum()),
        })  # fmt: skip
    return pd.DataFrame(rows)


def figure(res: HtaResult) -> S.Drawn:
    """Idle time: calib's device buckets beside HTA's per-stream categories; launch statistics."""
    fig, axes = S.new_figure(
        1, 3, figsize=(13.0, 4.2), gridspec_kw={"width_ratios": [1.4, 1, 1]}, squeeze=False
    )
    ax = axes[0, 0]
    labels: list[str] = []
    positions: list[float] = []
    rows = []
    x = 0.0
    for r in sorted(res.calib_idle["rank"]):
        c = res.calib_idle[res.calib_idle["rank"] == r].iloc[0]
        bottom = 0.0
        for col, bucket in (("intra_op_us", "intra_op"), ("inter_op_us", "inter_op"), ("other_us", "other")):
            ax.bar(x, c[col] / 1e3, bottom=bottom, color=S.color(bucket), width=0.7,
                   label=S.label(bucket) if r == res.calib_idle["rank"].min() else None)  # fmt: skip
            rows.append({"rank": r, "source": "calib (device)", "category": bucket, "idle_ms": c[col] / 1e3})
            bottom += c[col] / 1e3
        labels.append(f"r{r} calib")
        positions.append(x)
        x += 1
        idle = res.idle[res.idle["rank"] == r]
        tot = idle.groupby("stream")["idle_time_us"].sum().sort_values(ascending=False)
        for s in tot.index[:MAX_STREAMS]:
            bottom = 0.0
            for cat, (lab, colr) in S.HTA_IDLE.items():
                v = (
                    float(
                        idle.loc[(idle["stream"] == s) & (idle["idle_category"] == cat), "idle_time_us"].sum()
                    )
                    / 1e3
                )
                ax.bar(x, v, bottom=bottom, color=colr, width=0.7, hatch="..", edgecolor="white", linewidth=0.3,
                       label=lab if (r == res.calib_idle["rank"].min() and s == tot.index[0]) else None)  # fmt: skip
                rows.append({"rank": r, "source": f"HTA stream {s}", "category": cat, "idle_ms": v})
                bottom += v
            labels.append(f"r{r} HTA s{s}")
            positions.append(x)
            x += 1
        x += 0.5
    ax.set_xticks(positions, labels, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("idle time over the trace (ms)")
    ax.set_title("GPU idle: calib buckets (device) vs HTA (per stream, dotted)")
    handles, names = ax.get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=6, frameon=False, fontsize=8)
    d = res.launch
    ax = axes[0, 1]
    cpu = np.maximum(d["cpu_duration_us"].to_numpy(float), 0.5)
    gpu = np.maximum(d["gpu_duration_us"].to_numpy(float), 0.5)
    ax.scatter(cpu, gpu, s=5, alpha=0.4, color=S.color("kernel"), lw=0)
    if len(d):
        lim = [0.4, max(cpu.max(), gpu.max()) * 1.5]
        ax.plot(lim, lim, color="black", lw=0.8)
        ax.text(lim[1] / 1.6, lim[1] / 40, "kernel shorter\nthan its launch", fontsize=7, ha="right")
    ax.set_xscale("log")
    ax.set_yscale("log")
    S.plain_log_axis(ax.xaxis)
    S.plain_log_axis(ax.yaxis)
    ax.set_xlabel("CPU launch duration (µs)")
    ax.set_ylabel("GPU kernel duration (µs)")
    ax.set_title(f"HTA kernel launches ({len(d):,})")
    ax = axes[0, 2]
    delay = np.maximum(d["launch_delay_us"].to_numpy(float), 0.5)
    if len(delay):
        ax.hist(delay, bins=np.geomspace(0.5, max(delay.max(), 2.0) * 1.2, 40), color=S.color("intra_op"))
        ax.axvline(LAUNCH_DELAY_CUTOFF_US, color="black", ls=":", lw=0.8)
    ax.set_xscale("log")
    S.plain_log_axis(ax.xaxis)
    ax.set_xlabel("launch delay: launch end → kernel start (µs; 0 drawn at 0.5)")
    ax.set_ylabel("kernels")
    ax.set_title("HTA launch delay")
    fig.suptitle(f"{S.short(res.run, 60)}: HTA idle-time breakdown and kernel-launch statistics", fontsize=10)
    return S.Drawn(fig, pd.DataFrame(rows))
