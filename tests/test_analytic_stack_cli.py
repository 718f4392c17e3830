"""The new axes in `calib search` (CP, EP, schedules) against an independent loop enumeration,
and `calib predict` / `calib search` with the MoE, CP and FP8 options from the command line."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from calib.analytic.machine import default_calibration
from calib.analytic.search import Space, layouts, search
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.timemodel import System

from calib.core.errors import InputError
from tests.conftest import run

H100 = load_hardware("dgx-h100")
SYS = System(default_calibration(H100), H100)


def _divs(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def test_search_layouts_match_a_loop_enumeration_with_cp_ep_schedules():
    """The documented rules, written out as plain loops: N = t c p d; t | heads; 2c | s; p | l;
    d | B; b | B/d; 1F1B with v | l/p (v > 1: p > 1, m % p == 0); ZB-H1 v = 1, p > 1, m >= p;
    DualPipe v = 1, p even > 1, m >= 2p; e | experts and e | t c d."""
    m = replace(load_model("mixtral-8x7b"), seq_len=4096)
    N, B = 64, 64
    space = Space(cp=(1, 2, 4), schedules=(0, 1, 2))
    want = set()
    for t in _divs(32):
        for c in (1, 2, 4):
            for p in _divs(32):
                if N % (t * c * p) or 4096 % (2 * c):
                    continue
                d = N // (t * c * p)
                if B % d:
                    continue
                for b in _divs(B // d):
                    mb = B // (d * b)
                    combos = [
                        (v, 0) for v in _divs(32) if v == 1 or (p > 1 and (32 // p) % v == 0 and mb % p == 0)
                    ]
                    combos += [(1, 1)] if p > 1 and mb >= p else []
                    combos += [(1, 2)] if p > 1 and p % 2 == 0 and mb >= 2 * p else []
                    for v, sch in combos:
                        for e in _divs(8):
                            if (t * c * d) % e == 0:
                                want.add((t, c, p, d, b, v, sch, e))
    lay = layouts(m, N, B, space)
    got = set(
        zip(
            *(
                lay[k].tolist()
                for k in ("tp", "cp", "pp", "dp", "micro_batch", "interleave", "schedule", "ep")
            )
        )
    )
    assert len(got) == lay["tp"].size  # no duplicates
    assert got == want


def test_moe_search_ranks_feasible_layouts_and_reports_the_best_per_gpu_count():
    m = replace(load_model("mixtral-8x7b"), seq_len=4096)
    res = search(m, SYS, [64, 128], 256, Space(cp=(1, 2), schedules=(0, 1, 2)), top=5)
    assert res.n_feasible > 0 and len(res.top) == 5
    assert list(res.best_per_gpus["gpus"]) == [64, 128]
    top = res.top
    assert (top["iter_s"].diff().dropna() >= 0).all()
    assert ((8 % top["ep"]) == 0).all() and ((top["tp"] == 1) | top["seq_parallel"]).all()
    assert (top["mem_total_gb"] <= H100.hbm_bytes / 1e9).all()  # HBM in GiB (analytic.specs)
    # the per-count best is the minimum over the ranked table at that count
    best128 = float(res.best_per_gpus.set_index("gpus").loc[128, "iter_s"])
    assert best128 == pytest.approx(float(top.loc[top["gpus"] == 128, "iter_s"].min()))


def test_predict_cli_mixtral_ep_fp8_dualpipe():
    args = ["predict", "--model", "mixtral-8x7b", "--hardware", "dgx-h100", "--gpus", "64", "--ep", "8",
            "--pp", "4", "--s", "4096", "--global-batch", "512", "--zero", "1", "--distributed-optimizer",
            "--schedule", "dualpipe", "--precision", "fp8", "--recompute", "full"]  # fmt: skip
    text = run(*args).output
    for part in (
        "EP=8",
        "fp8",
        "schedule=dualpipe",
        "EP/CP",
        "46.7 B parameters, 12.9 B active",
        "stated default",
    ):
        assert part in text
    row = json.loads(run(*args, "--json").output)["configs"][0]
    assert row["ep"] == 8 and row["pp"] == 4 and row["dp"] == 16
    assert row["ep_cp_exposed_s"] > 0 and row["bubble_s"] > 0 and not row["oom"]


def test_predict_cli_context_parallel_and_errors():
    row = json.loads(
        run("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "64", "--cp", "8",
            "--s", "131072", "--global-batch", "8", "--flash-attention", "--zero", "1", "--json").output
    )["configs"][0]  # fmt: skip
    assert row["cp"] == 8 and row["dp"] == 8 and row["ep_cp_s"] > row["ep_cp_exposed_s"] > 0
    with pytest.raises(InputError, match="expert parallelism needs a MoE"):
        run("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "64", "--ep", "8")
    with pytest.raises(InputError, match="peak_fp8"):
        run("predict", "--model", "gpt-13b", "--hardware", "polaris", "--gpus", "8", "--precision", "fp8")
    with pytest.raises(InputError, match="--top-k"):
        run("predict", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--experts", "8")


def test_search_cli_moe_with_new_axes():
    out = json.loads(
        run("search", "--model", "mixtral-8x7b", "--s", "4096", "--global-batch", "256", "--gpus", "64,128",
            "--hardware", "dgx-h100", "--cp", "1,2", "--precision", "fp8", "--distributed-optimizer",
            "--top", "3", "--json").output
    )  # fmt: skip
    assert out["strategies"] > out["feasible"] > 0 and out["strategies_per_s"] > 0
    assert [r["gpus"] for r in out["best_per_gpus"]] == [64, 128]
    best = out["best_per_gpus"][0]
    for key in (
        "iter_s",
        "compute_s",
        "comm_exposed_s",
        "tp_s",
        "ep_cp_exposed_s",
        "dp_exposed_s",
        "mem_total_gb",
    ):
        assert np.isfinite(best[key])
    assert best["schedule"] in ("1f1b", "zb-h1", "dualpipe")
    text = run("search", "--model", "deepseek-v3", "--gpus", "2048", "--hardware", "dgx-h100", "--precision",
               "fp8", "--no-interleave", "--zero", "1", "--top", "2").output  # fmt: skip
    assert "EP/CP s" in text and "best strategies" in text


def test_uneven_pp_layouts_reach_deepseek_v3s_pp16():
    """DeepSeek-V3's 61 layers: only PP 1 or 61 divide them; with --uneven-pp the search also
    takes PP = 16 (the report's layout, sec. 3.2: PP 16, EP 64), never interleaved when
    uneven (analytic.uneven)."""
    ds = load_model("deepseek-v3")
    even = layouts(ds, 2048, 15360, Space(schedules=(0, 1, 2)))
    assert set(even["pp"].tolist()) <= {1, 61}
    lay = layouts(ds, 2048, 15360, Space(schedules=(0, 1, 2), uneven_pp=True))
    assert np.any((lay["pp"] == 16) & (lay["ep"] == 64) & (lay["schedule"] == 2))
    assert np.all((lay["interleave"] == 1) | (61 % lay["pp"] == 0))
    out = json.loads(
        run("search", "--model", "deepseek-v3", "--gpus", "2048", "--hardware", "dgx-h100", "--uneven-pp",
            "--no-interleave", "--zero", "1", "--precision", "fp8", "--top", "1", "--json").output
    )  # fmt: skip
    assert out["top"][0]["pp"] not in (1, 61)


def test_moe_options_on_the_command_line():
    """--experts 0 turns a MoE preset dense; --experts/--top-k/--shared-experts make one MoE."""
    dense = json.loads(run("predict", "--model", "mixtral-8x7b", "--experts", "0", "--hardware", "dgx-h100",
                           "--gpus", "8", "--s", "4096", "--json").output)  # fmt: skip
    assert dense["model"]["n_experts"] == 0 and dense["model"]["top_k"] == 0
    moe = json.loads(run("predict", "--model", "llama3-8b", "--experts", "16", "--top-k", "2", "--shared-experts",
                         "1", "--expert-ffn", "3584", "--hardware", "dgx-h100", "--gpus", "16", "--ep", "16",
                         "--json").output)  # fmt: skip
    assert moe["model"]["n_experts"] == 16 and moe["configs"][0]["ep"] == 16
    assert moe["configs"][0]["ep_cp_s"] > 0


def test_unfused_attention_is_said_and_fused_is_not():
    """With --no-flash-attention the model keeps and moves the s x s scores (Megatron 2021):
    predict and search say so, naming the sequence; with --flash-attention they say nothing.
    Given neither, a Llama 3 on H100s runs fused (analytic.vdefaults: SwiGLU, grouped-query
    attention, s >= 4096, FP8-capable hardware) and the note says why and how to turn it off;
    GPT-3 on A100s at s 2048 stays unfused, as Megatron ran it."""
    args = ("--hardware", "dgx-h100", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "64")
    gpt3 = ("--hardware", "dgx-a100-80gb", "--model", "gpt3-175b", "--gpus", "64", "--global-batch", "64")
    for cmd in ("predict", "search"):
        out = run(cmd, *args, "--no-flash-attention").output
        assert "attention unfused" in out and "at s = 8192" in out and "flash-attention" in out, out
        assert "attention unfused" not in run(cmd, *args, "--flash-attention").output
        out = run(cmd, *args).output
        assert "attention unfused" not in out and "attention fused (SwiGLU, grouped-query attention" in out, (
            out
        )
        assert "--no-flash-attention" in out
        assert "attention unfused" in run(cmd, *gpt3).output
    a = run("predict", *args).output
    b = run("predict", *args, "--flash-attention").output
    pick = [ln for ln in a.splitlines() if ln.strip().startswith("8 ")]
    assert pick and pick == [ln for ln in b.splitlines() if ln.strip().startswith("8 ")]
