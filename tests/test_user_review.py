"""Regressions from a new user's review of README and docs/ (branch review): each test is one
defect that was found by running the documented commands and nonsense input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.core.errors import InputError
from tests.conftest import bad, run

ROOT = Path(__file__).parents[1]
PARTS = ("kernel_transformer_s", "kernel_other_s", "dispatch_intra_s", "dispatch_inter_s", "tp_s", "pp_s",
         "ep_cp_exposed_s", "dp_allreduce_exposed_s", "dp_allgather_exposed_s", "dp_reducescatter_exposed_s",
         "bubble_s", "optimizer_s")  # fmt: skip


def predict_json(*args: str) -> dict:
    return json.loads(run("predict", "--hardware", "dgx-h100", *args, "--json").output)


@pytest.mark.parametrize("cols", ["3", "16"])
def test_search_tp_cols_that_divide_no_tp_is_one_line(cols):
    # was: ValueError traceback (zero-size array) from the empty layout set; gpt-13b's 40
    # heads allow TP 1, 2, 4, 5, 8, 10, 20, 40: neither 3 nor 16 divides any of them
    e = bad("search", "--hardware", "dgx-h100", "--model", "gpt-13b", "--gpus", "64", "--global-batch", "512",
            "--tp-cols", cols)  # fmt: skip
    assert e.where == "--tp-cols" and "40 heads" in e.problem


def test_search_with_no_valid_layout_says_so():
    from calib.analytic.search import COMM_KEYS, _layout_comm

    from calib.commands.output import search_text

    assert _layout_comm(None, None, {k: np.zeros(0, dtype=int) for k in COMM_KEYS}, 8, None) is None
    summary = {"model": "m", "machine": "h", "calibration": "h", "gpus": 64, "global_batch": 3,
               "strategies": 0, "feasible": 0, "seconds": 0.0, "strategies_per_s": 0.0}  # fmt: skip
    text = search_text(summary, pd.DataFrame(), None, [])
    assert "no valid strategy" in text and "fits in device memory" not in text


def test_option_errors_name_the_option_the_user_typed():
    # was: '--seq-len' / '--fmt' (the Python parameter names) for options spelled --s / --format
    assert (
        bad("predict", "--hardware", "dgx-h100", "--model", "gpt-13b", "--gpus", "8", "--s", "0").where
        == "--s"
    )
    assert (
        bad("predict", "--hardware", "dgx-h100", "--model", "gpt-13b", "--gpus", "8", "--l", "0").where
        == "--l"
    )
    sc21 = str(ROOT / "fixtures" / "published" / "megatron_sc21_table1_weak_scaling.csv")
    assert bad("validate", sc21, "--format", "foo").where == "--format"


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_capacity_factor_rejects_non_finite(value):
    e = bad(
        "predict",
        "--hardware",
        "dgx-h100",
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "64",
        "--capacity-factor",
        value,
    )
    assert e.where == "--capacity-factor"


CSV = """label,hardware,d_model,n_layers,n_heads,seq_len,vocab,gpus,tp,pp,micro_batch,global_batch,measured_iter_s
a,{hw},4096,32,32,2048,51200,64,8,1,1,{gb},2.0
"""


def test_validate_bad_hardware_column_names_file_row_and_column(tmp_path):
    # was: 'calib: --hardware: unknown hardware ...' although no --hardware was given
    f = tmp_path / "t.csv"
    f.write_text(CSV.format(hw="dgx-h999", gb=64))
    e = bad("validate", str(f), "--fit", "none")
    assert e.where == str(f) and e.problem.startswith("row 1: column 'hardware': unknown hardware 'dgx-h999'")


def test_validate_messages_name_the_file_and_plain_values(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text(CSV.format(hw="dgx-h100", gb=-64))
    assert bad("validate", str(f), "--fit", "none").problem.endswith("got '-64'")  # was np.int64(-64)
    g = tmp_path / "hdr.csv"
    g.write_text("a,b,c\n1,2,3\n")
    e = bad("validate", str(g))
    assert e.where == str(g) and "unrecognised table" in e.problem  # was: no file named


def test_breakdown_adds_up_with_uneven_pipeline_stages():
    # gpt-1.3b: 24 layers on PP 5 (stages of 5,5,5,5,4): the LM head fits in the last stage's
    # spare layer; the breakdown charged all of it (0.0631 s of parts for a 0.0578 s iteration)
    c = predict_json("--model", "gpt-1.3b", "--gpus", "40", "--pp", "5", "--global-batch", "40")["configs"][0]
    assert sum(c[k] for k in PARTS) == pytest.approx(c["iter_s"], rel=1e-9)


def test_energy_times_the_same_strategy_as_the_time_model():
    # was: --energy rebuilt the strategy without CP/EP/FP8/schedule: llama3-70b CP 2 on 512 GPUs
    # got 1.83 s per iteration in the energy columns against iter_s 0.86 s, and the energy of 256 GPUs
    out = predict_json("--model", "llama3-70b", "--gpus", "512", "--tp", "8", "--pp", "4", "--cp", "2",
                       "--seq-parallel", "--s", "8192", "--energy")  # fmt: skip
    c = out["configs"][0]
    static_w = float(re.search(r"static_w ([\d.]+)", " ".join(out["notes"])).group(1))
    assert c["clock_scale"] == 1.0 and c["time_s_at_clock"] == pytest.approx(c["iter_s"], rel=1e-9)
    assert c["energy_kj_per_iter"] == pytest.approx(512 * c["energy_j_per_gpu"] / 1e3)
    # E = P_static t + dynamic terms >= P_static t, per GPU and at the optimal clock for all GPUs
    assert c["energy_j_per_gpu"] >= static_w * c["time_s_at_clock"]
    assert c["energy_kj_per_iter_opt"] * 1e3 >= static_w * c["time_s_opt"] * 512


def test_power_samples_bad_values_name_their_row(tmp_path):
    # was: every bad value reported at row 1; utilisation 500 % and inf were fitted silently
    from calib.calibrate.power import read_power_samples

    lines = (ROOT / "fixtures" / "power" / "nvml_samples_a100.csv").read_text().splitlines()
    head, rows = lines[:2], lines[2:]
    for col, value, row, words in (("power_w", "-5", 6, "-5.0 in row 6"), ("power_w", "inf", 3, "inf in row 3"),
                                   ("gpu_util_pct", "500", 2, "500 in row 2 is not 0..100")):  # fmt: skip
        i = head[1].split(",").index(col)
        cells = rows[row - 1].split(",")
        cells[i] = value
        f = tmp_path / f"{col}{row}.csv"
        f.write_text("\n".join(head + rows[: row - 1] + [",".join(cells)] + rows[row:]) + "\n")
        with pytest.raises(InputError) as exc:
            read_power_samples(f)
        assert exc.value.where == str(f) and exc.value.problem == f"column {col}: value {words}" + (
            "" if col.endswith("_pct") else " is not finite and >= 0"
        )


def test_energy_optimum_of_a_device_without_clock_range_is_relative():
    # was: 'opt MHz 1' (f_opt_mhz 0.53) for B200, whose energy.yaml entry states no clock range
    out = predict_json("--model", "llama3-8b", "--gpus", "8", "--energy")
    assert "f_opt_mhz" in out["configs"][0]  # dgx-h100: 297..1980 MHz (energy.yaml)
    out = json.loads(run("predict", "--hardware", "b200", "--model", "llama3-8b", "--gpus", "8", "--energy",
                         "--json").output)  # fmt: skip
    c = out["configs"][0]
    assert "f_opt_mhz" not in c and "f_fastest_mhz" not in c and 0.15 <= c["f_opt_scale"] <= 1.0
    assert any("fraction of the top clock" in n for n in out["notes"])
    text = run("predict", "--hardware", "b200", "--model", "llama3-8b", "--gpus", "8", "--energy").output
    assert "opt f/fmax" in text and "opt MHz" not in text


def test_moe_shape_errors_name_the_option():
    # was: 'calib: mixtral-8x7b: top_k must be ...' (the model and the field, not the option)
    base = ("predict", "--hardware", "dgx-h100", "--model", "mixtral-8x7b", "--gpus", "64")
    e = bad(*base, "--top-k", "9")
    assert e.where == "--top-k" and e.problem == "top_k must be in 1..n_experts=8, got 9"
    assert bad(*base, "--dense-layers", "99").where == "--dense-layers"


def test_calibration_path_that_is_a_directory(tmp_path):
    e = bad("predict", "--calibration", str(tmp_path), "--model", "gpt-13b", "--gpus", "8")
    assert e.where == str(tmp_path) and e.problem.startswith("is a directory, not a calibration file")


@pytest.mark.parametrize("factor", ["nan", "inf", "1"])
def test_bench_step_factor_must_be_finite_above_one(factor):
    # was: -f nan ran (and stored) a one-size benchmark
    from calib.ingest.capture.bench_collectives import CollectiveBenchConfig

    with pytest.raises(InputError) as exc:
        CollectiveBenchConfig(step_factor=float(factor))
    assert exc.value.where == "step_factor" and "finite number > 1" in exc.value.problem


def test_bench_gemm_repeats_error_names_repeats():
    e = bad("bench", "gemm", "--system", "x", "-r", "0", "--store", "/nonexistent-calib-store")
    assert e.where == "--repeats"


def test_validate_runs_of_an_unknown_system_names_runs(tmp_path):
    e = bad("validate", "--runs", "nope", "--store", str(tmp_path))
    assert e.where == "--runs" and "no calibration for system 'nope'" in e.problem  # was '--system'


def test_validate_runs_refuses_a_table_too_and_a_calibration_without_a_device_model(tmp_path):
    """A table given beside --runs, and a calibration with no device model (here one saved
    by a table's fit): one line naming --runs each, and the store left as it was."""
    table = str(ROOT / "fixtures" / "published" / "megatron_sc21_table1_weak_scaling.csv")
    run(
        "validate",
        table,
        "--calibrate-on",
        "every-third",
        "--save-calibration",
        "sc21",
        "--store",
        str(tmp_path),
    )
    before = sorted(p.name for p in tmp_path.rglob("*"))
    e = bad("validate", table, "--runs", "sc21", "--store", str(tmp_path))
    assert e.where == "--runs" and e.problem == "give either a TABLE or --runs SYSTEM"
    e = bad("validate", "--runs", "sc21", "--store", str(tmp_path))
    assert e.where == "--runs" and "the calibration of sc21 has no device model" in e.problem
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("axis", [("--nvlink-domain", "8"), ("--offload-gbps", "100")])
def test_objective_with_a_time_only_axis_is_refused(axis):
    # was: --objective energy/cost silently ignored (ranked by placed / offload time)
    e = bad("search", "--hardware", "dgx-h100", "--model", "gpt-13b", "--gpus", "64", "--global-batch", "512",
            *axis, "--objective", "energy")  # fmt: skip
    assert e.where == "--objective" and axis[0] in e.problem


def test_power_file_without_energy_is_refused():
    power = str(ROOT / "fixtures" / "power" / "nvml_samples_a100.csv")  # never read: refused first
    e = bad("predict", "--hardware", "dgx-h100", "--model", "gpt-13b", "--gpus", "8", "--power", power)
    assert e.where == "--power"
    e = bad("search", "--hardware", "dgx-h100", "--model", "gpt-13b", "--gpus", "64", "--global-batch", "512",
            "--power", power)  # fmt: skip
    assert e.where == "--power"


def test_bad_run_name_message_reads_run_name(tmp_path):
    e = bad("ingest", str(ROOT / "fixtures" / "nccl-tests" / "polaris"), "--system", "s", "--name", "a/b",
            "--store", str(tmp_path))  # fmt: skip
    assert e.where == "--name" and "is not a valid run name" in e.problem  # was 'valid name name'
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    "model, args, option, words",
    [
        ("gpt-13b", ("--cp", "3"), "--cp", "CP=3 needs the sequence 1024 divisible by 2 x CP"),
        ("mixtral-8x7b", ("--ep", "3"), "--ep", "EP=3 does not divide the 8 experts"),
        ("gpt-13b", ("--ep", "2"), "--ep", "gpt-13b is dense"),
    ],
)
def test_search_axis_values_no_layout_can_take_are_refused(model, args, option, words):
    # was (before this branch): a ValueError traceback from the empty layout set; then an empty search
    e = bad(
        "search", "--hardware", "dgx-h100", "--model", model, "--gpus", "64", "--global-batch", "512", *args
    )
    assert e.where == option and words in e.problem


def test_offload_results_without_seeds_is_refused(tmp_path):
    # was: ignored, and the report written anyway
    junk = tmp_path / "x.json"
    junk.write_text("[1]")
    e = bad("report", "--system", "s", "--store", str(tmp_path), "--offload-results", str(junk), "--out",
            str(tmp_path / "r"))  # fmt: skip
    assert e.where == "--offload-results" and not (tmp_path / "r").exists()
    e = bad("report", "--seeds", "--offload-results", str(junk), "--out", str(tmp_path / "r"))
    assert e.where == str(junk) and "'family' and 'bandwidth'" in e.problem and not (tmp_path / "r").exists()


def test_h800_has_power_data_as_default():
    # was: 'no power data for device NVIDIA H800-SXM5-80GB' (the preset of the DeepSeek-V3 validation)
    out = json.loads(run("predict", "--hardware", "h800", "--model", "gpt-13b", "--gpus", "64", "--energy",
                         "--json").output)  # fmt: skip
    notes = " ".join(out["notes"])
    assert "power_cap_w 700 (default)" in notes and out["configs"][0]["power_w_per_gpu"] <= 700


def test_predict_energy_equals_the_search_energy_of_the_same_strategy():
    # the search times MoE/CP/DualPipe/FP8 strategies in full; predict --energy used to drop those knobs
    common = ("--hardware", "dgx-h100", "--model", "mixtral-8x7b", "--s", "4096", "--global-batch", "1024",
              "--gpus", "512", "--precision", "fp8")  # fmt: skip
    r = json.loads(run("search", *common, "--cp", "1,2", "--schedules", "1f1b,dualpipe", "--objective", "energy",
                       "--top", "1", "--json").output)["top"][0]  # fmt: skip
    args = [*common, "--tp", str(r["tp"]), "--cp", str(r["cp"]), "--pp", str(r["pp"]), "--ep", str(r["ep"]),
            "--micro-batch", str(r["micro_batch"]), "--interleave", str(r["interleave"]), "--schedule",
            r["schedule"], "--zero", str(r["zero"]), "--recompute", r["recompute"], "--energy", "--json"]  # fmt: skip
    args += ["--seq-parallel"] * bool(r["seq_parallel"]) + ["--dp-overlap"] * bool(r["dp_overlap"])
    c = json.loads(run("predict", *args).output)["configs"][0]
    assert r["cp"] > 1 or r["schedule"] != "1f1b"  # the knobs the energy model used to drop
    assert c["iter_s"] == pytest.approx(r["iter_s"], rel=1e-9)
    assert c["energy_j_per_token"] == pytest.approx(r["energy_j_per_token"], rel=1e-9)


def test_schedule_errors_name_the_failing_condition():
    # was: 'ZB-H1 needs PP > 1 and micro-batches (16) >= PP=1' (true) when PP = 1 was the problem
    base = (
        "predict",
        "--hardware",
        "dgx-h100",
        "--model",
        "gpt-13b",
        "--gpus",
        "64",
        "--global-batch",
        "1024",
    )
    assert bad(*base, "--schedule", "zb-h1").problem == "ZB-H1 needs pipeline parallelism (PP > 1), got PP=1"
    assert (
        bad(*base, "--schedule", "dualpipe").problem
        == "DualPipe needs pipeline parallelism (PP > 1), got PP=1"
    )
    assert bad(*base, "--pp", "8", "--schedule", "zb-h1", "--global-batch", "8").problem == (
        "ZB-H1 needs micro-batches (1) >= PP=8"
    )
