"""The attention core's efficiency over the GEMMs' (``attn_eff_ratio``, analytic.vfit): fitted
only where the calibration rows identify it, stored by ``--save-calibration`` and applied by
``predict``.  Real tables: the llm-foundry H100 section (sequence lengths 512-65536, so the
attention share varies) and SC21 Table 1 (every row s = 2048: nothing to identify it by)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calib.analytic.validate import validate
from calib.analytic.vtable import read_table

from tests.conftest import bad, run

PUB = Path(__file__).parents[1] / "fixtures" / "published"
H100 = PUB / "mosaicml_llmfoundry_fsdp_h100_bf16.csv"
SC21 = PUB / "megatron_sc21_table1_weak_scaling.csv"


def test_rows_of_many_sequence_lengths_identify_a_slower_attention_core():
    """Every third row of the H100 section (18 rows, s 512-65536): the ratio is identified
    (|value| / stderr >= Student's t(0.975, 15 dof) = 2.13) and below 1 -- the vendor's flash-attention kernel runs below the GEMMs'
    efficiency -- and the held-out rows stay under their regression bound
    (tests/test_published_tables.py)."""
    df, _ = read_table(H100)
    p = validate(df, str(H100), calibrate_on="every-third").params
    r, se = p["attn_eff_ratio"], p["attn_eff_ratio_stderr"]
    assert 0.1 < r < 1.0 and r >= 2.13 * se
    assert "not_identified" not in p


def test_a_few_rows_must_clear_students_t():
    """The FP8 section's four calibration rows leave one residual degree of freedom: the ratio's
    0.47 +- 0.19 (2.5 standard errors; 0.467 +- 0.18 before stop 31's measured FP8 GEMM rate) is short of t(0.975, 1) = 12.7, so it is not kept."""
    path = PUB / "mosaicml_llmfoundry_fsdp_h100_fp8.csv"
    df, _ = read_table(path)
    p = validate(df, str(path), calibrate_on="every-third").params
    assert "attn_eff_ratio" not in p and any("(0.469 +- 0.19)" in n for n in p["not_identified"])


def test_one_sequence_length_leaves_the_stated_default():
    """SC21 Table 1: all rows at s = 2048, so the ratio is not identified; the fit drops it,
    says so, and its result is the two-parameter fit's (held-out median 3.05 %)."""
    df, _ = read_table(SC21)
    v = validate(df, str(SC21), calibrate_on="every-third")
    assert "attn_eff_ratio" not in v.params
    assert any(line.startswith("attn_eff_ratio not identified") for line in v.params["not_identified"])
    assert v.summary["median_abs_pct"] == pytest.approx(3.05, abs=0.01)
    text = run("validate", str(SC21), "--calibrate-on", "every-third").output
    assert "note: attn_eff_ratio not identified by the calibration rows" in text


def test_too_few_rows_never_fit_the_ratio():
    """Three calibration rows and three parameters leave no residual degree of freedom: the
    ratio is not judged, it is dropped (Korthikanti Table 5, rows 1, 4, 7)."""
    path = PUB / "korthikanti2022_table5_iteration_times.csv"
    df, _ = read_table(path)
    p = validate(df, str(path), calibrate_on="every-third").params
    assert "attn_eff_ratio" not in p and "no residual degree of freedom" in p["not_identified"][0]


def _save(table: Path, store: Path, name: str) -> tuple[dict, dict]:
    """``calib validate TABLE --calibrate-on every-third --save-calibration NAME``: (its JSON
    output, the stored calibration)."""
    out = json.loads(
        run("validate", str(table), "--calibrate-on", "every-third", "--store", str(store), "--json",
            "--save-calibration", name).output
    )  # fmt: skip
    return out, json.loads(Path(out["saved_calibration"]).read_text())


def test_saved_ratio_reaches_predict(tmp_path):
    """``--save-calibration`` stores the ratio with its standard error; ``predict`` with that
    calibration applies it (and says so): a 1B model at s = 65536 with flash attention is
    slower than with the same calibration minus the ratio, by the attention share alone."""
    store = str(tmp_path / "store")
    out, saved = _save(H100, tmp_path / "store", "h100fit")
    assert saved["system"] == "h100fit"
    stored = saved["provenance"]["attn_eff_ratio"]
    assert stored["value"] == pytest.approx(out["fit"]["attn_eff_ratio"])
    assert stored["stderr"] == pytest.approx(out["fit"]["attn_eff_ratio_stderr"])

    shape = ("--hardware", "dgx-h100", "--d", "2048", "--l", "24", "--a", "16", "--s", "65536",
             "--gpus", "8", "--zero", "3", "--flash-attention", "--json")  # fmt: skip
    with_ratio = json.loads(run("predict", "--calibration", "h100fit", "--store", store, *shape).output)
    assert any("attention core at" in n for n in with_ratio["notes"])
    del saved["provenance"]["attn_eff_ratio"]
    plain = tmp_path / "plain.calib.json"
    plain.write_text(json.dumps(saved))
    without = json.loads(run("predict", "--calibration", str(plain), *shape).output)
    assert with_ratio["configs"][0]["iter_s"] > without["configs"][0]["iter_s"]
    short = [x if x != "65536" else "512" for x in shape]
    a = json.loads(run("predict", "--calibration", "h100fit", "--store", store, *short).output)
    b = json.loads(run("predict", "--calibration", str(plain), *short).output)
    gap_long = with_ratio["configs"][0]["iter_s"] / without["configs"][0]["iter_s"]
    gap_short = a["configs"][0]["iter_s"] / b["configs"][0]["iter_s"]
    assert gap_long > gap_short > 1.0  # the ratio weighs with the attention share


@pytest.fixture(scope="module")
def sc21_saved(tmp_path_factory) -> dict:
    return _save(SC21, tmp_path_factory.mktemp("store"), "sc21")[1]


@pytest.mark.parametrize("key", ["attn_eff_ratio", "vector_passes"])
@pytest.mark.parametrize("value", ["x", -1, None, [1], 1e400, True])
def test_a_stored_setting_out_of_range_is_refused(tmp_path, sc21_saved, key, value):
    """A calibration whose stored System setting is not a finite number in range is refused in
    one line naming the calibration and the key (exit 2), never a traceback or an inf time."""
    saved = json.loads(json.dumps(sc21_saved))
    saved["provenance"][key] = {"value": value}
    path = tmp_path / "bad.calib.json"
    path.write_text(json.dumps(saved))
    err = bad("predict", "--calibration", str(path), "--model", "gpt-13b", "--gpus", "8")
    assert f"provenance.{key}.value must be a number" in err.problem
