"""The validation defects of issue 14, each on real inputs or a hand-worked formula.

a. mosaicml adapter: exact GPU names, the row's own FSDP sharding, unknown values refused;
b. ``--hardware`` against the table's hardware column: refused, or overridden per row;
c. ZeRO-3 collectives hide only up to an overlap fraction (analytic.zero_overlap);
d. memory verdicts name the overflowing term; validation counts trained rows predicted OOM;
e. fitted parameters on a bound are a warning;
f. ``--save-calibration NAME`` round trip through ``calib predict/search --calibration NAME``;
g. ``--calibrate-on every-third``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from calib.analytic import zero_overlap as ZO
from calib.analytic.memory import overflow_term
from calib.analytic.validate import select_rows, validate
from calib.analytic.vtable import read_table

from calib.core.errors import InputError
from tests.conftest import bad, run

PUB = Path(__file__).parents[1] / "fixtures" / "published"
SC21 = PUB / "megatron_sc21_table1_weak_scaling.csv"
MLM = PUB / "megatron_readme_2020_tp_dp_scaling_iteration_times.csv"
MOSAIC = PUB / "mosaicml_llmfoundry_fsdp_a100.csv"


def _mosaic(tmp_path: Path, **cols) -> Path:
    """The first three rows of the real llm-foundry table with some columns replaced."""
    df = pd.read_csv(MOSAIC).head(3)
    for k, v in cols.items():
        df[k] = v
    f = tmp_path / "mosaic.csv"
    df.to_csv(f, index=False)
    return f


# ---- a. mosaicml adapter ------------------------------------------------------------------
def test_mosaic_gpu_names_map_exactly(tmp_path):
    df, _ = read_table(_mosaic(tmp_path, GPU=["h100_80gb", "a100_80gb", "a100_40gb"]))
    # h100_80gb used to contain "80" and become an A100 system
    assert df["hardware"].tolist() == ["dgx-h100", "dgx-a100-80gb", "dgx-a100-40gb"]
    err = pytest.raises(InputError, read_table, _mosaic(tmp_path, GPU="v100_32gb")).value
    assert "'v100_32gb'" in err.problem and "GPU" in err.problem and err.where.endswith("mosaic.csv")


def test_mosaic_models_each_rows_sharding(tmp_path):
    df, _ = read_table(
        _mosaic(tmp_path, **{"Sharding Strategy": ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"]})
    )
    assert df["zero"].tolist() == [3, 2, 0]
    # hybrid sharding: ZeRO-3 / ZeRO-2 inside a DGX node (8 GPUs), replicated across nodes
    hybrid = {"Sharding Strategy": ["HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "FULL_SHARD"]}
    df, _ = read_table(_mosaic(tmp_path, **hybrid))
    assert df["zero"].tolist() == [3, 2, 3] and df["shard_group"].tolist() == [8, 8, 0]
    err = pytest.raises(
        InputError, read_table, _mosaic(tmp_path, **{"Sharding Strategy": "HYBRID_SHARD_ZERO9"})
    ).value
    assert "'HYBRID_SHARD_ZERO9'" in err.problem and "Sharding Strategy" in err.problem


# ---- b. --hardware against the table's hardware column ------------------------------------
def test_hardware_disagreement_is_refused_or_recorded_per_row():
    err = bad("validate", str(SC21), "--calibrate-on", "every-third", "--hardware", "dgx-h100")
    assert err.where == "--hardware" and "'dgx-a100-80gb'" in err.problem and "'dgx-h100'" in err.problem
    out = json.loads(
        run("validate", str(SC21), "--calibrate-on", "every-third", "--hardware", "dgx-h100",
            "--override-hardware", "--json").output
    )  # fmt: skip
    assert {r["hardware_override"] for r in out["per_row"]} == {"table: dgx-a100-80gb -> dgx-h100"}
    # the same machine under another name (alias selene) is no disagreement
    out = json.loads(run("validate", str(SC21), "--fit", "none", "--hardware", "selene", "--json").output)
    assert {r["hardware_override"] for r in out["per_row"]} == {""}


# ---- c. ZeRO-3 overlap fraction -----------------------------------------------------------
def test_zero3_overlap_fraction_hand_worked():
    f = ZO.ZERO3_OVERLAP_FRACTION
    assert f == 0.75
    # long collectives: 10 s under 4 s of compute -> 10 - 0.75 * 4 = 7 s exposed
    assert ZO.exposed_s(10.0, 4.0) == pytest.approx(7.0)
    # short collectives: 2 s under 8 s -> max(2 - 6, 0.25 * 2) = 0.5 s (never fully hidden)
    assert ZO.exposed_s(2.0, 8.0) == pytest.approx(0.5)
    # the limits: f = 1 is the old perfect hiding, f = 0 no overlap
    assert ZO.exposed_s([2.0, 10.0], [8.0, 4.0], 1.0) == pytest.approx([0.0, 6.0])
    assert ZO.exposed_s(3.0, 100.0, 0.0) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        ZO.exposed_s(1.0, 1.0, 1.5)


def test_zero3_dp_only_exposes_a_quarter_of_short_collectives():
    from calib.analytic.machine import default_calibration
    from calib.analytic.specs import load_hardware, load_model
    from calib.analytic.strategy import Strategies
    from calib.analytic.timemodel import System, comm_times, evaluate

    hw = load_hardware("dgx-a100-80gb")
    system = System(default_calibration(hw), hw)
    model = load_model("gpt-6.7b")
    gpus = np.array([64, 256, 1024])
    st = Strategies.of(tp=1, pp=1, dp=gpus, micro_batch=4, global_batch=4096, zero=3, recompute=2,
                       dp_overlap=True, flash_attention=True)  # fmt: skip
    r = evaluate(model, system, st)
    c = comm_times(model, system, st)
    m = r["microbatches"]
    exposed = r["dp_allgather_exposed_s"] + r["dp_reducescatter_exposed_s"]
    # full recompute: 3 gathers + 1 reduce-scatter per micro-batch; short against the compute
    # on 64 and 256 GPUs, so exactly (1 - 0.75) of them is exposed (before: 0 s, "flat"); on
    # 1024 the 161 gathers' latency outlasts what the compute can cover (the other branch)
    quarter = m * 0.25 * (3.0 * c["dp_ag_z3_s"] + c["dp_rs_z3_s"])
    assert exposed[:2] == pytest.approx(quarter[:2], rel=1e-9)
    assert exposed[2] > quarter[2]
    assert (exposed > 0).all()
    # DeepSpeed's ZeRO-3 gathers tensor by tensor: L x 4 weight matrices + the embedding
    # (analytic.zero_overlap.collective_counts), each of 1 / (4 L + 1) of the fp16 shard,
    # every one paying the ring's latency over the DP group
    from calib.analytic.comm import group_time_s
    from calib.analytic.timemodel import stage_params

    from calib.core.collective_names import ALLGATHER

    shard = 2.0 * stage_params(model.d_model, model.n_layers, model.seq_len, model.vocab, 1.0, 1.0)
    n_ds = 4 * model.n_layers + 1
    per = group_time_s(system.cal, ALLGATHER, shard / n_ds, gpus.astype(float), 8.0)
    assert c["dp_ag_z3_s"] == pytest.approx(n_ds * per, rel=1e-12)
    assert (c["dp_ag_z3_s"] > c["dp_ag_s"]).all()  # 128 more latencies than one whole-shard gather
    tflops = r["model_tflops_per_gpu"]
    assert tflops[0] > tflops[1] > tflops[2]  # strong scaling: the exposed share grows


# ---- d. memory verdicts -------------------------------------------------------------------
def test_overflow_term_names_the_largest_term():
    gb = 1e9
    mem = {
        "mem_weights_bytes": np.array([10, 10, 1]) * gb,
        "mem_grads_bytes": np.array([5, 5, 1]) * gb,
        "mem_optimizer_bytes": np.array([30, 50, 1]) * gb,
        "mem_activations_bytes": np.array([60, 20, 30]) * gb,  # with the logits
        "mem_logits_bytes": np.array([10, 0, 25]) * gb,
    }
    mem["mem_total_bytes"] = sum(mem[k] for k in list(mem)[:4])  # 105, 85, 33 GB
    # 50 GB of activations beat 30 of optimizer; 50 optimizer; the last fits in 80 GB
    assert overflow_term(mem, 80 * gb).tolist() == ["activations", "optimizer", ""]
    assert overflow_term(mem, 30 * gb).tolist() == ["activations", "optimizer", "logits"]


def test_validation_counts_trained_rows_predicted_oom():
    df, _ = read_table(MOSAIC)
    # the 80 GB rows run on 40 GB GPUs: some of them cannot fit
    out = json.loads(
        run("validate", str(MOSAIC), "--calibrate-on", "every-third", "--hardware", "dgx-a100-40gb",
            "--override-hardware", "--json").output
    )  # fmt: skip
    s, rows = out["summary"], pd.DataFrame(out["per_row"])
    assert s["n_rows"] == 139 and s["n_predicted_oom"] == int(rows["oom"].sum()) > 0
    assert sum(s["predicted_oom_terms"].values()) == s["n_predicted_oom"]
    assert set(rows.loc[rows["oom"], "oom_term"]) <= {
        "weights",
        "grads",
        "optimizer",
        "activations",
        "logits",
    }
    assert (rows.loc[~rows["oom"], "oom_term"] == "").all()
    # 30B on 8 GPUs, ZeRO-3: 16 bytes x 30e9 / 8 = 60 GB of model states, 45 of them optimizer
    r = rows.set_index("label").loc["mosaic-30b-s2048-8xa100_80gb"]
    assert r["oom"] and r["oom_term"] == "optimizer"
    text = run("validate", str(MOSAIC), "--calibrate-on", "every-third").output
    res = validate(df, str(MOSAIC), calibrate_on="every-third")
    assert f"memory: {res.summary['n_predicted_oom']} of 139 measured (trained) configurations" in text


# ---- e. parameters on their bounds --------------------------------------------------------
def test_parameter_on_its_bound_is_a_warning():
    df, _ = read_table(MOSAIC)
    res = validate(df, str(MOSAIC), calibrate_on="every-third")
    # the llm-foundry A100 rows want a GEMM plateau above the A100's measured achievable
    # matmul (271.2 of 312 TFLOP/s = 0.8692), its physical cap
    assert res.params["gemm_y_max"] == pytest.approx(271.2 / 312, rel=1e-4)
    assert res.params["at_bound"] == ["gemm_y_max = 0.8692 is at its upper bound 0.8692"]
    assert (
        "warning: fitted gemm_y_max = 0.8692 is at its upper bound 0.8692"
        in run("validate", str(MOSAIC), "--calibrate-on", "every-third").output
    )
    sc21, _ = read_table(SC21)
    assert validate(sc21, str(SC21), calibrate_on="every-third").params["at_bound"] == []


def test_leave_one_out_names_each_bound_once_with_its_fold_count():
    """Leave-one-out fits the table once per row; a parameter on a bound in several folds is
    one warning with its count and value range, not one line per fold's value."""
    df, _ = read_table(MLM)
    n = len(df)
    res = validate(df, str(MLM), loo=True)
    lines = res.params["at_bound"]
    assert len(lines) == len({line.split(" = ")[0] for line in lines}), lines
    # the inter-node scale ends on its bound in most folds (the GEMM plateau did until stop 31,
    # when the V100 rows stopped being held to the A100's achievable matmul)
    scale = [line for line in lines if line.startswith("net_busbw_scale = ")]
    assert len(scale) == 1 and scale[0].endswith(f" of {n} folds"), lines
    k = int(scale[0].split(" in ")[-1].split(" of ")[0])
    assert 1 <= k <= n


# ---- f. --save-calibration round trip -----------------------------------------------------
def test_save_calibration_round_trip(tmp_path):
    store = str(tmp_path / "store")
    args = ("validate", str(SC21), "--calibrate-on", "every-third", "--store", store, "--json")
    out = json.loads(run(*args, "--save-calibration", "sc21fit").output)
    assert out["saved_calibration"] == str(tmp_path / "store" / "sc21fit" / "sc21fit.calib.json")
    err = bad(*args, "--save-calibration", "sc21fit")
    assert err.where == "--save-calibration" and "--replace" in err.problem
    run(*args, "--save-calibration", "sc21fit", "--replace")
    assert (
        "one fit" in bad("validate", str(SC21), "--loo", "--store", store, "--save-calibration", "x").problem
    )

    # predict the SC21 1T row with the stored calibration: the validation's own prediction,
    # on the hardware the fit ran on (stored with it) or named again
    row = next(r for r in out["per_row"] if r["label"] == "sc21-1T")
    shape = ("--d", "25600", "--l", "128", "--a", "160", "--s", "2048", "--V", "51200", "--gpus", "3072",
             "--tp", "8", "--pp", "64", "--micro-batch", "1", "--global-batch", "3072", "--recompute", "full")  # fmt: skip
    for hw in ((), ("--hardware", "dgx-a100-80gb")):
        pred = json.loads(
            run("predict", "--calibration", "sc21fit", "--store", store, *hw, *shape, "--json").output
        )
        assert pred["hardware"]["name"] == "dgx-a100-80gb"
        assert pred["configs"][0]["iter_s"] == pytest.approx(row["pred_iter_s"], rel=1e-9)
    text = run("search", "--calibration", "sc21fit", "--store", store, "--model", "gpt3-175b", "--gpus", "64",
               "--top", "3").output  # fmt: skip
    assert "sc21fit" in text


# ---- g. every third row -------------------------------------------------------------------
def test_every_third_is_by_position():
    df, _ = read_table(SC21)
    assert np.flatnonzero(select_rows(df, "every-third")).tolist() == [0, 3, 6, 9]
    assert (select_rows(df, "every-third") == select_rows(df, "1,4,7,10")).all()


# ---- g. uneven pipeline stages ------------------------------------------------------------
def test_uneven_stage_layers_hand_worked():
    from calib.analytic import uneven as U

    # 126 layers over 16 stages: 14 stages of 8, the last two of 7 (14 * 8 + 2 * 7 = 126)
    n_max, n_last = U.stage_layers([126, 128, 40], [16, 16, 3])
    assert n_max.tolist() == [8, 8, 14] and n_last.tolist() == [7, 8, 13]
    # the last stage: 7 layers of 2 s + a 3 s head = 17 s against 8 x 2 = 16 s: 1 s excess
    assert U.head_excess_s(3.0, 2.0, 8, 7) == pytest.approx(1.0)
    assert U.head_excess_s(1.5, 2.0, 8, 7) == pytest.approx(0.0)  # the full stages set the pace
    assert U.head_excess_s(3.0, 2.0, 8, 8) == pytest.approx(3.0)  # even: the head adds in full


def test_uneven_stages_slowest_stage_sets_the_pace():
    from dataclasses import replace

    from calib.analytic.machine import default_calibration
    from calib.analytic.specs import load_hardware, load_model
    from calib.analytic.strategy import Strategies, check_config
    from calib.analytic.timemodel import System, evaluate

    hw = load_hardware("dgx-h100")
    system = System(default_calibration(hw), hw)
    base = load_model("gpt3-175b")
    st = Strategies.of(tp=1, pp=16, dp=8, micro_batch=1, global_batch=512, recompute=2)
    m = 512 / 8
    assert check_config(replace(base, n_layers=126), 128, 1, 16, 1, 512, recompute=2) == 8
    r = {L: evaluate(replace(base, n_layers=L), system, st) for L in (112, 126, 128)}
    layer = (r[128]["compute_s"] - r[112]["compute_s"]) / m  # one layer, one micro-batch (TP = 1)
    head = r[128]["compute_s"] / m - 8 * layer
    # 128 = 16 x 8: the last stage runs 8 layers + head; 126: 7 layers + head (or 8 layers)
    assert r[128]["iter_s"] - r[126]["iter_s"] == pytest.approx(m * min(head, layer), rel=1e-6)
    assert r[112]["iter_s"] < r[126]["iter_s"] < r[128]["iter_s"]


def test_hbm_capacity_is_binary_and_every_trained_mosaic_row_fits():
    from calib.analytic.specs import load_hardware

    # nvidia-smi: an A100 40GB has 40960 MiB, an A100 80GB 81920 MiB
    assert load_hardware("dgx-a100-40gb").hbm_bytes == 40960 * 2**20
    assert load_hardware("dgx-a100-80gb").hbm_bytes == 81920 * 2**20
    df, _ = read_table(MOSAIC)
    # every row of the table trained; with decimal GB nine of them (activations, 0.3-1.2 GB
    # over 40 / 80 GB) were said not to fit
    assert validate(df, str(MOSAIC), fit_kind="none").summary["n_predicted_oom"] == 0


def test_summary_says_what_no_fit_gives_on_the_same_rows():
    df, _ = read_table(SC21)
    res = validate(df, str(SC21), calibrate_on="every-third")
    none = validate(df, str(SC21), fit_kind="none").rows
    held = (res.rows["role"] == "held-out").to_numpy()
    assert res.summary["unfitted_median_abs_pct"] == pytest.approx(
        np.median(np.abs(none.loc[held, "err_pct"]))
    )
    # with the A100's measured achievable matmul as the default plateau the stated defaults do
    # better here than the 4-row fit (1.27 vs 3.05 %), and the output must say so
    assert res.summary["unfitted_median_abs_pct"] < res.summary["median_abs_pct"]
    text = run("validate", str(SC21), "--calibrate-on", "every-third").output
    assert "warning: the same rows without the fit" in text and "(the fit does worse than none)" in text


def test_predict_oom_verdict_names_the_term():
    out = run("predict", "--hardware", "tg40", "--model", "gpt-6.7b", "--gpus", "8,512", "--zero", "1").output
    # 8 GPUs: fp16 weights and grads 13.3 GB each lead 10 GB of optimizer and activations
    assert "OOM: weights" in out and "8 GPUs (weights the largest term) exceed device memory" in out


@pytest.mark.parametrize(
    ("table", "median_max", "max_max"),
    [  # --calibrate-on every-third, reached (docs/analytic.md): a regression fails
        (SC21, 3.1, 4.1),  # 3.05 / 4.05
        # 1.67 / 6.67 and 2.98 / 11.99 before stop 21 kept the element-wise factor only where
        # the rows identify it; then 3.90 / 10.24 and 4.81 / 8.69
        (PUB / "korthikanti2022_table5_iteration_times.csv", 4.1, 10.8),
        # 3.11 / 13.02 since stop 31 (the A100 40GB's achievable matmul, each device held to its
        # own): the max is the 8B row at 1,024 GPUs, 4x beyond the calibration rows, inside its
        # 90 % interval
        (MLM, 3.2, 13.1),
        # 9.11 / 38.51 before flash's recomputing backward, the fitted attention ratio and the
        # y_max cap at the A100's measured achievable matmul (0.869, reached: warned); now 4.26 / 39.70
        (MOSAIC, 4.3, 39.8),
    ],
)
def test_every_third_heldout_bounds(table, median_max, max_max):
    df, _ = read_table(table)
    s = validate(df, str(table), calibrate_on="every-third").summary
    assert s["median_abs_pct"] <= median_max and s["max_abs_pct"] <= max_max
    assert s["n_predicted_oom"] == 0  # every row of these tables trained


def test_api_refuses_the_disagreement_too():
    import calib

    h100 = calib.SystemModel.from_hardware("dgx-h100")
    with pytest.raises(InputError, match="'dgx-a100-80gb'.*'dgx-h100'"):
        calib.validate(SC21, model=h100, calibrate_on="every-third")
    res = calib.validate(SC21, model=h100, calibrate_on="every-third", override_hardware=True)
    assert set(res.rows["hardware_override"]) == {"table: dgx-a100-80gb -> dgx-h100"}


def test_leave_one_out_shows_progress_on_a_terminal(monkeypatch):
    """A long leave-one-out (one fit per row) draws a progress bar on a terminal, and nothing
    when stderr is piped or the table is short; the folds and their order are unchanged."""
    import sys

    from calib.commands.validate import _folds

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert _folds(range(139)) == range(139)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = _folds(range(139))
    assert type(bar).__name__ == "tqdm" and list(bar) == list(range(139))
    assert _folds(range(12)) == range(12)
