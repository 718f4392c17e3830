#!/usr/bin/env python3
"""Held-out errors of the device model on the real GPU runs recorded at stop 28
(fixtures/traces/h100b, h200b), printed run by run: the figures that
tests/test_h100b_device.py bounds, in one report.

Splits (written before any prediction; SOURCE.txt there):
  dense   the scoreboard's fit (the five shipped H100 runs + their GEMM bench) -> seven new
          dense shapes and the host-bound repeat on a second H100 machine;
  moe     MoE terms from mixtral-d1024-e8 alone -> five new MoE shapes (H100 and H200), and
          the hand count (no MoE run in the fit) on the same shapes;
  other   HF DeepSeek-V3 and Qwen2-MoE runs, never fitted;
  moe-from  every MoE run of the second H100 predicted from the terms of one run of each
          implementation (Mixtral, DeepSeek-V3, Qwen2-MoE): how far one stack's terms carry;
  fp8     each eager FP8 run of the second H100 predicted from a fit with the other;
  cross   the H100 fit moved to the H200 and the H200 fit moved to the H100 (twin runs);
  kernels the element-wise and AdamW bench, H200 over H100;
  mla     stop 32 (fixtures/traces/h200c, h100c, h200d): the MLA terms from mla-dense-d1024 alone ->
          two more dense MLA shapes and three DeepSeek-V3 runs (with the Mixtral MoE terms),
          against the same fits without a dense MLA run; two torch.compile runs; each
          DeepSeek-V3 run's own MoE terms.

  few-rows  stop 33 (fixtures/traces/h100d): three HF Mixtral shapes with 64-128 routed rows per
          expert from the shipped H100 fit and h100b's Mixtral terms (host-bound steps on a slower host).

Usage: python benchmarks/device_heldout.py [--section dense moe other moe-from fp8 cross kernels mla few-rows]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from calib.analytic.specs import ModelSpec

from calib.api import SystemModel, ingest_run, load_runs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
REPLICAS = ("g125m-b8", "g760m-b8", "g2p7b-b4", "g1p3b-s2k-b2", "llama-d1024-l16")
NEW_DENSE = ("g350m-b16", "llama-bf16-d4096-s2k", "llama-d1024-s16k", "llama-d1024-s8k-b2", "llama-d2048-s32k",
             "llama-d3072-s2k", "llama-gqa-d2048-s4k")  # fmt: skip
REPEAT = "llama-d1024-l16-repeat"
MOE_HELD = ("mixtral-d1024-e8-top1", "mixtral-d1024-e32-top4", "mixtral-d1024-e64-top8", "mixtral-d2048-e8",
            "mixtral-d1536-e16-s4k")  # fmt: skip
H200_DENSE = (
    *REPLICAS,
    "llama-bf16-d4096-s2k",
    "llama-d1024-s16k",
    "llama-d2048-s32k",
    "llama-gqa-d2048-s4k",
)
OTHER = ("dsv3-d1024-e64-top6", "qwen2moe-d1024-e60-top4", "dsv3-d2048-e32-top4")
MLA_DEV = "mla-dense-d1024"  # the MLA terms' one run (fixtures/traces/h200c, h100c; stop 32)
MLA_HELD = ("mla-dense-d2048", "mla-dense-d1536-s4k")
DSV3 = ("dsv3-d1024-e64-top6", "dsv3-d2048-e32-top4", "dsv3-d1024-e32-top4-f384")
#: fixtures/traces/h100d (stop 33): HF Mixtral layers with 64 and 128 routed rows per expert
FEW_ROWS = ("mixtral-d1024-e128-top2-f512", "mixtral-d1024-e256-top4-f256", "mixtral-d1024-e64-top2-f1024")


def measured(folder: str) -> dict:
    return json.loads((FIX / folder / "measured_steps.json").read_text())["runs"]


def fit(runs, system: str, bench: str) -> SystemModel:
    """A fit of ``runs`` ((folder, name) pairs) with ``bench``'s GEMM bench, in a scratch store."""
    store = Path(tempfile.mkdtemp(prefix="calib-heldout-"))
    try:
        for folder, name in runs:
            ingest_run(FIX / folder / "runs" / name, system=system, store=store)
        for b in (FIX / bench / "gemm-bench").iterdir():
            shutil.copytree(b, store / system / "runs" / b.name)
        return SystemModel().fit(load_runs(system=system, store=store))
    finally:
        shutil.rmtree(store, ignore_errors=True)


def spec(name: str, sh: dict) -> ModelSpec:
    """The run's model as a user would write it (the presets' fields)."""
    if "ffn" not in sh:  # HF GPT-2
        return ModelSpec(name, sh["d"], sh["l"], sh["a"], sh["s"], sh["V"], dropout=False)
    kw = dict(ffn=sh["ffn"], mlp="swiglu", tied_embeddings=False, dropout=False)
    if "qr" in sh:  # DeepSeek-V3's multi-head latent attention
        kw.update(qk_head_dim=sh["nope"] + sh["rope"], v_head_dim=sh["vh"], q_lora_rank=sh["qr"],
                  kv_lora_rank=sh["kvr"], qk_rope_head_dim=sh["rope"])  # fmt: skip
    else:
        kw.update(kv_heads=sh["kv"])
    if "shffn" in sh:  # Qwen2-MoE: the shared expert as shared experts of the routed width
        kw.update(
            n_experts=sh["E"],
            top_k=sh["topk"],
            expert_ffn=sh["effn"],
            shared_experts=sh["shffn"] // sh["effn"],
        )
    elif "shared" in sh:  # DeepSeek-V3: shared experts, leading dense layers
        kw.update(n_experts=sh["E"], top_k=sh["topk"], expert_ffn=sh["effn"], shared_experts=sh["shared"],
                  dense_layers=sh["dense"])  # fmt: skip
    elif "E" in sh:
        kw.update(n_experts=sh["E"], top_k=sh["topk"], expert_ffn=sh["ffn"])
    return ModelSpec(name, sh["d"], sh["l"], sh["a"], sh["s"], sh["V"], **kw)


def report(title: str, model: SystemModel, names, runs: dict, **kw) -> list[float]:
    """One line per run: measured, predicted, 90 % interval, error, peak memory."""
    print(f"\n{title}")
    errs = []
    for name in names:
        m = runs[name]
        sh, meas = m["shape"], m["step_s_unprofiled_median"]
        row = model.predict(
            spec(name, sh), gpus=[1], micro_batch=sh["b"], flash_attention=True, **kw
        ).table.iloc[0]
        err = row["iter_s"] / meas - 1.0
        inside = "inside " if row["iter_s_lo"] <= meas <= row["iter_s_hi"] else "OUTSIDE"
        mem = row["mem_total_gb"] / m["peak_mem_gb"] - 1.0
        print(f"  {name:30s} measured {meas * 1e3:7.1f} ms  predicted {row['iter_s'] * 1e3:7.1f}"
              f" [{row['iter_s_lo'] * 1e3:6.1f}, {row['iter_s_hi'] * 1e3:6.1f}] {inside} {err * 100:+6.1f} %"
              f"  memory {mem * 100:+5.1f} %")  # fmt: skip
        errs.append(abs(err))
    print(
        f"  median |error| {np.median(errs) * 100:.1f} %, max {max(errs) * 100:.1f} % over {len(errs)} runs"
    )
    return errs


def mla_section(h100b_dense) -> None:
    """Multi-head latent attention's terms from one dense MLA run, held out on the rest."""
    h200c, h100c, h100b = measured("h200c"), measured("h100c"), measured("h100b")
    base = [*(("h200", n) for n in H200_DENSE), ("h200", "mixtral-d1024-e8")]
    for tag, runs in (
        ("no MLA run in the fit", base),
        (f"MLA terms from {MLA_DEV}", [*base, ("h200c", MLA_DEV)]),
    ):
        model = fit(runs, "h200-hf", "h200")
        report(
            f"mla: H200, {tag}: dense MLA ({MLA_DEV} in-sample where fitted)",
            model,
            (MLA_DEV, *MLA_HELD),
            h200c,
        )
        report(f"mla: H200, {tag}: DeepSeek-V3 with the Mixtral MoE terms (held out)", model, DSV3, h200c)
    h100 = [*h100b_dense, ("h100b", "mixtral-d1024-e8")]
    for tag, runs in (
        ("no MLA run in the fit", h100),
        (f"MLA terms from {MLA_DEV}", [*h100, ("h100c", MLA_DEV)]),
    ):
        model = fit(runs, "h100-hf", "h100")
        report(f"mla: H100, {tag}: DeepSeek-V3 of the second H100 machine", model, DSV3[:2], h100b)
        report(
            f"mla: H100, {tag}: dense MLA (a noisy host, fixtures/traces/h100c)",
            model,
            ("mla-dense-d2048",),
            h100c,
        )
    h200d, h200 = measured("h200d"), measured("h200")
    compiled = [("h200", n) for n, r in h200.items() if r.get("compiled") and "fp8" not in n]
    model = fit([*base, *compiled, ("h200c", MLA_DEV)], "h200-hf", "h200")
    report("mla: H200, torch.compile (fixtures/traces/h200d; eager MLA terms x the compiled family's ratios)", model,
           ("mla-compiled-d1024", "dsv3-compiled-d1024-e64-top6"), h200d, compiled=True)  # fmt: skip
    report(
        "mla: H200, the eager runs on that machine",
        model,
        (MLA_DEV, DSV3[0], "llama-d1024-l16-repeat"),
        h200d,
    )
    for one in DSV3:
        model = fit([*base[:-1], ("h200c", MLA_DEV), ("h200c", one)], "h200-hf", "h200")  # not Mixtral's
        mt = model.device_model_.moe
        terms = ", ".join(f"{k} {getattr(mt, k).value:.4g}" for k in ("bytes_d", "bytes_ffn", "kernels_layer",
                                                                     "host_ops_layer", "grouped_gemm_scale"))  # fmt: skip
        report(f"mla: H200, the MoE terms of {one} ({terms})", model, [n for n in DSV3 if n != one], h200c)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = ["dense", "moe", "other", "moe-from", "fp8", "cross", "kernels", "mla", "few-rows"]
    ap.add_argument("--section", nargs="*", default=names, choices=names)
    sections = set(ap.parse_args(argv).section)
    h100b, h200b = measured("h100b"), measured("h200b")
    h200 = measured("h200")
    if sections & {"dense", "cross"}:
        shipped = fit([("h100", n) for n in REPLICAS], "h100-hf", "h100")
    h100b_dense = [("h100b", n) for n in (REPEAT, *NEW_DENSE)]
    if "dense" in sections:
        report("dense: the shipped H100 fit on a second H100's new shapes (held out)", shipped,
               (*NEW_DENSE, REPEAT), h100b)  # fmt: skip
    if "moe" in sections or "other" in sections:
        moe100 = fit([*h100b_dense, ("h100b", "mixtral-d1024-e8")], "h100-hf", "h100")
    if "moe" in sections:
        report("moe: terms from mixtral-d1024-e8, H100 (held out)", moe100, MOE_HELD, h100b)
        moe200 = fit([*(("h200", n) for n in H200_DENSE), ("h200", "mixtral-d1024-e8")], "h200-hf", "h200")
        report("moe: terms from mixtral-d1024-e8, H200 (held out)", moe200, MOE_HELD, h200b)
        report("moe: the hand count, no MoE run in the fit (H100)", fit(h100b_dense, "h100-hf", "h100"), MOE_HELD,
               h100b)  # fmt: skip
    if "other" in sections:
        report("other: HF DeepSeek-V3 and Qwen2-MoE, never fitted (H100)", moe100, OTHER, h100b)
    if "moe-from" in sections:
        for one in ("mixtral-d1024-e8", "dsv3-d1024-e64-top6", "qwen2moe-d1024-e60-top4"):
            model = fit([*h100b_dense, ("h100b", one)], "h100-hf", "h100")
            every = [n for n in ("mixtral-d1024-e8", *MOE_HELD, *OTHER) if n != one]
            report(f"moe-from: the MoE terms of {one} alone, every other MoE run (H100)", model, every, h100b)
    if "fp8" in sections:
        a, b = "llama-fp8-d2048-s4k", "llama-fp8-d4096-s2k"
        for train, held in ((a, b), (b, a)):
            model = fit([*h100b_dense, ("h100b", train)], "h100-hf", "h100")
            report(
                f"fp8: eager FP8 casts and GEMM speed-up from {train} (held out)",
                model,
                (held,),
                h100b,
                fp8=True,
            )
    if "cross" in sections:
        report("cross: the H100 fit moved to the H200", shipped, H200_DENSE, h200, hardware="h200")
        report("cross: the H100 fit moved to the H200 (new twins)", shipped,
               ("g350m-b16", "llama-d1024-s8k-b2", "llama-d3072-s2k"), h200b, hardware="h200")  # fmt: skip
        h200fit = fit([("h200", n) for n in REPLICAS], "h200-hf", "h200")
        report("cross: the H200 fit moved to the H100", h200fit, (REPEAT, *NEW_DENSE), h100b, hardware="h100")
    if "mla" in sections:
        mla_section(h100b_dense)
    if "few-rows" in sections:  # stop 33: host-bound steps, the grouping law not visible in them
        model = fit([("h100", n) for n in REPLICAS] + [("h100b", "mixtral-d1024-e8")], "h100-hf", "h100")
        report("few-rows: 64-128 routed rows per expert on a third H100 (the shipped fit + h100b's Mixtral terms)",
               model, FEW_ROWS, measured("h100d"))  # fmt: skip
    if "kernels" in sections:
        a, b = (json.loads((FIX / f / "measured_steps.json").read_text())["kernels"]["bandwidth"]
                for f in ("h100b", "h200b"))  # fmt: skip
        print("\nkernels: bandwidth counting reads and writes, H100 -> H200 (HBM ratio 1.43, same SMs)")
        for x, y in zip(a, b):
            size = f"{x['mib']} MiB" if "mib" in x else f"{x['mparams']} M params"
            print(
                f"  {x['kind']:22s} {size:>13s}  {x['gbps']:6.0f} -> {y['gbps']:6.0f} GB/s  x{y['gbps'] / x['gbps']:.2f}"
            )


if __name__ == "__main__":
    main()
