"""The report's characterization sections: traced runs (with HTA beside calib's buckets)
and the system's calibration.  Each function returns a :class:`Section` of blocks.
"""

from __future__ import annotations

from calib.calibrate.calibration import Calibration
from calib.reports import fig_calibration, fig_runs, hta_panel
from calib.reports import style as S
from calib.reports.document import Figure, Section, Table, Text, key
from calib.reports.progress import progress

from calib.core.rundir import Run


def render_figure(k: str, title: str, caption: str, drawn: S.Drawn | None) -> Figure | None:
    if drawn is None:
        return None
    return Figure(k, title, caption, S.to_png(drawn.fig), drawn.data)


def runs_section(runs: list[Run], cal: Calibration | None) -> Section:
    trace_runs = [r for r in runs if r.meta.kind == "trace" and r.has("buckets")]
    blocks: list = []
    if not runs:
        return Section(
            "runs",
            "Traced runs",
            (Text("No runs were given (run directories, or a system with stored traces).", "missing"),),
        )
    blocks.append(Table("Runs", fig_runs.overview(runs),
                        "Shares are of wall time summed over every rank and iteration. comm counts communication "
                        "overlapped with compute first (seed 004); exposed comm is the part no compute kernel hides."))  # fmt: skip
    f = render_figure("runs-compute-dissection", "Compute dissection across runs",
                      "Compute time (kernel execution + intra-op + inter-op dispatch; 'other' host waits excluded, as in "
                      "seed 004 Fig. 10) per run, and seed 004's k1 (kernel share of compute) and k2 (GEMM + attention "
                      "share of kernel time) against the work per operator x = mean FLOPs per matmul, for runs recorded "
                      "with shapes. Small operators leave the device waiting on the host: k1 falls as x shrinks.",
                      fig_runs.compute_dissection(trace_runs, cal))  # fmt: skip
    if f:
        blocks.append(f)
    f = render_figure("runs-kernel-classes", "Kernel classes per run",
                      "Share of kernel execution time by kernel class (seed 004 Table 6 classes; rules in "
                      "ingest/rules.py), summed over ranks and iterations. CPU (gloo) runs count host compute "
                      "operators as kernels.", fig_runs.class_shares(trace_runs))  # fmt: skip
    if f:
        blocks.append(f)
    for run in progress(trace_runs, "report: runs", unit="run"):
        blocks.append(run_subsection(run))
    return Section("runs", "Traced runs", tuple(blocks))


def run_subsection(run: Run) -> Section:
    m = run.meta
    blocks: list = []
    fw = m.framework
    desc = (f"{len(m.ranks)} of {m.world_size or '?'} ranks traced, backend {m.backend or '?'}, devices "
            f"{', '.join(m.devices) or '-'}, framework {fw.name}"
            + (f" ZeRO-{fw.zero_stage}" if fw.zero_stage is not None else "")
            + (" (stated)" if fw.stated else (f" (detected from: {'; '.join(fw.detected_from)})" if fw.detected_from else "")))  # fmt: skip
    blocks.append(Text(desc))
    for note in m.notes:
        blocks.append(Text(note, "note"))
    drawn = fig_runs.bucket_bars(run)
    averaged = bool((drawn.data["iteration"] == -1).all()) and len(run.table("buckets")) > fig_runs.MAX_BARS
    blocks.append(render_figure(
        key("run", m.name, "buckets"), f"{m.name}: time buckets per rank and iteration",
        "Each bar is one iteration (ProfilerStep window) of one rank and sums to its wall time: communication "
        "(exposed, then overlapped with compute, hatched), compute kernels, memcpy/memset, intra-op dispatch "
        "(device idle inside a host operator), inter-op dispatch (idle between operators) and other host waits "
        "(synchronisation, data loading)." + (" Iterations are averaged per rank (many bars)." if averaged else ""),
        drawn))  # fmt: skip
    t6 = fig_runs.table6(run)
    if not t6.empty:
        blocks.append(Table("Largest kernel classes and intra-op operators (seed 004 Table 6)", t6,
                            "time % is of kernel time (kernel rows) or of intra-op dispatch time (intra-op rows)."))  # fmt: skip
    tk = fig_runs.top_kernels(run)
    if not tk.empty:
        blocks.append(
            Table(
                "Kernels with the most device time",
                tk.rename(columns={"total_s": "total s", "mean_us": "mean µs"}),
            )
        )
    cs = fig_runs.collective_summary(run)
    if not cs.empty:
        blocks.append(Table("Collectives (bytes in nccl-tests size; busbw with nccl-tests bus factors, median)",
                            cs.rename(columns={"mean_s": "mean s", "total_s": "total s", "busbw_gbps": "busbw GB/s"})))  # fmt: skip
    if hta_panel.is_gpu_run(run):
        blocks += hta_blocks(run)
    return Section(key("run", m.name), f"Run {m.name}", tuple(b for b in blocks if b is not None), level=3)


def hta_blocks(run: Run) -> list:
    res, why = hta_panel.analyse(run)
    if res is None:
        return [Text(f"HTA idle-time and launch panel: {why}", "missing")]
    return [
        render_figure(
            key("run", run.meta.name, "hta"),
            f"{run.meta.name}: HTA beside calib",
            "Left: GPU idle time over the whole trace -- calib's device-level buckets (intra-op, inter-op, "
            "other) beside HTA's per-stream idle categories (host wait ~ dispatch, kernel wait = gaps under "
            "30 µs between kernels, other). HTA counts each stream from its first to its last kernel and drops "
            "the last iteration; calib counts the device over the ProfilerStep windows, so compare the split "
            "(waiting on the host vs other), not the totals. Middle: each kernel's CPU launch "
            "time against its GPU duration (below the diagonal: the launch costs more than the kernel, "
            "launch-bound). Right: delay from the end of the launch call to the kernel's start.",
            hta_panel.figure(res),
        ),  # fmt: skip
        Table("HTA kernel-launch statistics", hta_panel.launch_table(res)),
    ]


def calibration_section(cal: Calibration | None, series: tuple, path, model_gpus: tuple[int, ...]) -> Section:
    if cal is None:
        return Section(
            "calibration",
            "Calibration",
            (Text("No calibration: fit the system first, or give a calibration file.", "missing"),),
        )
    blocks: list = [Text(f"System {cal.system}: {cal.gpus_per_node} GPUs per node, device {cal.device or 'unknown'}, "
                         f"peak {cal.peak_tflops or '-'} TFLOP/s (GEMM-efficiency denominator); file {path}.")]  # fmt: skip
    prov = cal.provenance or {}
    if prov:
        runs = ", ".join(r.get("name", "?") for r in prov.get("runs", []))
        blocks.append(Text(f"Fitted from runs: {runs or '-'}; samples used: {prov.get('samples_used', '-')}; "
                           f"network source: {prov.get('network_source', '-')}; where: {prov.get('where') or '-'}."))  # fmt: skip
    f = render_figure("calibration-busbw", "Collective bus bandwidth against message size",
                      "Points: measured (median over repetitions of every nccl-tests line the fit used). Solid lines: "
                      "the fitted piecewise alpha-beta curve per scale (one regime per NCCL protocol/algorithm range). "
                      "Dashed: the calibrated model at a larger job (latency grows per ring step, NIC bandwidth stays).",
                      fig_calibration.busbw(cal, series, model_gpus))  # fmt: skip
    if f:
        blocks.append(f)
    elif cal.collectives:
        blocks.append(Text("no collective curves to draw", "missing"))
    f = render_figure("calibration-eff", "Network efficiency eff g→n against GPUs",
                      "eff g→n = large-message bus bandwidth at n GPUs over that at the base scale g (seed 004). Points: "
                      "measured scales; line: the fitted form, extrapolated beyond the dotted line; band: ±1σ of the "
                      "fitted per-step latency λ.", fig_calibration.eff(cal, max(model_gpus + (2160,))))  # fmt: skip
    if f:
        blocks.append(f)
    else:
        blocks.append(
            Text(
                "eff g→n: the calibration has no network scaling (needs nccl-tests logs at >= 2 node counts).",
                "missing",
            )
        )
    blocks.append(Table("Parameters", fig_calibration.parameter_table(cal),
                        "status: fitted (from data, ± one standard error), default (no data: a stated assumption), "
                        "unidentifiable (data present but cannot determine it), fixed (by the model form)."))  # fmt: skip
    for note in cal.notes:
        blocks.append(Text(note, "note"))
    return Section("calibration", f"Calibration: {cal.system}", tuple(blocks))
