"""Validation against the published tables: adapters read the real CSVs, and the held-out
accuracy stays at the bounds reached (median and max absolute %; a regression fails).

The splits are fixed in advance and documented in docs/analytic.md: SC21 Table 1 is fitted
on rows 1, 4, 7, 10 (every third row) and Korthikanti Table 5 on its full-recompute rows,
with the errors asserted on the other rows only; leave-one-out holds every row out once.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from calib.analytic.validate import select_rows, validate
from calib.analytic.vtable import normalise, read_table

from calib.core.errors import InputError

PUB = Path(__file__).parents[1] / "fixtures" / "published"
SC21 = PUB / "megatron_sc21_table1_weak_scaling.csv"
K22 = PUB / "korthikanti2022_table5_iteration_times.csv"
MLM = PUB / "megatron_readme_2020_tp_dp_scaling_iteration_times.csv"
MOSAIC = PUB / "mosaicml_llmfoundry_fsdp_a100.csv"


def test_adapters_read_every_row_with_its_measurement():
    sc21, fmt = read_table(SC21)
    assert fmt == "sc21" and len(sc21) == 10
    one_t = sc21.set_index("label").loc["sc21-1T"]
    assert (one_t["measured_tflops_per_gpu"], one_t["gpus"], one_t["tp"], one_t["pp"]) == (163, 3072, 8, 64)
    # micro-batch and interleaving from Megatron-LM examples/sc21/run_table_1.sh
    assert sc21.set_index("label").loc["sc21-145B", ["micro_batch", "interleave"]].tolist() == [2, 2]
    assert sc21.set_index("label").loc["sc21-76B", ["micro_batch", "interleave"]].tolist() == [2, 3]

    k22, fmt = read_table(K22)
    assert fmt == "korthikanti" and len(k22) == 8
    r = k22.set_index("label")
    assert (
        r.loc["k22-175B-full", "measured_iter_s"] == 18.13
        and r.loc["k22-175B-seqsel", "measured_iter_s"] == 13.75
    )
    assert r.loc["k22-175B-seqsel", ["recompute", "seq_parallel"]].tolist() == ["selective", True]

    mlm, fmt = read_table(MLM)
    assert fmt == "megatron2020" and len(mlm) == 12
    assert mlm.set_index("label").loc["mlm2020-8B-1024gpu-a100", "measured_iter_s"] == pytest.approx(1.380)

    mos, fmt = read_table(MOSAIC)
    assert fmt == "mosaicml" and len(mos) == 139
    row = mos.iloc[0]
    assert (
        row["d_model"],
        row["n_layers"],
        row["gpus"],
        row["zero"],
        row["measured_tokens_per_s_per_gpu"],
    ) == (8192, 80, 64, 3, 410)


@pytest.mark.parametrize(
    ("table", "split", "median_max", "max_max"),
    [
        # reached: median 3.05 %, max 4.05 % (6 held-out rows)
        (SC21, {"calibrate_on": "1,4,7,10"}, 3.2, 4.2),
        # reached: median 1.67 %, max 7.36 % (10 folds; the default fit keeps the network
        # scale, 0.50 of the stated busbw; 4.96 % with --fit compute; 1.25 % before stop 21
        # kept the element-wise factor only where identified)
        (SC21, {"loo": True}, 1.8, 7.6),
        # reached: median 4.95 %, max 6.10 % (fit on full recompute, predict seq-par + selective)
        (K22, {"calibrate_on": "full"}, 5.0, 6.3),
        # reached: median 3.59 %, max 8.40 % (8 folds)
        (K22, {"loo": True}, 3.8, 8.6),
    ],
)
def test_heldout_accuracy_bounds(table, split, median_max, max_max):
    df, _ = read_table(table)
    res = validate(df, str(table), **split)
    s = res.summary
    assert s["median_abs_pct"] <= median_max
    assert s["max_abs_pct"] <= max_max
    held = res.rows[res.rows["role"] == "held-out"]
    assert len(held) == s["n_heldout"] and not held["oom"].any()


def test_calibration_rows_are_never_reported():
    df, _ = read_table(SC21)
    res = validate(df, "sc21", calibrate_on="1,4,7,10")
    assert res.summary["n_heldout"] == 6
    assert res.rows.loc[[0, 3, 6, 9], "role"].eq("calibration").all()
    assert res.params["n_calibration_rows"] == 4
    # the fitted parameters carry standard errors from the fit
    assert 0 < res.params["gemm_y_max_stderr"] < 0.1


def test_defaults_alone_are_reported_honestly():
    df, _ = read_table(K22)
    res = validate(df, "k22", fit_kind="none")
    # stated defaults, no fit: every row held out, none fitted; the default GEMM plateau is the
    # A100's measured achievable matmul (271.2 / 312; 20.7 % under the generic 0.75)
    assert res.summary["n_heldout"] == 8 and 5 < res.summary["median_abs_pct"] < 10
    assert res.params == {"fit": "none", "at_bound": []}


def test_holdout_is_seeded_and_exclusive():
    df, _ = read_table(MLM)
    a = validate(df, "mlm", holdout=0.25, seed=3)
    b = validate(df, "mlm", holdout=0.25, seed=3)
    assert a.rows["role"].tolist() == b.rows["role"].tolist()
    assert (a.rows["role"] == "held-out").sum() == 3


def test_row_selection():
    df, _ = read_table(K22)
    assert select_rows(df, "1-3,k22-1T-seqsel").sum() == 4
    assert select_rows(df, "seqsel").sum() == 4
    with pytest.raises(InputError, match="neither a row number"):
        select_rows(df, "bogus")
    with pytest.raises(InputError, match="outside 1..8"):
        select_rows(df, "7-12")


def test_canonical_schema_errors_name_row_and_column():
    base = {"d_model": 2048, "n_layers": 24, "n_heads": 16, "seq_len": 2048, "vocab": 51200, "gpus": 8, "tp": 2,
            "pp": 1, "micro_batch": 1, "global_batch": 8, "measured_iter_s": 1.0, "hardware": "tg40"}  # fmt: skip
    ok = normalise(pd.DataFrame([base]), "t.csv")
    assert ok["recompute"].iloc[0] == "none" and not ok["seq_parallel"].iloc[0]
    with pytest.raises(InputError, match="row 2: column 'tp' must be a non-negative integer"):
        normalise(pd.DataFrame([base, {**base, "tp": "two"}]), "t.csv")
    with pytest.raises(InputError, match="missing column"):
        normalise(pd.DataFrame([{k: v for k, v in base.items() if k != "gpus"}]), "t.csv")
    with pytest.raises(InputError, match="recompute must be one of none, selective, full, op"):
        normalise(pd.DataFrame([{**base, "recompute": "some"}]), "t.csv")
    with pytest.raises(InputError, match="needs tflops_convention"):
        normalise(
            pd.DataFrame(
                [
                    {
                        **{k: v for k, v in base.items() if k != "measured_iter_s"},
                        "measured_tflops_per_gpu": 100,
                    }
                ]
            ),
            "t.csv",
        )
    bad = normalise(pd.DataFrame([{**base, "tp": 3}]), "t.csv")  # 3 does not divide 16 heads
    with pytest.raises(InputError, match=r"row 1 .*TP=3 does not divide the 16 attention heads"):
        validate(bad, "t.csv", fit_kind="none")
