"""ZeRO-3's gathered parameters in memory: PyTorch FSDP holds two wrapped layers (the one
computing and the one prefetched); DeepSpeed gathers module by module and stops prefetching
at ``stage3_max_live_parameters`` (default 1e9 elements), so it holds at most that many but
at least its largest matrix (analytic/zero_overlap.py ``live_gathered_params``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calib.analytic import zero_overlap as ZO
from calib.analytic.validate import validate
from calib.analytic.vtable import read_table

PUB = Path(__file__).parents[1] / "fixtures" / "published"


def test_hand_worked_gathered_parameters():
    """GPT-3 175B (d 12288, TP 1): two layers 2 x 12 d^2 = 3.624e9; its largest matrix, one
    MLP matrix d x 4d = 6.04e8, is under the cap, so DeepSpeed holds 1e9 (2 GB in fp16) where
    FSDP holds 3.624e9 (7.25 GB).  MT-NLG 530B (d 20480): its MLP matrix, 1.678e9, is over the
    cap and must be whole: DeepSpeed holds 1.678e9 against FSDP's 1.007e10.  A small model
    (d 1024) holds two layers either way."""
    d = np.array([12288.0, 20480.0, 1024.0])
    two, largest = 2 * 12 * d * d, 4 * d * d
    ds = ZO.live_gathered_params(two, largest, True)
    fsdp = ZO.live_gathered_params(two, largest, False)
    assert ds == pytest.approx([1e9, 20480.0 * 81920.0, 2 * 12 * 1024.0**2])
    assert fsdp == pytest.approx(two)
    assert two[0] == pytest.approx(3.624e9, rel=1e-3) and two[1] == pytest.approx(1.007e10, rel=1e-3)


def test_the_530b_zero3_run_that_trained_fits():
    """SC21 Table 2's DeepSpeed ZeRO-3 530B run at 640 GPUs (micro-batch 4) trained; with two
    whole gathered layers (20.1 GB) the model put it 3 GB over the A100's 80 GiB.  With
    DeepSpeed's cap no measured configuration of the table is predicted out of memory, and as
    PyTorch FSDP (two layers) the same row still is."""
    path = PUB / "megatron_sc21_table2_ptdp_vs_zero3.csv"
    df, _ = read_table(path)
    res = validate(df, str(path), fit_kind="none")
    assert res.summary["n_predicted_oom"] == 0 and res.summary["n_rows"] == 12
    row = df[df["label"] == "sc21t2-zero-3-530b-640gpu"].reset_index(drop=True)
    row["zero_impl"] = "fsdp"
    assert bool(validate(row, str(path), fit_kind="none").rows["oom"].iloc[0])
