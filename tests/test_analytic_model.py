"""The time/memory model: internal identities, placement, OOM, scaling, search enumeration,
and predictions from a calibration fitted by `calib fit` on the real Polaris nccl-tests logs."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from calib.analytic import formulas as F
from calib.analytic.comm import group_time_s
from calib.analytic.machine import default_calibration
from calib.analytic.predict import Plan, predict
from calib.analytic.search import Space, search
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import TIME_KEYS, System, evaluate
from calib.calibrate.calibration import Calibration

from calib.core.collective_names import ALLGATHER, ALLREDUCE
from calib.resolve import resolve_system

ROOT = Path(__file__).parents[1]


def system(name: str = "dgx-a100-80gb") -> System:
    hw = load_hardware(name)
    return System(default_calibration(hw), hw)


def mixed() -> Strategies:
    return Strategies.of(
        tp=[1, 1, 1, 1, 8, 8, 4], pp=[1, 1, 1, 1, 1, 4, 2], dp=[8, 8, 8, 8, 2, 1, 4], micro_batch=[1, 2, 1, 1, 1, 1, 2],
        global_batch=[16, 32, 16, 8, 4, 8, 64], zero=[0, 1, 2, 3, 3, 1, 0], recompute=[0, 2, 1, 2, 0, 1, 2],
        seq_parallel=[False, False, False, False, True, True, False], dp_overlap=[True, True, True, True, False, True, False],
        interleave=[1, 1, 1, 1, 1, 2, 1],
    )  # fmt: skip


def test_breakdown_sums_to_iteration_and_lean_agrees():
    model, sysm, st = load_model("gpt-1.3b"), system(), mixed()
    r = evaluate(model, sysm, st)
    assert np.allclose(sum(r[k] for k in TIME_KEYS), r["iter_s"], rtol=1e-12)
    assert np.allclose(evaluate(model, sysm, st, lean=True)["iter_s"], r["iter_s"], rtol=1e-12)
    assert np.all(r["comm_overlapped_s"] >= -1e-15)
    assert np.allclose(r["comm_s"] - r["comm_overlapped_s"], r["comm_exposed_s"])


def test_zero1_allreduce_is_twice_its_allgather():
    # seed 004: "AllGather takes half of AllReduce time" (same bytes, bus factor 2(n-1)/n vs (n-1)/n)
    r = evaluate(load_model("gpt-6.7b"), system("polaris"),
                 Strategies.of(tp=1, pp=1, dp=64, micro_batch=1, global_batch=64, zero=1))  # fmt: skip
    assert r["dp_allreduce_s"] == pytest.approx(2 * r["dp_allgather_s"], rel=0.02)


def test_strided_group_shares_the_nics():
    cal = system().cal  # 8 GPUs per node
    one = group_time_s(cal, ALLREDUCE, 1e10, 16, 1)  # 16 nodes, one rank per node
    full = group_time_s(cal, ALLREDUCE, 1e10, 128, 8)  # the same 16 nodes, 8 ranks each
    # bandwidth term: gpn/k = 8 x the load on the NICs, bus factors 30/16 vs 254/128
    assert one / full == pytest.approx(8 * (30 / 16) / (254 / 128), rel=0.02)
    intra = group_time_s(cal, ALLGATHER, 1e8, 8, 8)
    assert intra < group_time_s(cal, ALLGATHER, 1e8, 16, 8)  # leaving the node costs


def test_tp_beyond_the_node_is_slower():
    model = load_model("megatron-18b")
    res = [evaluate(model, system(hw), Strategies.of(tp=8, pp=1, dp=1, micro_batch=1, global_batch=8))["tp_s"]
           for hw in ("dgx-a100-80gb", "polaris")]  # fmt: skip
    assert res[1] > 3 * res[0]  # 4 GPUs per node: TP=8 crosses Slingshot


def test_oom_is_reported_not_raised():
    pred = predict(load_model("gpt3-175b"), system(), [8, 1024], Plan(tp=8, zero=3))
    assert pred.table["oom"].tolist() == [True, False]
    assert any("OOM" in n for n in pred.notes)


def test_speedup_comm_model_formula_equals_throughput_speedup_for_weak_scaling():
    # plain DP: per-GPU compute (and optimizer step) fixed, only communication changes
    pred = predict(load_model("gpt-13b"), system("polaris"), [8, 16, 64, 512], Plan(zero=0))
    t = pred.table
    assert np.allclose(t["speedup_comm_model"], t["speedup"], rtol=1e-9)
    assert t["scaling_eff"].iloc[0] == 1.0 and (t["scaling_eff"].iloc[1:] < 1).all()
    # ZeRO-1 shards the optimizer step as DP grows, so the seed's fixed-compute formula
    # is close but no longer exact
    z1 = predict(load_model("gpt-13b"), system("polaris"), [8, 512], Plan(zero=1)).table
    assert z1["speedup_comm_model"].iloc[1] == pytest.approx(z1["speedup"].iloc[1], rel=0.02)
    assert z1["speedup_comm_model"].iloc[1] != pytest.approx(z1["speedup"].iloc[1], rel=1e-6)
    fixed = predict(load_model("gpt-13b"), system("polaris"), [8, 16], Plan(zero=1, global_batch=64)).table
    assert np.isnan(fixed["speedup_comm_model"].iloc[1])  # compute per GPU changed: formula not applicable


def test_mfu_and_throughput_are_consistent():
    model = load_model("megatron-1t")
    r = predict(model, system(), [3072], Plan(tp=8, pp=64, global_batch=3072, recompute=F.FULL)).table.iloc[0]
    flops = 3072 * F.model_flops(1, 2048, 25600, 128, 51200)
    assert r["tflops_per_gpu"] == pytest.approx(flops / r["iter_s"] / 3072 / 1e12)
    assert r["mfu"] == pytest.approx(r["tflops_per_gpu"] / 312)
    assert r["tokens_per_s"] == pytest.approx(3072 * 2048 / r["iter_s"])


def _brute_force(model, N, B, space):
    """Independent enumeration with plain loops (small problem): every valid strategy."""
    L, a = model.n_layers, model.n_heads
    rows = []
    for t, p in itertools.product(range(1, N + 1), repeat=2):
        if N % (t * p) or a % t or L % p or (space.max_tp and t > space.max_tp):
            continue
        d = N // (t * p)
        if B % d:
            continue
        for b in range(1, B // d + 1):
            if (B // d) % b:
                continue
            m = B // (d * b)
            for v in range(1, L + 1):
                if v > 1 and not (p > 1 and (L // p) % v == 0 and m % p == 0):
                    continue
                for z, rc, sp, ov in itertools.product(
                    space.zero, space.recompute, space.seq_parallel, space.dp_overlap
                ):
                    if (z and d == 1) or (sp and t == 1) or (ov and d == 1):  # ZeRO-2/3 + PP: sharded_pp
                        continue
                    rows.append((t, p, d, b, v, z, rc, sp, ov))
    cols = np.array(rows, dtype=np.int64).T
    keys = ("tp", "pp", "dp", "micro_batch", "interleave", "zero", "recompute", "seq_parallel", "dp_overlap")
    return Strategies.of(**dict(zip(keys, cols)), global_batch=B)


def test_search_counts_every_valid_strategy_and_finds_the_best():
    model, sysm, N, B = load_model("megatron-1.7b"), system(), 32, 64
    res = search(model, sysm, N, B, Space(), top=5)
    every = _brute_force(model, N, B, Space())
    assert res.n_strategies == every.tp.size
    r = evaluate(model, sysm, every)
    assert res.n_feasible == int((~r["oom"]).sum())
    assert res.top["iter_s"].iloc[0] == pytest.approx(float(r["iter_s"][~r["oom"]].min()), rel=1e-12)
    assert res.top["iter_s"].is_monotonic_increasing


def test_one_at_a_time_equals_vectorised():
    model, sysm = load_model("megatron-1.7b"), system()
    every = _brute_force(model, 16, 32, Space())
    pick = np.linspace(0, every.tp.size - 1, 12).astype(int)
    sub = Strategies.of(**{k: getattr(every, k)[pick] for k in ("tp", "pp", "dp", "micro_batch", "interleave", "zero",
                                                                  "recompute", "seq_parallel", "dp_overlap")},
                        global_batch=32)  # fmt: skip
    vec = evaluate(model, sysm, sub)["iter_s"]
    one = [float(evaluate(model, sysm, Strategies.of(**sub.row(i)))["iter_s"]) for i in range(pick.size)]
    assert np.allclose(one, vec, rtol=1e-12)


def test_search_sweep_best_per_gpu_count():
    res = search(load_model("megatron-1.7b"), system(), [16, 32, 64], 64, top=3)
    assert res.best_per_gpus["gpus"].tolist() == [16, 32, 64]
    one = search(load_model("megatron-1.7b"), system(), 32, 64, top=1)
    assert res.best_per_gpus.set_index("gpus").loc[32, "iter_s"] == pytest.approx(one.top["iter_s"].iloc[0])


@pytest.fixture(scope="module")
def polaris_calibration(tmp_path_factory):
    """A real calibration: `calib ingest` + `calib fit` on the Polaris nccl-tests logs."""
    store = tmp_path_factory.mktemp("store")
    env = {"CALIB_STORE": str(store), "PATH": str(Path(sys.executable).parent)}
    for args in (["ingest", str(ROOT / "fixtures" / "nccl-tests"), "--system", "polaris", "--name", "nccl"],
                 ["fit", "--system", "polaris"]):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "calib.cli", *args], env=env, capture_output=True, text=True, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr
    return store


def test_predict_from_fitted_calibration(polaris_calibration):
    sysm, notes = resolve_system(system="polaris", store=polaris_calibration)
    assert sysm.hw.name == "polaris" and sysm.cal.system == "polaris"
    # the fitted inter-node all-reduce at 2 nodes carries the measured 1 GiB busbw (36.8 GB/s)
    t = sysm.cal.collective_time_s(ALLREDUCE, 2**30, 8)
    busbw = 2**30 / t * 2 * 7 / 8 / 1e9
    assert busbw == pytest.approx(36.8, rel=0.05)
    pred = predict(load_model("gpt-13b"), sysm, [8, 64, 512], Plan(zero=3)).table
    assert (pred["dp_allgather_exposed_s"] > 0).all() and pred["oom"].tolist() == [True, False, False]
    # a network-only fit leaves the GEMM plateau a stated default: the device's measured
    # achievable matmul, as --hardware gives it (stop 31; the fit wrote the generic 0.75)
    stored = Calibration.load(polaris_calibration / "polaris" / "polaris.calib.json")
    assert stored.gemm_efficiency_curve.y_max.value == 0.75
    assert sysm.cal.gemm_efficiency_curve.y_max.value == pytest.approx(271.2 / 312)
    assert any("measured maximum achievable matmul, 0.869 of peak" in n for n in notes)
    # transfer the same fit to a DGX H100 spec: faster, and flagged as transferred
    h100, notes = resolve_system(system="polaris", hardware="dgx-h100", store=polaris_calibration)
    assert any("transferred" in n for n in notes)
    assert h100.cal.gemm_efficiency_curve.y_max.value == pytest.approx(794.5 / 989)  # the H100's default
    fast = predict(load_model("gpt-13b"), h100, [64], Plan(zero=3)).table
    assert fast["iter_s"].iloc[0] < pred["iter_s"].iloc[1]


def test_cli_predict_json_with_fitted_calibration(polaris_calibration):
    done = subprocess.run(
        [sys.executable, "-m", "calib.cli", "predict", "--system", "polaris", "--store", str(polaris_calibration),
         "--model", "gpt-6.7b", "--gpus", "8,16,512", "--zero", "1", "--json"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [c["gpus"] for c in out["configs"]] == [8, 16, 512]
    assert out["calibration"] == "polaris"
