"""Prediction intervals from a validation fit (analytic/fit_interval.py): the regression
interval t_{0.95, n-k} sqrt(s^2 + sigma_p^2) in log time, checked by hand and against the
held-out rows of the llm-foundry tables, which the fit never saw."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from calib.analytic import fit_interval as FI
from calib.analytic.validate import validate
from calib.analytic.vtable import read_table
from scipy import stats

from tests.conftest import run

PUB = Path(__file__).parents[1] / "fixtures" / "published"
A100 = PUB / "mosaicml_llmfoundry_fsdp_a100.csv"


def test_half_width_is_the_regression_prediction_interval():
    """n = 21 rows, k = 3 parameters, rms log residual 0.064: s^2 = 21 x 0.064^2 / 18 and
    t_{0.95, 18} = 1.734; with a parameter error of 0.05 it adds in quadrature."""
    s2 = 21 * 0.064**2 / 18
    t = stats.t.ppf(0.95, 18)
    assert FI.half_width(0.0, 0.064, 21, 3) == pytest.approx(t * np.sqrt(s2), rel=1e-12)
    assert FI.half_width(0.05, 0.064, 21, 3) == pytest.approx(t * np.sqrt(s2 + 0.05**2), rel=1e-12)
    assert FI.half_width(0.05, 0.064, 3, 3) is None  # no residual degree of freedom: no interval


def test_held_out_rows_fall_inside_their_90_percent_interval_about_as_often():
    """Fit on every third row of the A100 table (47 rows, 3 parameters), interval on the 92
    others: observed 86 of 92 inside (93 %), median half-width 12.9 %.  Too narrow an interval
    (coverage under 80 %) or a uselessly wide one (median over 25 %) fails."""
    df, _ = read_table(A100)
    v = validate(df, str(A100), calibrate_on="every-third")
    s = v.summary
    assert s["n_heldout"] == 92
    assert 0.80 <= s["n_inside_interval"] / 92 <= 1.0
    assert 5.0 < s["median_interval_pct"] < 25.0
    held = v.rows[v.rows["role"] == "held-out"]
    # inside means |log(measured time / predicted time)| within the half-width
    ratio = held["predicted"] / held["measured"]  # a rate: measured time / predicted time
    half = np.log1p(held["interval_pct"] / 100.0)
    assert ((np.abs(np.log(ratio)) <= half) == held["inside"]).all()


def test_predict_with_a_saved_fit_carries_the_interval(tmp_path):
    """--save-calibration, then predict: iter_s_lo < iter_s < iter_s_hi, the same half-width
    in log time on both sides, and a note saying what it holds."""
    store = str(tmp_path / "store")
    h100 = PUB / "mosaicml_llmfoundry_fsdp_h100_bf16.csv"  # one hardware: one calibration
    run(
        "validate", str(h100), "--calibrate-on", "every-third", "--store", store, "--save-calibration", "h100"
    )
    out = run(
        "predict", "--calibration", "h100", "--store", store, "--model", "mpt-7b", "--s", "2048",
        "--gpus", "8", "--micro-batch", "6", "--zero", "3", "--zero-impl", "fsdp", "--dp-overlap",
        "--flash-attention", "--json",
    ).output  # fmt: skip
    d = json.loads(out)
    c = d["configs"][0]
    assert c["iter_s_lo"] < c["iter_s"] < c["iter_s_hi"]
    assert np.log(c["iter_s_hi"] / c["iter_s"]) == pytest.approx(
        np.log(c["iter_s"] / c["iter_s_lo"]), rel=1e-9
    )
    assert any("validation fit's parameter errors" in n for n in d["notes"])


def test_no_interval_without_residual_degrees_of_freedom():
    """Llama 3's every-third split fits y_max alone to its one row: nothing left to measure the
    scatter with, so no interval and no coverage line."""
    path = PUB / "llama3_405b_table4_scaling.csv"
    df, _ = read_table(path)
    v = validate(df, str(path), calibrate_on="every-third")
    assert "n_inside_interval" not in v.summary and "inside" not in v.rows
    # an exact fit has no residual to estimate an error from: no standard error (it was
    # reported as +- 1e-08 before stop 25, a false certainty), and a note that says why
    assert v.params["n_calibration_rows"] == 1 and v.params["gemm_y_max_stderr"] is None
    assert any("no residual degree of freedom" in n for n in v.params["notes"])
    out = run("validate", str(path), "--calibrate-on", "every-third").output
    fit_line = next(ln for ln in out.splitlines() if ln.startswith("fit ("))
    assert "gemm_y_max" in fit_line and "+-" not in fit_line


def test_leave_one_out_intervals_cover_the_rows():
    """Leave-one-out (validate's default): each row gets the interval of the fit to all the
    others.  SC21 Table 1, 10 folds of 2 parameters on 9 rows: observed 9 of 10 inside at a
    median half-width of 6.1 %."""
    path = PUB / "megatron_sc21_table1_weak_scaling.csv"
    df, _ = read_table(path)
    s = validate(df, str(path), loo=True).summary
    assert s["n_with_interval"] == 10 and 8 <= s["n_inside_interval"] <= 10
    assert 2.0 < s["median_interval_pct"] < 12.0


def test_the_summary_states_the_bias():
    """Signed median and how many held-out rows are predicted above their measured value:
    the H100 BF16 table's every-third split, observed +1.19 % and 19 of 34, from the rows."""
    path = PUB / "mosaicml_llmfoundry_fsdp_h100_bf16.csv"
    df, _ = read_table(path)
    v = validate(df, str(path), calibrate_on="every-third")
    held = v.rows.loc[v.rows["role"] == "held-out", "err_pct"]
    assert v.summary["median_signed_pct"] == pytest.approx(float(np.median(held)))
    assert v.summary["n_predicted_above"] == int((held > 0).sum()) == 19


def test_the_row_table_shows_each_rows_interval():
    """The text output's per-row table carries the 90 % half-width and whether the row is
    inside it (SC21 Table 2, every third row: the held-out ZeRO-3 rows at 768-2240 GPUs,
    predicted 16-25 % too slow, are OUT of a 9.5 % half-width)."""
    out = run(
        "validate", str(PUB / "megatron_sc21_table2_ptdp_vs_zero3.csv"), "--calibrate-on", "every-third"
    ).output
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("sc21t2-")]
    assert "90% ±" in out and len(lines) == 12
    outside = sorted(ln.split()[0] for ln in lines if " OUT" in ln)
    assert outside == [
        "sc21t2-zero-3-175b-1536gpu",
        "sc21t2-zero-3-175b-768gpu",
        "sc21t2-zero-3-530b-1120gpu",
        "sc21t2-zero-3-530b-2240gpu",
    ]
