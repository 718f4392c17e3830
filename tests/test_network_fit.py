"""``calib validate --fit network``: the inter-node bus bandwidth the software reached, as a
fraction of the machine's stated one, fitted beside the compute efficiencies and kept only
where the calibration rows identify it (analytic/vfit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from calib.analytic.machine import default_calibration
from calib.analytic.specs import load_hardware
from calib.analytic.timemodel import System
from calib.analytic.validate import validate
from calib.analytic.vfit import scaled_network
from calib.analytic.vtable import read_table

PUB = Path(__file__).parents[1] / "fixtures" / "published"
SC21T2 = PUB / "megatron_sc21_table2_ptdp_vs_zero3.csv"


def test_scaling_moves_only_the_curves_across_nodes():
    hw = load_hardware("dgx-a100-80gb")
    s = System(default_calibration(hw), hw)
    moved = scaled_network(s, 0.2, 0.02)
    for a, b in zip(s.cal.collectives, moved.cal.collectives, strict=True):
        if a.n_nodes > 1:
            assert b.busbw_gbps.value == pytest.approx(0.2 * a.busbw_gbps.value)
            assert b.busbw_gbps.stderr == pytest.approx(0.02 * a.busbw_gbps.value)
        else:
            assert b == a


def test_zero3_rows_predict_each_other_once_the_network_is_fitted():
    """SC21 Table 2, leave-one-out: with the compute efficiencies alone 29.51 % median (the
    ZeRO-3 rows at 768-2240 GPUs far too fast); with the network scale, identified in every
    fold at about 0.2 of the spec's 146 GB/s, 7.08 % (max 24.21 %).  Bound 10 % (observed
    rounded up to 5 %)."""
    df, _ = read_table(SC21T2)
    v = validate(df, str(SC21T2), loo=True, fit_kind="network")
    lo, hi = v.params["net_busbw_scale_range"]
    assert 0.15 < lo <= hi < 0.25
    assert v.summary["median_abs_pct"] < 10.0
    assert validate(df, str(SC21T2), loo=True, fit_kind="compute").summary["median_abs_pct"] > 25.0


def test_without_residual_freedom_the_parameter_the_rows_move_least_goes_first():
    """Every third row of SC21 Table 2 is 4 rows for 4 parameters: with no residual degree of
    freedom no optional parameter can be judged, so the one whose relative change moves
    the calibration rows least goes first (vfit._elasticity): the attention ratio, at one
    sequence length.  With one degree of freedom the element-wise factor (9.08 +- 4.5) falls
    short of t(0.975, 1) = 12.7 and goes next; the network scale is kept (0.154 +- 0.004
    clears t(0.975, 2) = 4.3 by far: the two ZeRO-3 rows at 384 and 640 GPUs see it), and the
    held-out rows come out at 9.25 % median against 34.47 % with the compute fit.  Bounds:
    15 % and 25 % (observed rounded to 5 %)."""
    df, _ = read_table(SC21T2)
    net = validate(df, str(SC21T2), calibrate_on="every-third")
    comp = validate(df, str(SC21T2), calibrate_on="every-third", fit_kind="compute")
    assert net.params["fit"] == "network"  # the default
    assert [n.split()[0] for n in net.params["not_identified"]] == ["attn_eff_ratio", "vector_passes"]
    scale, se = net.params["net_busbw_scale"], net.params["net_busbw_scale_stderr"]
    assert 0.1 < scale < 0.25 and scale >= 4.3 * se
    assert net.summary["median_abs_pct"] < 15.0 < 25.0 < comp.summary["median_abs_pct"]


def test_a_parameter_a_table_cannot_see_does_not_take_another_with_it():
    """The FP8 section runs on one node: inter-node bandwidth moves nothing, the 4-parameter
    fit is singular, and backward elimination drops the network scale first, so the attention
    ratio is judged as in the compute fit (leave-one-out identical)."""
    path = PUB / "mosaicml_llmfoundry_fsdp_h100_fp8.csv"
    df, _ = read_table(path)
    net = validate(df, str(path), loo=True, fit_kind="network").summary["median_abs_pct"]
    assert net == pytest.approx(validate(df, str(path), loo=True).summary["median_abs_pct"], rel=1e-9)


def test_an_unknown_fit_is_one_line_naming_the_choices(tmp_path):
    """A misspelt --fit is refused in one line that names every fit, network included, and
    --save-calibration writes nothing."""
    from tests.conftest import bad

    store = tmp_path / "store"
    err = bad("validate", str(SC21T2), "--fit", "netwrk", "--store", str(store), "--save-calibration", "x")
    assert "'netwrk' is not one of compute, network, gemm, ymax, none" in str(err)
    assert not store.exists() or not any(store.rglob("*.json"))


def test_predict_says_when_zero3_across_nodes_runs_on_the_stated_network(tmp_path):
    """ZeRO-3 over 1536 GPUs on the preset's stated network carries a note that the tables
    which identify the bandwidth put sharded data parallelism well below it; on one node, or
    under a calibration whose network scale was fitted to measured rows, it does not."""
    from tests.conftest import run

    args = ("predict", "--model", "gpt3-175b", "--zero", "3", "--recompute", "full", "--micro-batch", "1")
    note = "ZeRO-3 across nodes is timed at the machine's stated inter-node bus bandwidth"
    assert note in run(*args, "--hardware", "dgx-a100-80gb", "--gpus", "1536").output
    assert note not in run(*args, "--hardware", "dgx-a100-80gb", "--gpus", "8").output
    store = str(tmp_path / "store")
    saved = run(
        "validate",
        str(SC21T2),
        "--calibrate-on",
        "every-third",
        "--save-calibration",
        "sc21",
        "--store",
        store,
    )
    assert "net_busbw_scale 0.15" in saved.output
    assert note not in run(*args, "--calibration", "sc21", "--store", store, "--gpus", "1536").output


def test_the_note_asks_whether_the_zero3_group_itself_crosses_a_node():
    """Ranks are numbered TP innermost, then CP, DP, PP (analytic.placement): a ZeRO-3 group
    spans tp x cp x dp consecutive GPUs, or tp x the shard group with hybrid sharding.  On
    8-GPU DGX nodes, DP 8 under PP 8 (64 GPUs) and a shard group of 8 stay in one node, so
    no note; DP 8 under TP 2 spans 16 GPUs, two nodes, so the note."""
    from tests.conftest import run

    note = "ZeRO-3 across nodes is timed at the machine's stated inter-node bus bandwidth"
    args = (
        "predict",
        "--hardware",
        "dgx-a100-80gb",
        "--model",
        "gpt3-175b",
        "--zero",
        "3",
        "--micro-batch",
        "1",
    )
    pp = run(*args, "--gpus", "64", "--pp", "8", "--recompute", "full", "--global-batch", "64")
    assert pp.exit_code == 0, pp.output
    assert note not in pp.output
    tp = run(*args, "--gpus", "128", "--pp", "8", "--tp", "2", "--recompute", "full", "--global-batch", "64")
    assert tp.exit_code == 0, tp.output
    assert note in tp.output
    hybrid = run(*args, "--gpus", "64", "--shard-group", "8", "--recompute", "full", "--global-batch", "64")
    assert hybrid.exit_code == 0, hybrid.output
    assert note not in hybrid.output
    assert note in run(*args, "--gpus", "64", "--recompute", "full", "--global-batch", "64").output
    both = run(*args, "--gpus", "8,64", "--recompute", "full", "--global-batch", "64")  # one count crosses
    assert both.exit_code == 0 and note in both.output, both.output


def test_search_notes_only_the_zero3_groups_its_top_layouts_spread_over_nodes():
    """The same rule on the layouts ``calib search`` ranks first: ZeRO-3 over all 64 GPUs
    crosses nodes; ZeRO-3 sharded within 8-GPU groups (one DGX node) does not."""
    from tests.conftest import run

    note = "ZeRO-3 across nodes is timed at the machine's stated inter-node bus bandwidth"
    args = ("search", "--hardware", "dgx-a100-80gb", "--model", "gpt-13b", "--gpus", "64", "--zero", "3")
    flat = run(*args, "--global-batch", "512")
    hybrid = run(*args, "--global-batch", "512", "--shard-groups", "8", "--max-tp", "1")
    assert flat.exit_code == 0 and hybrid.exit_code == 0, flat.output + hybrid.output
    assert note in flat.output
    assert note not in hybrid.output


def test_an_unidentified_element_wise_factor_does_not_crowd_out_the_network():
    """A random third of SC21 Table 2 (seed 3: the ZeRO-3 rows at 1536 and 2240 GPUs, the
    530B ZeRO-3 row at 640 and one PTD-P row).  Until stop 21 the element-wise factor was
    always fitted: it ran to its bound (40 +- 330), the network scale (0.204 +- 0.029, one
    degree of freedom) was dropped, and the held-out rows came out at 51.59 % median.  Judged
    like the other optional parameters, the factor goes first and the scale stays: observed
    8.78 %, bound 10 % (rounded up to 5 %)."""
    df, _ = read_table(SC21T2)
    v = validate(df, str(SC21T2), holdout=0.67, seed=3)
    dropped = [n.split()[0] for n in v.params["not_identified"]]
    assert "vector_passes" in dropped and "net_busbw_scale" not in dropped
    assert 0.1 < v.params["net_busbw_scale"] < 0.3
    assert v.summary["median_abs_pct"] < 10.0


def test_the_zero3_note_gives_the_step_at_the_seen_bandwidths():
    """The ZeRO-3 note carries the step with the inter-node busbw at 0.15 and 0.4 of the
    stated one (predict.SHARDED_DP_SCALES, through vfit.scaled_network).  SC21 Table 2's six
    DeepSpeed ZeRO-3 rows, 86.5 % too fast as point predictions on the stated network, all
    lie inside their notes' spans -- disclosed: the span's lower end is in part those rows'
    own network fit (about 0.2), so this is a consistency check, not a validation."""
    import json
    import re

    import pandas as pd
    from calib.analytic import formulas as F

    from tests.conftest import run

    rows = pd.read_csv(SC21T2).query("group == 'zero-3'")
    assert len(rows) == 6
    for r in rows.itertuples():
        args = ("predict", "--hardware", "dgx-a100-80gb", "--d", str(r.d_model), "--l", str(r.n_layers),
                "--a", str(r.n_heads), "--s", str(r.seq_len), "--V", str(r.vocab), "--gpus", str(r.gpus),
                "--zero", "3", "--recompute", "full", "--micro-batch", str(r.micro_batch),
                "--global-batch", str(r.global_batch), "--dp-overlap", "--json")  # fmt: skip
        doc = json.loads(run(*args).output)
        (note,) = [n for n in doc["notes"] if n.startswith("ZeRO-3 across nodes")]
        lo, hi = (float(x) for x in re.search(rf"{r.gpus} GPUs ([\d.]+)-([\d.]+) s", note).groups())
        flops = F.megatron_eq3_flops(r.global_batch, r.seq_len, r.d_model, r.n_layers, r.vocab) / r.gpus
        measured_s = flops / (r.measured_tflops_per_gpu * 1e12)
        assert lo < measured_s < hi, (r.label, lo, measured_s, hi)
        assert doc["configs"][0]["iter_s"] < lo  # the stated network is faster than either end
