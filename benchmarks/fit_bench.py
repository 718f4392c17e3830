"""Collective-curve fitting speed: calib's closed-form segment table against scipy's NNLS.

The piecewise alpha-beta fit (calibrate.collectives) needs the non-negative least-squares
solution and residual of every contiguous run of message sizes (m(m+1)/2 candidate
regimes) before dynamic programming picks the breakpoints.  calib solves all of them at
once from prefix sums; the peer is the obvious loop of ``scipy.optimize.nnls`` over the
candidates.  Both run on the real Polaris all-reduce times (setup 5, 8 nodes, 29 sizes)
and must agree; the script prints the time per full table and the ratio.

Run: ``python benchmarks/fit_bench.py [--repeat 20]``.  Also times one full ``calib fit``
of the shipped Polaris logs (ingest excluded).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from calib.calibrate.collectives import _segment_table, size_series
from calib.ingest.nccl_tests import ingest_nccl_tests
from scipy.optimize import nnls

from calib.core.collective_names import busbw_factor
from calib.core.rundir import write_run
from calib.core.store import run_dir

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "fixtures" / "nccl-tests"


def scipy_table(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    m = len(u)
    rss = np.full((m, m), np.nan)
    alpha = np.full((m, m), np.nan)
    for i in range(m):
        for j in range(i, m):
            A = np.c_[u[i : j + 1], v[i : j + 1]]
            x, r = nnls(A, np.ones(j - i + 1))
            rss[i, j], alpha[i, j] = r * r, x[0]
    return alpha, rss


def best_of(fn, repeat: int) -> float:
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    meta, tables = ingest_nccl_tests([LOGS], name="polaris", system="polaris")
    s = tables["samples"]
    ser = next(
        x for x in size_series(s[s["setup"] == 5], "bench") if x.collective == "allreduce" and x.n_nodes == 8
    )
    f = float(busbw_factor("allreduce", ser.n_gpus))
    u, v = 1.0 / ser.time_s, ser.bytes * f / ser.time_s
    w = np.ones_like(u)
    a_c, _, r_c, _ = _segment_table(u, v, w)
    a_s, r_s = scipy_table(u, v)
    upper = np.triu(np.ones_like(r_s, bool), 1)  # >= 2 points per regime
    assert np.allclose(r_c[upper], r_s[upper], rtol=1e-6, atol=1e-9), "closed form and NNLS disagree"
    t_calib = best_of(lambda: _segment_table(u, v, w), args.repeat)
    t_scipy = best_of(lambda: scipy_table(u, v), max(3, args.repeat // 5))
    n_seg = len(u) * (len(u) + 1) // 2
    print(f"segment table, {len(u)} sizes ({n_seg} candidate regimes), best of runs:")
    print(f"  calib prefix sums   {t_calib * 1e3:8.3f} ms")
    print(f"  scipy nnls loop     {t_scipy * 1e3:8.3f} ms")
    print(f"  ratio scipy/calib   {t_scipy / t_calib:8.1f}x")

    from calib.calibrate.fit import fit_system

    from calib.resolve import system_runs

    with tempfile.TemporaryDirectory() as tmp:
        write_run(run_dir(Path(tmp), "polaris", "polaris"), meta, tables)
        t_fit = best_of(lambda: fit_system(system_runs(Path(tmp), "polaris"), "polaris"), 3)
    print(f"full calib fit of the Polaris logs (6 curves + held-out refits + eff): {t_fit:.2f} s")


if __name__ == "__main__":
    main()
