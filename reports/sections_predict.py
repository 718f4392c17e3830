"""The report's prediction sections: ZeRO scaling, memory, communication maps, the top
strategies of a search, and validation against published measurements."""

from __future__ import annotations

import pandas as pd
from calib.reports import fig_scaling, fig_strategy
from calib.reports.document import Section, Table, Text, key
from calib.reports.predictions import Predictions
from calib.reports.sections import render_figure


def scaling_section(p: Predictions) -> Section | None:
    t = p.scaling
    if t is None or t.empty:
        return None
    sp = p.scaling_spec
    blocks: list = [Text(f"Machine: {p.machine}. Weak scaling as in seed 004: one micro-batch of {sp.micro_batch} "
                         f"sequence(s) per GPU per iteration, so the global batch grows with the GPUs; communication "
                         f"is not overlapped with compute (seed 004's convention). Speedup = tokens/s at n over tokens/s "
                         f"at {min(sp.gpus)} GPUs.")]  # fmt: skip
    for z in sorted(t["zero"].unique()):
        what = {1: "all-reduce of gradients + all-gather of updated parameters",
                2: "reduce-scatter (DeepSpeed: reduces) per micro-batch + all-gather",
                3: "all-gather in forward and backward + reduce-scatter per micro-batch"}.get(int(z), "all-reduce")  # fmt: skip
        blocks.append(render_figure(
            f"predict-zero{int(z)}", f"ZeRO-{int(z)} scaling: compute and communication per iteration",
            f"Predicted time per iteration per GPU count, stacked: kernel execution, other kernels, intra-/inter-op "
            f"dispatch, optimizer step and the exposed ZeRO-{int(z)} communication ({what}); black line: speedup "
            f"(right axis, log scale), dotted: ideal. Hatched bars marked OOM do not fit in device memory "
            f"(seed 004 Fig. 12-14 style).", fig_scaling.zero_bars(t, int(z))))  # fmt: skip
    blocks.append(render_figure("predict-efficiency", "Scaling efficiency per model and ZeRO stage",
                                "Speedup × (smallest GPU count / n), in %; circled points do not fit in memory.",
                                fig_scaling.efficiency(t)))  # fmt: skip
    blocks.append(render_figure(
        "predict-memory", "Memory per GPU against HBM",
        f"Bars: memory per GPU at {int(t['gpus'].min())} GPUs by part (mixed-precision Adam: 16 bytes per parameter "
        f"sharded per ZeRO stage; activations per Korthikanti et al.; a 2 GB runtime reserve). Diamonds: total at "
        f"{int(t['gpus'].max())} GPUs. Dashed: the device's HBM; above it the configuration runs out of memory.",
        fig_scaling.memory(t, p.hbm_gb)))  # fmt: skip
    blocks.append(Table("Scaling summary", fig_scaling.scaling_summary(t),
                        "comm % is the exposed communication share of the iteration at the largest GPU count."))  # fmt: skip
    return Section("scaling", "Predicted ZeRO-1/2/3 scaling", tuple(b for b in blocks if b is not None))


def strategy_section(p: Predictions) -> Section | None:
    blocks: list = []
    if p.maps is not None:
        sp = p.maps.spec
        blocks.append(render_figure(
            "predict-comm-maps", f"TP × DP and TP × PP communication maps ({sp.model})",
            "Exposed communication per iteration (colour, log scale; text: seconds and share of the iteration) for "
            "each layout. Left: TP × DP with PP = 1, one micro-batch per data-parallel rank, so the GPU count grows "
            "along both axes. Right: a fixed GPU count split into TP × PP with DP = GPUs/(TP·PP) and a fixed global "
            "batch. Grey: invalid layout (TP must divide the heads, PP the layers, DP the batch); hatched: out of "
            "memory; orange box: the fastest iteration among layouts that fit. TP groups larger than a node cross "
            "the inter-node network (seed 004: keep TP within a node).", fig_strategy.comm_maps(p.maps)))  # fmt: skip
    if p.search is not None:
        s = p.search
        blocks.append(render_figure(
            "predict-search", f"Top strategies: {s.spec.model} on {s.spec.gpus} GPUs",
            f"Every valid strategy (TP, PP, DP, micro-batch, interleaving, ZeRO stage, recompute, sequence "
            f"parallelism, DP overlap) ranked by predicted iteration time; {s.n_strategies:,} evaluated in "
            f"{s.seconds:.2f} s, {s.n_feasible:,} fit in memory. Bars split the iteration into compute, TP, PP, "
            f"exposed DP/ZeRO communication, pipeline bubble and optimizer step.", fig_strategy.search_bars(s)))  # fmt: skip
        if not s.top.empty:
            cols = {"rank": "#", "tp": "TP", "pp": "PP", "dp": "DP", "micro_batch": "mb", "interleave": "v", "zero": "ZeRO",
                    "recompute": "recompute", "seq_parallel": "SP", "dp_overlap": "overlap", "iter_s": "iter s",
                    "tokens_per_s": "tokens/s", "tflops_per_gpu": "TFLOP/s/GPU", "mfu": "MFU",
                    "mem_total_gb": "mem GB/GPU"}  # fmt: skip
            view = s.top[list(cols)].rename(columns=cols)
            if "iter_s_lo" in s.top:  # the device model's 90 % prediction interval
                band = (
                    s.top["iter_s_lo"].map("{:.4g}".format) + ".." + s.top["iter_s_hi"].map("{:.4g}".format)
                )
                view.insert(view.columns.get_loc("iter s") + 1, "90% interval s", band.to_numpy())
            view["MFU"] = view["MFU"] * 100
            blocks.append(Table("Ranked strategies", view.rename(columns={"MFU": "MFU %"})))
    if not blocks:
        return None
    return Section("strategies", "Parallel strategies", tuple(b for b in blocks if b is not None))


def validation_section(p: Predictions) -> Section | None:
    if not p.validations:
        return None
    blocks: list = [Text("Predicted against measured on published tables. The model's compute efficiency is fitted "
                         "on the stated calibration rows only (or leave-one-out) and errors are reported on the "
                         "held-out rows; each table's own hardware preset is used, independent of the calibrated "
                         "system above.")]  # fmt: skip
    rows = []
    for v in p.validations:
        blocks.append(render_figure(key("validate", v.format), f"Predicted vs measured: {v.format}",
                                    f"{v.path}; {v.split}. Filled: held-out rows; hollow/grey: rows the efficiency "
                                    f"was fitted on (seed 004 Fig. 15 style).", fig_strategy.validation(v)))  # fmt: skip
        s = v.summary
        rows.append({"table": v.format, "split": v.split, "held-out rows": s["n_heldout"],
                     "median |err| %": s["median_abs_pct"], "mean |err| %": s["mean_abs_pct"],
                     "max |err| %": s["max_abs_pct"]})  # fmt: skip
    blocks.append(Table("Held-out error", pd.DataFrame(rows)))
    return Section("validation", "Predicted vs measured", tuple(b for b in blocks if b is not None))
