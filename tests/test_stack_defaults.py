"""Blank stack columns of a validation table (analytic.vdefaults): flash_attention fused for the
generation that trains with fused attention, unfused for Megatron's GPT-3 era; dp_overlap on
for ZeRO-3 rows only; each said in a note.  Checked against every value the repository's own
transcribed tables state."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from calib.analytic.validate import systems_for, validate
from calib.analytic.vdefaults import settle
from calib.analytic.vtable import normalise

from tests.conftest import FIXTURES

PUB = FIXTURES / "published"
STATED = (
    "torchtitan_fsdp2_a100_llama",  # Llama 3 shapes on A100s: stated true
    "llama3_405b_table4_scaling",  # H100s: true
    "deepseek_v3_h800_pretraining",  # H800, MLA + experts: true
    "megatron_sc21_table2_ptdp_vs_zero3",  # GPT-3 on A100s, s 2048: false
    "bloom176b_bigscience_jean_zay_iteration_times",  # false
    "mtnlg530b_smith2022_iteration_times",  # false
)


@pytest.mark.parametrize("name", STATED)
def test_a_blank_column_reproduces_what_each_table_states(name):
    """Drop the column the transcription states from its source and let the default decide:
    every row of the six canonical tables (43 rows, 2021-2025) comes back as stated."""
    raw = pd.read_csv(PUB / f"{name}.csv")
    stated = raw["flash_attention"].astype(str).str.lower().eq("true").to_numpy()
    df = normalise(raw.drop(columns="flash_attention"), name)
    settled, notes = settle(df, systems_for(df, None, name))
    np.testing.assert_array_equal(settled["flash_attention"].to_numpy(dtype=bool), stated)
    assert notes and f"not given for {len(raw)} row(s): fused for {int(stated.sum())}" in notes[0]
    # a stated value is never changed, and no note is made
    kept, none = settle(normalise(raw, name), systems_for(df, None, name))
    np.testing.assert_array_equal(kept["flash_attention"].to_numpy(dtype=bool), stated)
    assert none == []


def test_stated_false_on_a_modern_row_stays_false():
    raw = pd.read_csv(PUB / "torchtitan_fsdp2_a100_llama.csv").assign(flash_attention=False)
    df = normalise(raw, "t")
    settled, notes = settle(df, systems_for(df, None, "t"))
    assert not settled["flash_attention"].any() and notes == []


def test_validate_predicts_the_defaulted_table_as_the_stated_one_and_says_so(tmp_path):
    """The same errors with the column as without it, and the note on the command line."""
    src = PUB / "torchtitan_fsdp2_a100_llama.csv"
    blank = tmp_path / "no_flash.csv"
    pd.read_csv(src).drop(columns="flash_attention").to_csv(blank, index=False)
    a = validate(normalise(pd.read_csv(src), "a"), "a", calibrate_on="1,4")
    b = validate(normalise(pd.read_csv(blank), "b"), "b", calibrate_on="1,4")
    np.testing.assert_allclose(a.rows["err_pct"], b.rows["err_pct"])
    assert any("flash_attention not given for 6 row(s): fused for 6" in n for n in b.params.get("notes", []))
    out = subprocess.run(
        [sys.executable, "-m", "calib.cli", "validate", str(blank), "--calibrate-on", "1,4"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert "flash_attention not given for 6 row(s)" in out.stdout


def test_a_blank_dp_overlap_is_on_for_zero3_rows_only():
    """Drop dp_overlap from the six canonical tables: the ZeRO-3 rows (SC21 Table 2's DeepSpeed
    rows, torchtitan's FSDP2 rows) come back on, as stated; 39 of the 43 stated values come
    back.  The four that do not are Llama 3 405B (ZeRO-2 with overlap, 3 rows) and DeepSeek-V3
    (ZeRO-1 with overlap, 1 row): overlap outside ZeRO-3 is a stack's choice (DeepSpeed's
    ``overlap_comm`` defaults to false below stage 3), so a blank there stays off."""
    agree, missed = 0, []
    for name in STATED:
        raw = pd.read_csv(PUB / f"{name}.csv")
        stated = raw["dp_overlap"].astype(str).str.lower().eq("true").to_numpy()
        df = normalise(raw.drop(columns="dp_overlap"), name)
        settled, notes = settle(df, systems_for(df, None, name))
        got = settled["dp_overlap"].to_numpy(dtype=bool)
        assert (got == (df["zero"].to_numpy() == 3)).all()
        assert any(f"dp_overlap not given for {len(raw)} row(s)" in n for n in notes)
        agree += int((got == stated).sum())
        missed += [name] * int((got != stated).sum())
    assert (
        agree == 39
        and sorted(missed) == ["deepseek_v3_h800_pretraining"] + ["llama3_405b_table4_scaling"] * 3
    )


def test_api_predict_and_search_take_the_same_default():
    """The Python API applies the rule ``calib predict`` / ``search`` apply, with the note naming
    ``flash_attention=False``; an explicit value is taken as given."""
    import calib

    m = calib.SystemModel.from_hardware("dgx-h100")
    auto = m.predict("llama3-8b", 8, global_batch=64)
    fused = m.predict("llama3-8b", 8, global_batch=64, flash_attention=True)
    off = m.predict("llama3-8b", 8, global_batch=64, flash_attention=False)
    assert auto.table["iter_s"].iloc[0] == fused.table["iter_s"].iloc[0] < off.table["iter_s"].iloc[0]
    assert any("attention fused" in n and "flash_attention=False" in n for n in auto.notes)
    assert not any("attention fused" in n for n in fused.notes)
    res = m.search("llama3-8b", 8, global_batch=64)
    assert any("attention fused" in n for n in res.notes)


def test_predict_overlaps_zero3_unless_told_not_to():
    """``calib predict --zero 3`` without --dp-overlap or --no-dp-overlap overlaps (the note says
    so) and equals --dp-overlap; --no-dp-overlap exposes more; ZeRO-1 stays off, without a note."""
    from tests.conftest import run

    args = ("predict", "--hardware", "dgx-a100-80gb", "--model", "gpt3-175b", "--gpus", "1536", "--micro-batch",
            "1", "--global-batch", "1536", "--recompute", "full", "--json")  # fmt: skip
    import json

    def step(*extra):
        doc = json.loads(run(*args, *extra).output)
        return doc["configs"][0]["iter_s"], doc["notes"]

    auto, notes = step("--zero", "3")
    on, on_notes = step("--zero", "3", "--dp-overlap")
    off, _ = step("--zero", "3", "--no-dp-overlap")
    assert auto == on < off
    assert any(n.startswith("DP overlap on for ZeRO-3") for n in notes)
    assert not any(n.startswith("DP overlap on") for n in on_notes)
    z1, z1_notes = step("--zero", "1", "--tp", "8", "--pp", "8")
    z1_off, _ = step("--zero", "1", "--tp", "8", "--pp", "8", "--no-dp-overlap")
    assert z1 == z1_off and not any(n.startswith("DP overlap") for n in z1_notes)
