"""Energy model: hand-worked on seed 003's formulas and tables (pJ/OP, pJ/bit, DVFS)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from calib.analytic.energy import Work, at_scales, energy_columns, load_power, work_of
from calib.analytic.machine import build_system
from calib.analytic.specs import ModelSpec, load_hardware
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import evaluate

from calib.core.errors import InputError
from tests.conftest import run

A100 = load_hardware("polaris")  # NVIDIA A100-SXM4-40GB


def test_a100_numbers_are_seed_003_table():
    p = load_power(A100, "fp16")
    # seed 003 "A100 number check": 400 W / 312 TFLOP/s = 1.28 pJ/OP (matrix FP16)
    assert p.pj_per_flop_tdp == pytest.approx(1.28, abs=0.005)
    assert load_power(A100, "tf32").pj_per_flop_tdp == pytest.approx(2.56, abs=0.01)  # 400 / 156
    assert load_power(A100, "int8").pj_per_flop_tdp == pytest.approx(0.64, abs=0.01)  # 400 / 624
    assert p.pj_per_bit_hbm.value == pytest.approx(450 / 64, abs=0.01)  # HBM2 450 pJ per 64 bit
    assert p.pj_per_flop_theory.value == 0.34 and p.power_cap_w.status == "sourced"
    # static: stated default 0.2 x cap; overhead 0.4 of the rest; FLOP energy the remainder at peak
    assert p.static_w.value == 80 and p.static_w.status == "default"
    assert p.overhead_w.value == pytest.approx(0.4 * 320)
    assert p.pj_per_flop.value == pytest.approx(0.6 * 320 / 312)


def test_energy_hand_worked():
    p = load_power(A100, "bf16")
    w = Work(*(np.array(x) for x in (1e12, 1e9, 0.01, 0.002, 1.0, 0.001)))
    e1 = at_scales(p, w, np.float64(1.0))
    # 80 W x 13 ms + 128 W x 12 ms + 1e12 x 0.61538 pJ + 8e9 bit x 7.03 pJ
    assert e1["time_s"] == pytest.approx(0.013)
    assert e1["energy_j"] == pytest.approx(1.04 + 1.536 + 0.615385 + 0.05624, rel=1e-5)
    v = 0.6 + 0.4 * (0.5 - 0.15) / 0.85  # linear V(f) from 0.6 at f_min = 0.15 f_max
    e5 = at_scales(p, w, np.float64(0.5))
    assert e5["time_s"] == pytest.approx(0.023)
    want = 80 * 0.023 + 128 * 0.5 * v * v * 0.022 + 0.615385 * v * v + 0.05624
    assert e5["energy_j"] == pytest.approx(want, rel=1e-5)


def test_peak_load_draws_the_cap_and_the_cap_throttles():
    p = load_power(A100, "bf16")
    peak = 312e12
    ok = Work(*(np.array(x) for x in (peak * 1.0, 0.0, 1.0, 0.0, 1.0, 0.0)))
    c = energy_columns(p, ok, np.array(1), 1.0)
    assert not c["throttled"] and c["power_w_per_gpu"] == pytest.approx(400.0)
    # add 1.5 TB of HBM traffic in the same second: 84 W more than the cap allows
    hot = Work(*(np.array(x) for x in (peak * 1.0, 1.5e12, 1.0, 0.0, 1.0, 0.0)))
    c = energy_columns(p, hot, np.array(1), 1.0)
    assert c["throttled"] and c["clock_scale"] < 1.0
    busy = at_scales(p, hot, np.float64(c["clock_scale"]))["busy_power_w"]
    assert busy <= 400.0


def test_u_shape_and_memory_heavy_moves_optimum_down():
    """Seed 003 observations 1 and 3: U-shaped energy, lower optimum for memory-heavy work."""
    p = load_power(load_hardware("a30"), "fp16")
    sc = p.scales()
    assert sc.size == (1440 - 210) // 15 + 1  # seed 003: 210..1440 MHz in 15 MHz steps
    compute = Work(*(np.array(x) for x in (165e12 * 0.01 * 0.8, 1e9, 0.01, 0.001, 1.0, 0.0)))
    memory = Work(*(np.array(x) for x in (165e12 * 0.01 * 0.8, 6e9, 0.01, 0.008, 1.0, 0.0)))
    e = at_scales(p, compute, sc)["energy_j"]
    k = int(np.argmin(e))
    assert 0 < k < sc.size - 1 and e[k] < e[0] and e[k] < e[-1]
    f_c = energy_columns(p, compute, np.array(1), 1.0)["f_opt_mhz"]
    f_m = energy_columns(p, memory, np.array(1), 1.0)["f_opt_mhz"]
    assert f_m < f_c


def test_seed_003_layer_on_a30_saves_energy_mid_range():
    """GPT-350M decoder layer (d 1024, 16 heads, ffn 4096, s 1024) on an A30 (seed 003 obs. 1,
    and the takeaway '~10-20% energy savings'): the optimum is a mid-range clock."""
    hw = load_hardware("a30")
    system, _ = build_system(None, hw)
    p = load_power(hw, "fp16")
    out = {}
    for s in (128, 1024, 8192):
        m = ModelSpec("gpt-350m-layer", 1024, 1, 16, s, 1, ffn=4096)
        st = Strategies.of(tp=1, pp=1, dp=1, micro_batch=8, global_batch=8)
        r = evaluate(m, system, st)
        out[s] = energy_columns(p, work_of(m, system, st, r), np.array(1), 8.0 * s)
    c = out[1024]
    assert 500 < c["f_opt_mhz"] < 1200
    assert 0.05 < c["energy_saving_opt"] < 0.30
    assert out[8192]["f_opt_mhz"] < out[128]["f_opt_mhz"]  # observation 3


def test_to_solution_and_cost():
    p = load_power(A100, "bf16")
    w = Work(*(np.array([x, x]) for x in (1e12, 1e9, 0.01, 0.002, 1.0, 0.001)))
    c = energy_columns(
        p, w, np.array([8, 16]), np.array([1000.0, 2000.0]), tokens=1e6, price_per_gpu_hour=2.0
    )
    assert c["iterations"] == pytest.approx([1000, 500])
    assert c["time_to_solution_h"] == pytest.approx(np.array([1000, 500]) * 0.013 / 3600)
    assert c["cost"] == pytest.approx(c["gpu_hours"] * 2.0)
    assert c["energy_to_solution_mwh"] == pytest.approx(c["iterations"] * c["energy_kj_per_iter"] / 3.6e6)


def test_predict_energy_cli_and_api():
    args = ["predict", "--hardware", "polaris", "--model", "gpt-13b", "--gpus", "8,64", "--zero", "3"]
    text = run(*args, "--energy", "--tokens", "1e10", "--price-per-gpu-hour", "2").output
    assert "energy per iteration" in text and "to solution" in text and "static_w 80 (default)" in text
    js = json.loads(run(*args, "--energy", "--tokens", "1e10", "--json").output)["configs"]
    assert js[0]["energy_kj_per_iter"] > 0 and js[0]["gpu_hours"] == pytest.approx(
        js[0]["time_to_solution_h"] * 8
    )
    with pytest.raises(InputError):
        run(*args, "--tokens", "1e10")  # needs --energy
    from calib.api import SystemModel

    sm = SystemModel.from_hardware("polaris")
    pr = sm.energy("gpt-13b", [8, 64], zero=3, tokens=1e10)
    assert pr.table["energy_kj_per_iter"].to_numpy() == pytest.approx([c["energy_kj_per_iter"] for c in js])
    curve = sm.dvfs_curve("gpt-13b", 8, zero=3)
    assert (
        curve["f_mhz"].max() == pytest.approx(1410) and curve["energy_j"].min() < curve["energy_j"].iloc[-1]
    )


def test_unknown_device_is_one_line(tmp_path):
    spec = tmp_path / "hw.yaml"
    spec.write_text("device: Foo X1\npeak_tflops: 10\nhbm_gb: 8\nhbm_tbps: 1\ngpus_per_node: 1\n"
                    "scale_up_gbps: 10\nnode_nic_gbps: 1\n")  # fmt: skip
    with pytest.raises(InputError, match="no power data for device 'Foo X1'"):
        run("predict", "--hardware", str(spec), "--d", "512", "--l", "2", "--a", "8", "--s", "128",
            "--gpus", "1", "--energy")  # fmt: skip


def test_search_objectives():
    base = [
        "search",
        "--hardware",
        "dgx-h100",
        "--model",
        "gpt3-175b",
        "--gpus",
        "1024",
        "--top",
        "5",
        "--json",
    ]
    t = json.loads(run(*base).output)["top"]
    e = json.loads(run(*base, "--objective", "energy").output)["top"]
    c = json.loads(run(*base, "--objective", "cost").output)["top"]
    assert [r["iter_s"] for r in t] == sorted(r["iter_s"] for r in t)
    je = [r["energy_j_per_token"] for r in e]
    assert je == sorted(je)
    # the energy ranking's best spends no more energy per token than the fastest strategy does
    from calib.api import SystemModel

    fast = SystemModel.from_hardware("dgx-h100").search("gpt3-175b", 1024, top=1, objective="energy")
    assert fast.top["energy_j_per_token"].iloc[0] == pytest.approx(je[0])
    # fixed GPU count: GPU-seconds per token ranks like time
    assert [r["iter_s"] for r in c] == [r["iter_s"] for r in t]


def test_capped_bisection_matches_the_clock_sweep():
    from calib.analytic.energy import capped

    p = load_power(A100, "bf16")
    hot = Work(
        np.array([312e12, 312e12]), np.array([0.0, 1.5e12]), *(np.array([x, x]) for x in (1.0, 0.0, 1.0, 0.0))
    )
    c = capped(p, hot)
    assert c["busy_power_w"][0] == pytest.approx(400.0)  # at the cap exactly: not throttled
    assert c["busy_power_w"][1] == pytest.approx(400.0, abs=0.5)  # throttled onto the cap
    sweep = energy_columns(p, hot, np.array([1, 1]), 1.0)
    # the bisection's clock lies within one 15 MHz-equivalent step of the sweep's
    assert c["time_s"][1] == pytest.approx(sweep["time_s_at_clock"][1], rel=0.02)


def test_cli_dtype_choices_are_the_energy_model_dtypes():
    """predict/search offer exactly the data types the energy model has an energy per FLOP for."""
    from calib.analytic.energy import DTYPES

    from calib.commands.stack_options import ENERGY_DTYPES

    assert sorted(ENERGY_DTYPES) == sorted(DTYPES)
