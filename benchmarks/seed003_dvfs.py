"""Seed 003's DVFS table on an A30 (one decoder layer, 8 sequences, FP16, datasheet power):
calib's energy-optimal SM clock, energy saving and slowdown against the top clock and against
the fastest Pareto-optimal clock, beside the seed's 'energy saving / runtime penalty' table.

Two clock models of the compute-bound time (analytic/energy.py ``busy_at``):
  serial   -- t_c / s: every compute-bound second scales with the SM clock (calib before issue 15's
              second pass; ``compute_eff`` = 1);
  roofline -- max(e t_c / s, t_c): a GEMM at efficiency e < 1 of peak at f_max is held by a floor
              the SM clock does not move (HBM clock fixed at 1215 MHz in seed 003) down to s = e
              (seed 003 deviation 4, 'Perf(f) saturates (wasted watts at high clocks)').

Run:  python benchmarks/seed003_dvfs.py   (about 2 s)
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from calib.analytic.energy import energy_columns, load_power, work_of
from calib.analytic.machine import build_system
from calib.analytic.specs import ModelSpec, load_hardware
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import evaluate

LAYERS = {"GPT-125M": (768, 12, 3072), "GPT-1.3B": (2048, 16, 8192), "GPT-13B": (5120, 40, 20480),
          "GPT-175B": (12288, 96, 49152)}  # fmt: skip
#: seed 003 'Practitioner takeaway' table: (energy saving %, runtime penalty %) of the lowest
#: Pareto-optimal energy against the fastest Pareto-optimal runtime; rows legible in the seed text
SEED = {("GPT-125M", 512): (30.8, 23.9), ("GPT-125M", 1024): (28.1, 18.3), ("GPT-1.3B", 128): (24.5, 27.4),
        ("GPT-1.3B", 512): (20.5, 14.8), ("GPT-13B", 512): (10.8, 12.7), ("GPT-13B", 1024): (11.8, 11.3),
        ("GPT-175B", 128): (13.5, 11.3), ("GPT-175B", 512): (9.0, 15.5), ("GPT-175B", 1024): (19.9, 30.7)}  # fmt: skip


def rows() -> list[dict]:
    hw = load_hardware("a30")
    system, _ = build_system(None, hw)
    power = load_power(hw, "fp16")
    out = []
    for name, (d, a, f) in LAYERS.items():
        for s in (128, 512, 1024):
            m = ModelSpec(name, d, 1, a, s, 1, ffn=f)
            st = Strategies.of(tp=1, pp=1, dp=1, micro_batch=8, global_batch=8)
            w = work_of(m, system, st, evaluate(m, system, st))
            row = {"layer": name, "s": s, "gemm_eff": float(np.ravel(w.compute_eff)[0])}
            for model, ww in (("serial", replace(w, compute_eff=1.0)), ("roofline", w)):
                c = {
                    k: float(np.ravel(v)[0])
                    for k, v in energy_columns(power, ww, np.array(1), 8.0 * s).items()
                }
                row.update({f"{model}_opt_mhz": c["f_opt_mhz"], f"{model}_fastest_mhz": c["f_fastest_mhz"],
                            f"{model}_saving_pct": 100 * c["energy_saving_opt"],
                            f"{model}_slowdown_pct": 100 * c["slowdown_opt"],
                            f"{model}_saving_vs_fastest_pct": 100 * c["energy_saving_vs_fastest"],
                            f"{model}_w": c["power_w_per_gpu"]})  # fmt: skip
            row["seed_saving_pct"], row["seed_penalty_pct"] = SEED.get((name, s), (np.nan, np.nan))
            out.append(row)
    return out


def main() -> None:
    print("layer      s    e   | serial: opt MHz save% slow%  | roofline: fastest MHz opt MHz save% slow% "
          "save-vs-fastest% | seed save% penalty%")  # fmt: skip
    for r in rows():
        print(f"{r['layer']:9s} {r['s']:5d} {r['gemm_eff']:.2f} | {r['serial_opt_mhz']:5.0f} {r['serial_saving_pct']:5.1f} "
              f"{r['serial_slowdown_pct']:5.1f} | {r['roofline_fastest_mhz']:5.0f} {r['roofline_opt_mhz']:5.0f} "
              f"{r['roofline_saving_pct']:5.1f} {r['roofline_slowdown_pct']:5.1f} {r['roofline_saving_vs_fastest_pct']:5.1f} | "
              f"{r['seed_saving_pct']:5.1f} {r['seed_penalty_pct']:5.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
