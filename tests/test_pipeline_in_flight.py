"""Activations the first pipeline stage holds, and a validation row's dropout column.

Megatron's interleaved 1F1B warms up with 2 (p - 1) + (v - 1) p forwards of chunks of 1 / v
of the stage, plus the one in flight: p + (p - 1) / v stages' worth of micro-batches
(Narayanan et al. SC21 sec. 2.2.2), but never more than the iteration's m -- with m = p it
runs every forward first (``all_warmup_microbatches``, megatron/core/pipeline_parallel/
schedules.py) and holds exactly m.  Llama 3 405B (Dubey et al. 2024 Table 4): p 16, v 8,
32 micro-batches per DP rank on 8,192 GPUs, 16 on 16,384.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calib.analytic.memory import stages_in_flight
from calib.analytic.validate import Table, systems_for, validate
from calib.analytic.vtable import read_table

from tests.conftest import run

LLAMA3 = Path(__file__).parents[1] / "fixtures" / "published" / "llama3_405b_table4_scaling.csv"
FLAGS = ("--hardware", "dgx-h100", "--model", "llama3-405b", "--s", "8192", "--tp", "8", "--pp", "16",
         "--interleave", "8", "--global-batch", "2048", "--zero", "1", "--distributed-optimizer",
         "--seq-parallel", "--flash-attention", "--csv")  # fmt: skip


def test_stages_in_flight_by_hand():
    # 1F1B: min(p, m)
    assert stages_in_flight(4, 2, 1) == 2 and stages_in_flight(4, 8, 1) == 4
    # interleaved, m > p: 16 + 15 / 8 = 17.875 (143 chunks of 1 / 8 stage)
    assert stages_in_flight(16, 32, 8) == pytest.approx(17.875)
    assert stages_in_flight(16, 32, 8) * 8 == pytest.approx(2 * 15 + 7 * 16 + 1)  # Megatron's warm-up + 1
    # interleaved, m = p: every forward first, m stages' worth
    assert stages_in_flight(16, 16, 8) == 16.0
    np.testing.assert_allclose(stages_in_flight(np.array([8, 8]), np.array([8, 64]), 4), [8.0, 8 + 7 / 4])


def _acts_gb(gpus: str) -> float:
    out = run("predict", *FLAGS, "--gpus", gpus).output.splitlines()
    return float(dict(zip(out[0].split(","), out[1].split(",")))["mem_activations_gb"])


def test_llama3_405b_holds_m_micro_batches_when_m_equals_p():
    """8,192 GPUs: m = 32, 76.2 GB (tests/test_dropout.py); 16,384 GPUs: m = 16 = p, so
    76.17 x 16 / 17.875 = 68.2 GB, not the 17.875 stages' worth."""
    big, small = _acts_gb("8192"), _acts_gb("16384")
    assert big == pytest.approx(76.2, abs=0.1)
    assert small == pytest.approx(76.17 * 16 / 17.875, abs=0.1)


def test_a_validation_row_without_dropout_keeps_no_masks():
    """The table's dropout column reaches the time model: Llama 3's rows (dropout false)
    hold what ``calib predict --model llama3-405b`` holds (no masks: 32 of 34 s b d), so
    the 16,384-GPU rows that trained are no longer predicted out of memory.  The 8,192-GPU
    row (m = 32, 76.2 GB of activations) was, with ZeRO-1's 14.5 GB of states; as the
    paper's ZeRO-2 (stop 25: gradients sharded, 7.7 GB of states) it fits, by 0.03 GB."""
    df, _ = read_table(LLAMA3)
    t = Table.of(df)
    (h, idx, model, st), *_ = t.groups
    assert model.dropout is False
    from calib.analytic.timemodel import evaluate

    r = evaluate(model, systems_for(t.df, None, str(LLAMA3))[h], st)
    acts_gb = np.asarray(r["mem_activations_bytes"]) / 1e9
    np.testing.assert_allclose(acts_gb[:2], [_acts_gb("8192"), _acts_gb("16384")], atol=0.06)
    rows = validate(df, str(LLAMA3), fit_kind="none").rows
    assert rows["oom"].tolist() == [False, False, False]
    tot = np.asarray(r["mem_total_bytes"])
    hbm = systems_for(t.df, None, str(LLAMA3))[h].hw.hbm_bytes
    assert 0.0 < hbm - tot[0] < 0.1e9  # the margin: 0.03 GB (docs/analytic.md says so)
    assert np.asarray(r["mem_grads_bytes"])[0] < 0.2e9  # gradients sharded over DP 64


def test_moe_layers_hold_as_many_micro_batches_as_the_dense_ones():
    """Interleaving multiplies every layer's kept activations by the same in-flight count,
    the MoE layers' routed experts included: Mixtral 8x7B, PP 4, m 16, v 2 holds
    1 + 3 / 8 = 1.375 times what v 1 holds (no logits on a PP > 1 first stage)."""

    def acts(v: str) -> float:
        out = run("predict", "--hardware", "dgx-h100", "--model", "mixtral-8x7b", "--gpus", "64", "--ep", "8",
                  "--pp", "4", "--interleave", v, "--s", "4096", "--global-batch", "256", "--zero", "1",
                  "--flash-attention", "--csv").output.splitlines()  # fmt: skip
        return float(dict(zip(out[0].split(","), out[1].split(",")))["mem_activations_gb"])

    assert acts("2") / acts("1") == pytest.approx(
        float(stages_in_flight(4, 16, 2) / stages_in_flight(4, 16, 1))
    )
    assert float(stages_in_flight(4, 16, 2)) == pytest.approx(4 * 1.375)
