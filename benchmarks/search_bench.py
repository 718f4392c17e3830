"""Strategy-search throughput: calib's vectorised search against two peers.

Workloads (GPT-3 175B, global batch 1536, DGX A100 80GB spec with stated defaults):
  1. every valid strategy on 4096 GPUs (the Calculon study-2 problem);
  2. a system-size sweep, every GPU count 8..4096 in steps of 8 (Calculon study 3).
With today's axes (DGX H100 spec, stated defaults):
  3. dense Llama 3 70B (s 8192, B 2048): sweep 64..8192 step 64 with CP 1/2/4/8,
     schedules 1F1B/interleaved, ZB-H1, DualPipe, FP8 and the distributed optimizer;
  4. MoE Mixtral 8x7B (s 4096, B 1024): sweep 64..4096 step 64 with EP 1/2/4/8, CP 1/2/4,
     the three schedules, FP8 and the distributed optimizer.

Peers:
  * a plain per-strategy Python loop over the *same* model (analytic.timemodel.evaluate
    called with one strategy at a time), run here on a sample of workload 1, whose
    results must equal the vectorised ones;
  * Calculon: about 400 strategies/s per core -- quoted from issue 4 / seed 000
    (Calculon evaluates the 1,974,902 strategies of GPT-3 175B on 4096 GPUs in hours),
    NOT measured here.

Run:  python benchmarks/search_bench.py [--repeat 5] [--loop-sample 2000]
      [--calibration FILE --hardware dgx-h100]   (e.g. the H100 device model of docs/calibrate.md)
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
from calib.analytic.machine import default_calibration
from calib.analytic.search import OPTION_AXES, layouts, option_mask, options, search
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, evaluate

CPU_RATES: list[float] = []  # strategies per CPU-second of each timed_search (load-independent)
CALCULON_PER_CORE = 400.0  # strategies/s/core, quoted (issue 4, seed 000), not measured


def valid_strategies(model, gpus, B, space=None):
    """The valid strategies of the search grid as 1-D arrays (for the per-strategy loop)."""
    from calib.analytic.search import Space

    space = space or Space()
    lay = layouts(model, gpus, B, space)
    opt = options(space)
    grid = (lay["tp"].size, *(opt[k].size for k in OPTION_AXES))
    idx = np.nonzero(np.broadcast_to(option_mask(lay, opt), grid))
    cols = {k: v[idx[0]] for k, v in lay.items()}
    cols.update({k: opt[k].ravel()[idx[a]] for a, k in enumerate(OPTION_AXES, start=1)})
    return cols


def timed_search(model, system, gpus, B, repeat, space=None):
    from calib.analytic.search import Space

    runs, cpu = [], []
    for _ in range(repeat):
        c0 = time.process_time()
        runs.append(search(model, system, gpus, B, space or Space(), top=10))
        cpu.append(runs[-1].n_strategies / max(time.process_time() - c0, 1e-9))
    rates = [r.rate for r in runs]
    CPU_RATES.append(statistics.median(cpu))
    return runs[0], statistics.median(rates), max(rates)


def loop_peer(model, system, B, cols, sample):
    """Evaluate ``sample`` strategies one at a time (same model); check against vectorised."""
    n = min(sample, cols["tp"].size)
    pick = np.linspace(0, cols["tp"].size - 1, n).astype(int)
    sub = {k: v[pick] for k, v in cols.items()}
    vec = evaluate(model, system, Strategies.of(**sub, global_batch=B), lean=True)["iter_s"]
    out = np.empty(n)
    t0 = time.perf_counter()
    for i in range(n):  # the peer: one strategy per call
        st = Strategies.of(**{k: v[i : i + 1] for k, v in sub.items()}, global_batch=B)
        out[i] = evaluate(model, system, st, lean=True)["iter_s"][0]
    secs = time.perf_counter() - t0
    return n / secs, float(np.max(np.abs(out / vec - 1.0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--loop-sample", type=int, default=2000)
    ap.add_argument(
        "--calibration",
        metavar="FILE",
        help="a fitted calibration (e.g. one with a GPU device model) instead of stated defaults",
    )
    ap.add_argument("--hardware", default="dgx-a100-80gb", help="hardware preset (default dgx-a100-80gb)")
    args = ap.parse_args()

    model = load_model("gpt3-175b")
    hw = load_hardware(args.hardware)
    if args.calibration:
        from calib.analytic.machine import build_system
        from calib.calibrate.calibration import Calibration

        system, _ = build_system(Calibration.load(args.calibration), hw)
        print(f"calibration {args.calibration} (device model: {system.cal.device_model is not None})")
    else:
        system = System(default_calibration(hw), hw)
    B = 1536
    cores = os.cpu_count() or 1
    print(
        f"machine: {cores} CPU cores; numpy {np.__version__}; model {model.name}, B={B}, hardware {hw.name}"
    )

    res1, med1, best1 = timed_search(model, system, 4096, B, args.repeat)
    print(f"[1] 4096 GPUs: {res1.n_strategies:,} valid strategies ({res1.n_feasible:,} fit), "
          f"{res1.n_strategies / med1:.3f} s, median {med1:,.0f} strategies/s (best {best1:,.0f})")  # fmt: skip
    sweep = list(range(8, 4097, 8))
    res2, med2, best2 = timed_search(model, system, sweep, B, max(1, args.repeat // 2))
    print(f"[2] sweep 8..4096 step 8 ({len(sweep)} GPU counts): {res2.n_strategies:,} valid strategies "
          f"({res2.n_feasible:,} fit), {res2.n_strategies / med2:.3f} s, median {med2:,.0f} strategies/s (best {best2:,.0f})")  # fmt: skip

    cols = valid_strategies(model, [4096], B)
    loop_rate, max_diff = loop_peer(model, system, B, cols, args.loop_sample)
    print(f"peer: per-strategy Python loop, same model, {min(args.loop_sample, cols['tp'].size):,} strategies of [1]: "
          f"{loop_rate:,.0f} strategies/s (max |loop/vectorised - 1| = {max_diff:.1e})")  # fmt: skip
    calculon = CALCULON_PER_CORE * cores
    print(f"peer: Calculon ~{CALCULON_PER_CORE:.0f} strategies/s/core x {cores} cores = {calculon:,.0f} strategies/s "
          "(quoted from issue 4 / seed 000, not measured here)")  # fmt: skip
    modern_cases(max(1, args.repeat // 2))
    seed_cases(model, system, B, sweep, max(1, args.repeat // 2), med2)
    for name, rate in (("[1] 4096 GPUs", med1), ("[2] sweep", med2)):
        print(
            f"ratio {name}: {rate / loop_rate:,.0f}x the per-strategy loop, {rate / calculon:,.0f}x Calculon (quoted)"
        )
    full = 1_974_902
    print(
        f"at the sweep rate, Calculon's 1,974,902-strategy problem size would take {full / med2:.2f} s here "
        f"(Calculon, quoted rate: {full / calculon / 3600:.2f} h on {cores} cores)"
    )


def modern_cases(repeat: int) -> None:
    """Workloads 3 and 4: the search with CP, EP, schedules, FP8 and the distributed optimizer."""
    from dataclasses import replace

    from calib.analytic.search import Space

    hw = load_hardware("dgx-h100")
    system = System(default_calibration(hw), hw)
    cases = (
        ("[3] dense llama3-70b, CP/schedules/FP8", load_model("llama3-70b"), 2048, range(64, 8193, 64),
         Space(cp=(1, 2, 4, 8), schedules=(0, 1, 2), fp8=True, dist_opt=True, flash_attention=True)),
        ("[4] MoE mixtral-8x7b s=4096, EP/CP/schedules/FP8", replace(load_model("mixtral-8x7b"), seq_len=4096),
         1024, range(64, 4097, 64),
         Space(cp=(1, 2, 4), schedules=(0, 1, 2), fp8=True, dist_opt=True, flash_attention=True)),
    )  # fmt: skip
    for name, model, B, counts, space in cases:
        res, med, best = timed_search(model, system, list(counts), B, repeat, space)
        print(f"{name}: {len(counts)} GPU counts, {res.n_strategies:,} valid strategies ({res.n_feasible:,} fit), "
              f"{res.n_strategies / med:.3f} s, median {med:,.0f} strategies/s (best {best:,.0f}); "
              f"{CPU_RATES[-1]:,.0f} per CPU-second")  # fmt: skip
        row = res.best_per_gpus.iloc[-1]
        print(f"    best at {int(row['gpus'])} GPUs: TP {row['tp']} CP {row['cp']} EP {row['ep']} PP {row['pp']} "
              f"DP {row['dp']} schedule {row['schedule']} iter {row['iter_s']:.3f} s, MFU {row['mfu']:.1%}, "
              f"{row['mem_total_gb']:.1f} GB")  # fmt: skip


def seed_cases(model, system, B, sweep, repeat, plain_rate) -> None:
    """Workloads 5 and 6 (seed 002): the sweep of [2] with the placement axis over the whole grid
    (NVLink domains of 8 and 72), and with 2D TP grids (tp_c 1, 2, 4, 8) on top."""
    from calib.analytic.search import Space

    cases = (
        ("[5] sweep + placement, NVL 8", Space(nvlink_domain=8)),
        ("[5] sweep + placement, NVL 72", Space(nvlink_domain=72)),
        ("[6] sweep + placement NVL 8 + 2D TP cols 1/2/4/8", Space(nvlink_domain=8, tp_c=(1, 2, 4, 8))),
    )
    for name, space in cases:
        res, med, best = timed_search(model, system, sweep, B, repeat, space)
        print(f"{name}: {res.n_strategies:,} valid strategies ({res.n_feasible:,} fit), "
              f"{res.n_strategies / med:.3f} s, median {med:,.0f} strategies/s (best {best:,.0f}; "
              f"{med / plain_rate:.2f}x the plain sweep's rate); {CPU_RATES[-1]:,.0f} per CPU-second")  # fmt: skip


if __name__ == "__main__":
    main()
