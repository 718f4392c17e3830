"""Panels for the seed experiments: energy against time under DVFS (seed 003), placement of
parallel groups on NVLink domains (seed 002), offload memory against HBM (seed 001).

Each figure function takes the numbers it draws and returns a :class:`~calib.reports.style.Drawn`;
:func:`seeds_section` computes them with the analytic stage (stated-default machines, every
assumption in docs/seeds.md) and returns one report section.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.reports import style as S
from calib.reports.document import Section, Text

DIM_COLOURS = {"tp": "#0072B2", "dp": "#E69F00", "pp": "#009E73", "cp": "#CC79A7", "ep": "#D55E00"}


def dvfs_figure(curves: pd.DataFrame) -> S.Drawn:
    """Energy against SM clock and against time, one line per configuration (column ``label``)."""
    fig, (a1, a2) = S.new_figure(1, 2, figsize=(10, 3.8))
    for label, c in curves.groupby("label", sort=False):
        e = c["energy_j"] / c["energy_j"].iloc[-1]
        t = c["time_s"] / c["time_s"].iloc[-1]
        (line,) = a1.plot(c["f_mhz"], e, label=label)
        k = int(np.argmin(e.to_numpy()))
        a1.plot(c["f_mhz"].iloc[k], e.iloc[k], "o", color=line.get_color())
        a2.plot(t, e, color=line.get_color())
        a2.plot(t.iloc[k], e.iloc[k], "o", color=line.get_color())
    a1.set_xlabel("SM clock (MHz)")
    a1.set_ylabel("energy / energy at top clock")
    a1.set_title("energy to completion against clock (dot: optimum)")
    a1.legend(fontsize=7)
    a2.set_xlabel("time / time at top clock")
    a2.set_title("DVFS trade-off: energy against time")
    return S.Drawn(fig, curves)


def placement_figure(
    sizes: dict[str, int], orders: list[tuple[str, ...]], domain: int, comm: pd.DataFrame
) -> S.Drawn:
    """Rank maps of two NVLink domains per placement (cell: which group's members share it), and
    communication seconds per placement and domain size (``comm``: order, domain, comm_s)."""
    from calib.analytic.placement import placement_map

    fig, axes = S.new_figure(1, len(orders) + 1, figsize=(3.6 * (len(orders) + 1), 3.4))
    for ax, order in zip(axes[:-1], orders):
        mp = placement_map(sizes, order, domain)
        ax.imshow(mp["dp"] % 8, cmap="tab10", vmin=0, vmax=9, aspect="auto")
        for (i, j), _ in np.ndenumerate(mp["dp"]):
            ax.text(j, i, f"t{mp['tp'][i, j]}\nd{mp['dp'][i, j]}", ha="center", va="center", fontsize=6.5)
        ax.set_yticks(range(mp["dp"].shape[0]), [f"domain {k}" for k in range(mp["dp"].shape[0])])
        ax.set_xticks([])
        inner = [d for d in order if sizes.get(d, 1) > 1]
        ax.set_title(
            "ranks by " + ">".join(inner) + f", NVL{domain}\n(t: TP rank, d: DP rank; colour: DP rank)",
            fontsize=8,
        )
    ax = axes[-1]
    for order, c in comm.groupby("order", sort=False):
        ax.plot(c["domain"], c["comm_s"], "o-", label=order)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("NVLink domain (GPUs)")
    ax.set_ylabel("communication s / iteration")
    ax.set_title("placement and domain size")
    ax.legend(fontsize=7)
    return S.Drawn(fig, comm)


def offload_figure(family: pd.DataFrame, bandwidth: pd.DataFrame) -> S.Drawn:
    """HBM used and offload memory per GPU for the best strategy of each model (seed 001), and
    relative efficiency against offload bandwidth."""
    fig, (a1, a2) = S.new_figure(1, 2, figsize=(10, 3.8))
    lab = family["model"] + "\n" + family["gpus"].astype(str)
    x = np.arange(len(family))
    a1.bar(x - 0.2, family["hbm_gb"], 0.4, color="#0072B2", label="HBM used (GB)")
    a1.bar(x + 0.2, family["offload_gib"], 0.4, color="#E69F00", label="offload (GiB)")
    a1.set_yscale("log")
    a1.set_xticks(x, lab, fontsize=7)
    a1.axhline(1024, color="#666666", ls=":", lw=1)
    a1.text(0, 1100, "1 TiB (seed 001)", fontsize=7, color="#444444")
    a1.set_ylabel("per GPU")
    a1.set_title("offload memory against HBM, best strategy")
    a1.legend(fontsize=7)
    a2.plot(bandwidth["gbps"], bandwidth["relative_efficiency"], "o-", color="#D55E00")
    a2.axvline(100, color="#666666", ls=":", lw=1)
    a2.set_xscale("log", base=2)
    a2.set_xlabel("offload bandwidth per direction (GB/s)")
    a2.set_ylabel("efficiency / infinite bandwidth")
    a2.set_title("96T on 16384 GPUs")
    data = pd.concat([family.assign(panel="family"), bandwidth.assign(panel="bandwidth")], ignore_index=True)
    return S.Drawn(fig, data)


def dvfs_data() -> pd.DataFrame:
    """Seed 003's layers on an A30 (1 layer, 8 sequences), DVFS curves from the energy model."""
    from calib.analytic.energy import dvfs_curve, load_power, work_of
    from calib.analytic.machine import build_system
    from calib.analytic.specs import ModelSpec, load_hardware
    from calib.analytic.strategy import Strategies
    from calib.analytic.timemodel import evaluate

    hw = load_hardware("a30")
    system, _ = build_system(None, hw)
    power = load_power(hw, "fp16")
    out = []
    for name, d, a, f, s in (("GPT-350M", 1024, 16, 4096, 128), ("GPT-350M", 1024, 16, 4096, 8192),
                             ("GPT-13B", 5120, 40, 20480, 1024)):  # fmt: skip
        m = ModelSpec(name, d, 1, a, s, 1, ffn=f)
        st = Strategies.of(tp=1, pp=1, dp=1, micro_batch=8, global_batch=8)
        w = work_of(m, system, st, evaluate(m, system, st))
        out.append(pd.DataFrame(dvfs_curve(power, w)).assign(label=f"{name} layer, s={s}"))
    return pd.concat(out, ignore_index=True)


def placement_data(domain_sizes=(4, 8, 72)) -> tuple[dict, list, pd.DataFrame]:
    """GPT3-1T on B200, TP 2 x PP 8 x DP 1024, batch 4096: communication per placement and domain."""
    from calib.analytic.placement import comm_seconds
    from calib.analytic.specs import ModelSpec, load_hardware
    from calib.analytic.timemodel import stage_params

    hw = load_hardware("b200")
    model = ModelSpec("gpt3-1t", 25600, 128, 160, 2048, 51200)
    sizes = {"tp": 2, "pp": 8, "dp": 1024}
    P = float(stage_params(25600, 128, 2048, 51200, 2, 8))
    orders = [("tp", "dp", "pp", "cp", "ep"), ("dp", "tp", "pp", "cp", "ep")]
    rows = [{"order": ">".join(o[:3]), "domain": n, "comm_s": sum(comm_seconds(model, sizes, o, n, hw, 1, 4, P).values())}
            for o in orders for n in domain_sizes]  # fmt: skip
    return sizes, orders, pd.DataFrame(rows)


def seeds_section(offload: dict | None = None) -> Section:
    """The three panels; ``offload``: the JSON of benchmarks/seed001_offload.py (omitted: not shown)."""
    from calib.reports.sections import render_figure

    blocks: list = [
        render_figure(
            "seed003-dvfs",
            "Energy against time under DVFS (seed 003)",
            "Energy to completion of one decoder layer on an A30 against the SM clock (210-1440 MHz, "
            "15 MHz steps) from calib's energy model with datasheet power (status default); dots: "
            "the energy-optimal clock.  Longer sequences move the optimum down (seed 003 obs. 3).",
            dvfs_figure(dvfs_data()),
        ),  # fmt: skip
    ]
    sizes, orders, comm = placement_data()
    blocks.append(render_figure("seed002-placement", "Placement on NVLink domains (seed 002)",
                                "GPT3-1T on B200, TP 2 x PP 8 x DP 1024: Megatron's TP-innermost placement "
                                "against DP-innermost, on NVLink domains of 4, 8 and 72 GPUs.",
                                placement_figure(sizes, orders, 8, comm)))  # fmt: skip
    if offload:
        blocks.append(render_figure("seed001-offload", "Offload memory against HBM (seed 001)",
                                    "Best strategy per model of seed 001's Table II with offload at 100 GB/s per "
                                    "direction (benchmarks/seed001_offload.py; assumptions in docs/seeds.md).",
                                    offload_figure(pd.DataFrame(offload["family"]), pd.DataFrame(offload["bandwidth"]))))  # fmt: skip
    else:
        blocks.append(
            Text("Offload panel: no results of benchmarks/seed001_offload.py were given.", "missing")
        )
    return Section(
        "seeds", "Seed experiments: energy, placement, offload", tuple(b for b in blocks if b is not None)
    )
