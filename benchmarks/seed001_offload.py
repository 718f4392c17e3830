"""Seed 001's key takeaways on its 1T-128T model family, with calib's offload search.

Seed 001 (Isaev et al., "Scaling Infrastructure to Support Multi-Trillion Parameter LLM
Training"), Table II: twelve models from 1T (hidden 24,576, 128 blocks) to 128T (148,480,
480 blocks; blocks grow by 32 per step).  Stated assumptions here (not in the seed text):
sequence 2048, vocabulary 51200, global batch 3072 sequences, heads = d / 2^k with a head
size in [128, 256) (so TP can reach 32), an H100-like GPU (dgx-h100 preset: 989 TFLOP/s,
stated-default efficiencies) whose HBM capacity and NVLink-domain size are swept,
offload memory 8 TiB per GPU (enough never to bind) at 100 GB/s per direction.
Strategies: ZeRO-1 (Calculon's optimizer sharding), selective or full recompute, sequence
parallelism, DP overlap, any TP <= the NVLink domain, PP, interleaving, micro-batch, and
the three offload knobs, TP overlap (none/pipe/ring) and TP redo (analytic/knobs.py).  Run: .venv/bin/python benchmarks/seed001_offload.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from calib.analytic.machine import build_system
from calib.analytic.offload import offload_search
from calib.analytic.search import Space
from calib.analytic.specs import ModelSpec, load_hardware

TABLE_II = {  # seed 001 Table II: name -> (hidden, blocks)
    "1T": (24576, 128), "2T": (32768, 160), "4T": (40960, 192), "7T": (50176, 224), "11T": (60416, 256),
    "18T": (70656, 288), "26T": (81920, 320), "37T": (94208, 352), "53T": (106496, 384), "72T": (119808, 416),
    "96T": (134144, 448), "128T": (148480, 480),
}  # fmt: skip
BATCH, SEQ, VOCAB = 3072, 2048, 51200


def model(name: str) -> ModelSpec:
    d, L = TABLE_II[name]
    heads = 1
    while d % (heads * 2) == 0 and d // (heads * 2) >= 128:
        heads *= 2
    return ModelSpec(name, d, L, heads, SEQ, VOCAB)


def best(name: str, gpus: int, hbm_gb: float, nvl: int, gbps: float = 100.0, allow=None):
    hw = replace(
        load_hardware("dgx-h100"), hbm_gb=hbm_gb, gpus_per_node=nvl, offload_gb=8192, offload_gbps=gbps
    )
    system, _ = build_system(None, hw)
    space = Space(zero=(1,), recompute=(1, 2), seq_parallel=(True,), dp_overlap=(True,), max_tp=nvl)
    df, n, fit = offload_search(model(name), system, gpus, BATCH, space, top=1, allow=allow)
    return (df.iloc[0].to_dict() if len(df) else None), n, fit


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", help="write the results here (for the report panel)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    out: dict = {"family": [], "hbm": [], "bandwidth": []}
    print(
        "| model | GPUs | HBM GB | TP | PP | DP | v | offload W/A/O | TP overlap, redo | MFU | HBM used GB | offload GiB/GPU | GB/s to hide |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ("1T", "7T", "26T", "96T", "128T"):
        for gpus in (4096, 16384):
            r, n, fit = best(name, gpus, 80.0, 8)
            hbm = 80.0
            while r is None and hbm < 1024:  # takeaway 2: the smallest HBM that runs the model at all
                hbm *= 1.5
                r, n, fit = best(name, gpus, hbm, 8)
            if r is None:
                print(f"| {name} | {gpus} | >1024 | no feasible strategy |")
                continue
            knobs = "".join(
                "y" if r[k] else "-" for k in ("weight_offload", "activation_offload", "optimizer_offload")
            )
            print(f"| {name} | {gpus} | {hbm:.0f} | {r['tp']} | {r['pp']} | {r['dp']} | {r['interleave']} | {knobs} | "
                  f"{r['tp_overlap']}, {'y' if r['tp_redo'] else '-'} | {r['mfu_offload']:.1%} | {r['hbm_gb']:.0f} | {r['offload_gib']:.0f} | {r['offload_required_gbps']:.0f} |")  # fmt: skip
            out["family"].append({"model": name, "gpus": gpus, "hbm_needed_gb": hbm, **{
                k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}})  # fmt: skip
    print("\nrelative efficiency against infinite offload bandwidth, 96T on 16384 GPUs (HBM 256 GB, NVL 8)")
    inf, _, _ = best("96T", 16384, 256.0, 8, gbps=0.0)
    for g in (25, 50, 100, 200, 400):
        r, _, _ = best("96T", 16384, 256.0, 8, gbps=float(g))
        eff = inf["iter_offload_s"] / r["iter_offload_s"] if r else float("nan")
        print(f"  {g:4d} GB/s: {eff:.3f}")
        out["bandwidth"].append({"gbps": g, "relative_efficiency": eff})
    print(f"\n{time.perf_counter() - t0:.1f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
