"""How much a table's held-out error depends on which rows were calibrated on.

Every published table in fixtures/published is validated with ten random thirds as
calibration rows (``calib validate TABLE --holdout 0.67 --seed 0..9``, the default fit) and
the held-out median |error| of each split is printed, with the median and the worst over
the seeds and how many splits exceed 10 % (the issue's aim for tables calib has never
seen).  The every-third split that docs/analytic.md reports is one of many; this shows the
spread around it.  Peer: the same splits with ``--fit compute`` (the network as stated)
when ``--peer`` is given.

Run:  python benchmarks/validation_splits.py [--seeds 10] [--peer] [TABLE ...]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from calib.analytic.validate import validate
from calib.analytic.vtable import read_table

PUB = Path(__file__).parents[1] / "fixtures" / "published"
#: specs, not measured tables; DeepSeek-V3 is one row (nothing to split)
SKIP = {"hardware_accelerator_specs", "system_node_specs", "deepseek_v3_h800_pretraining"}


def medians(path: Path, seeds: int, fit_kind: str) -> np.ndarray:
    df, _ = read_table(path)
    out = []
    for seed in range(seeds):
        v = validate(df, str(path), holdout=0.67, seed=seed, fit_kind=fit_kind)
        out.append(v.summary["median_abs_pct"])
    return np.array(out, dtype=float)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tables", nargs="*", type=Path)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--peer", action="store_true", help="also --fit compute on the same splits")
    args = ap.parse_args()
    tables = args.tables or sorted(p for p in PUB.glob("*.csv") if p.stem not in SKIP)
    kinds = ("network", "compute") if args.peer else ("network",)
    t0 = time.perf_counter()
    over = {k: 0 for k in kinds}
    total = 0
    print(f"{'table':52s} {'fit':8s} {'median':>7s} {'worst':>7s} {'>10 %':>6s}  per seed")
    for path in tables:
        for kind in kinds:
            m = medians(path, args.seeds, kind)
            n_over = int((m > 10.0).sum())
            over[kind] += n_over
            total += len(m) if kind == "network" else 0
            seeds = " ".join(f"{x:.1f}" for x in m)
            print(f"{path.stem[:52]:52s} {kind:8s} {np.median(m):6.2f}% {m.max():6.2f}% {n_over:6d}  {seeds}")
    for kind in kinds:
        print(f"{kind}: {over[kind]} of {total} splits over 10 % held-out median")
    print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
