"""On the spec path the attention core runs at the GEMMs' efficiency, a stated default; where
that choice moves a step by 10 % or more, predict says between which times the stacks
fitted in this repository would put it (analytic/predict.py ATTN_RATIO_SEEN)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from calib.analytic.machine import default_calibration
from calib.analytic.predict import ATTN_RATIO_SEEN, Plan, predict
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.timemodel import System

#: Llama 3 405B pre-training at 128K tokens (Dubey et al. 2024, Table 4; fixtures/published/
#: llama3_405b_table4_scaling.csv): CP 16 with all-gathered K/V on 16,384 H100s
LONG = dict(tp=8, cp=16, cp_kind=2, pp=16, interleave=8, zero=2, dp_overlap=True, seq_parallel=True,
            flash_attention=True, global_batch=128)  # fmt: skip


def _system():
    hw = load_hardware("dgx-h100")
    return System(default_calibration(hw), hw)


def _model(s):
    return replace(load_model("llama3-405b"), seq_len=s)


def _note(p):
    return [n for n in p.notes if n.startswith("attention core at the GEMMs' efficiency")]


def test_long_sequences_get_the_span_of_fitted_stacks_and_it_holds_the_measured_step():
    """At 128K tokens the attention core is most of the work: the note gives the step at the
    fitted stacks' attention efficiencies, and Meta's measured 380 TFLOP/s per GPU (model
    FLOPs with the non-causal attention count, as the table's rows convert) lies inside."""
    system, model = _system(), _model(131072)
    p = predict(model, system, [16384], Plan(**LONG))
    (note,) = _note(p)
    lo, hi = (float(x) for x in re.search(r"16384 GPUs ([\d.]+)-([\d.]+) s", note).groups())
    for ratio, want in zip(ATTN_RATIO_SEEN, (hi, lo), strict=True):
        at = predict(model, replace(system, attn_eff_ratio=ratio), [16384], Plan(**LONG))
        assert at.table["iter_s"].iloc[0] == pytest.approx(want, rel=1e-3)
        assert not _note(at)  # a ratio that is not the stated default says nothing
    it = p.table["iter_s"].iloc[0]
    assert lo < it < hi and hi > 1.1 * it
    row = pd.read_csv(
        Path(__file__).parents[1] / "fixtures" / "published" / "llama3_405b_table4_scaling.csv"
    ).iloc[2]
    measured_s = it * p.table["tflops_per_gpu"].iloc[0] / row["measured_tflops_per_gpu"]
    assert lo < measured_s < hi


def test_short_sequences_and_unfused_attention_say_nothing():
    system = _system()
    short = predict(
        _model(8192), system, [8192], Plan(**{**LONG, "cp": 1, "cp_kind": 0, "global_batch": 2048})
    )
    assert not _note(short)
    unfused = predict(_model(2048), system, [64], Plan(tp=8, pp=8))
    assert not _note(unfused)
    assert np.isfinite(unfused.table["iter_s"]).all()


@pytest.mark.parametrize("table, lo, hi", [("mosaicml_llmfoundry_fsdp_h100_bf16", 0.49, 0.56),
                                            ("mosaicml_llmfoundry_fsdp_a100", 0.77, 0.79)])  # fmt: skip
def test_the_span_comes_from_the_tables_validation_fits(table, lo, hi):
    """The lower end of ATTN_RATIO_SEEN is what the every-third validation fit of
    llm-foundry's H100 BF16 table identifies (0.498 +- 0.035); the A100 table's sits inside."""
    from calib.analytic.validate import validate
    from calib.analytic.vtable import read_table

    path = Path(__file__).parents[1] / "fixtures" / "published" / f"{table}.csv"
    df, _ = read_table(path)
    ratio = validate(df, str(path), calibrate_on="every-third").params["attn_eff_ratio"]
    assert lo <= ratio <= hi and ATTN_RATIO_SEEN[0] <= ratio + 0.01 and ratio < ATTN_RATIO_SEEN[1]


def test_search_gives_the_span_of_the_best_layout_per_gpu_count(tmp_path):
    """``calib search`` adds the same note for the layouts it ranks first, each re-evaluated
    at the span's ends (analytic.search.iter_of); a 4K-token search says nothing."""
    import json

    from tests.conftest import run

    args = ["search", "--hardware", "dgx-h100", "--model", "llama3-70b", "--gpus", "512,1024", "--flash-attention",
            "--store", str(tmp_path), "--json"]  # fmt: skip
    out = json.loads(run(*args, "--s", "65536", "--global-batch", "64", "--cp", "1,2,4,8,16").output)
    (note,) = [n for n in out["notes"] if n.startswith("attention core at the GEMMs' efficiency")]
    for row in out["best_per_gpus"]:
        lo, hi = (
            float(x)
            for x in re.search(rf"{row['gpus']} GPUs \(best layout\) ([\d.]+)-([\d.]+) s", note).groups()
        )
        assert lo < row["iter_s"] < hi and hi > 1.1 * row["iter_s"]
    short = json.loads(run(*args, "--s", "4096", "--global-batch", "512").output)
    assert not [n for n in short["notes"] if n.startswith("attention core at the GEMMs' efficiency")]
