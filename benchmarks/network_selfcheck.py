"""The 2 -> 8-node self-check of the NCCL-structured network model on the shipped logs.

For every population (NCCL version x environment setup; never pooled) the network model
is fitted on the 2-node nccl-tests logs alone and predicts the 8-node logs; the script
prints the error per collective and message size (>= 1 MiB) and the median / max per
collective, as Markdown (the tables of docs/network.md).  Nothing is chosen by looking
at the 8-node values: :func:`calib.calibrate.netcheck.selfcheck` drops them before the fit.

Run: ``python benchmarks/network_selfcheck.py [PATH ...] [--system polaris] [--detail]``
(default PATH: the repository's ``fixtures/nccl-tests``, the same logs as
``../shared/data/nccl-tests``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from calib.calibrate.netcheck import populations, selfcheck, summary
from calib.ingest.nccl_tests import ingest_nccl_tests

from calib.resolve import network_topology

ROOT = Path(__file__).resolve().parents[1]
COLLS = ("allreduce", "allgather", "alltoall")


def _size(b: int) -> str:
    return f"{b >> 30} GiB" if b >= 2**30 else f"{b >> 20} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", type=Path, default=[ROOT / "fixtures" / "nccl-tests"])
    ap.add_argument("--system", default="polaris", help="hardware preset giving the topology")
    ap.add_argument("--detail", action="store_true", help="per-size tables of every population")
    args = ap.parse_args()
    _, tables = ingest_nccl_tests(list(args.paths), name="selfcheck", system=args.system)
    topo, _ = network_topology(args.system)
    print(
        "| NCCL | setup | points | median abs error | max | "
        + " | ".join(f"{c} median / max" for c in COLLS)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(COLLS))
    detail = []
    for version, setup, pop in populations(tables["samples"]):
        table = selfcheck(pop, topology=topo)
        s = summary(table)
        cells = [
            f"{100 * s.get(f'median_abs_error_{c}', np.nan):.1f} / {100 * s.get(f'max_abs_error_{c}', np.nan):.1f} %"
            for c in COLLS
        ]
        print(f"| {version or 'unrecorded'} | {setup} | {s['points']} | {100 * s['median_abs_error']:.1f} % | "
              f"{100 * s['max_abs_error']:.1f} % | " + " | ".join(cells) + " |")  # fmt: skip
        detail.append((version, setup, table))
    if not args.detail:
        return
    for version, setup, table in detail:
        print(
            f"\nNCCL {version or 'unrecorded'}, setup {setup}: fitted on 2 nodes, predicting 8 nodes (32 GPUs)\n"
        )
        print("| size | " + " | ".join(f"{c} busbw meas / pred GB/s, time error" for c in COLLS) + " |")
        print("|---|" + "---|" * len(COLLS))
        for b, g in table.groupby("bytes"):
            cells = []
            for c in COLLS:
                r = g[g["collective"] == c]
                if r.empty:
                    cells.append("-")
                    continue
                r = r.iloc[0]
                cells.append(
                    f"{r.busbw_measured_gbps:.2f} / {r.busbw_predicted_gbps:.2f}, {100 * r.error:+.1f} % ({r.algorithm})"
                )
            print(f"| {_size(int(b))} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
