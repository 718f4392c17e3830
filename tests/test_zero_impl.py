"""ZeRO as DeepSpeed and as PyTorch FSDP run it (analytic.dp_exposure), hand-worked.

FSDP skips the unshard in the recomputed forward (torch.distributed.fsdp._runtime_utils.
_pre_forward: "For `fully_shard` + `checkpoint`, skip pre-forward logic in the recomputed
forward"), so ZeRO-3 with full recompute gathers twice per micro-batch, DeepSpeed three
times; FSDP's SHARD_GRAD_OP reshards after backward, so ZeRO-2 gathers every micro-batch
and reduce-scatters, where DeepSpeed gathers once per step and reduces.
"""

from __future__ import annotations

import pytest
from calib.analytic.machine import default_calibration
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, comm_times, evaluate
from calib.analytic.vtable import read_table

from tests.conftest import run
from tests.test_validation_defects import MOSAIC

HW = load_hardware("dgx-a100-80gb")
SYSTEM = System(default_calibration(HW), HW)
MODEL = load_model("gpt-13b")
M = 4  # micro-batches


def _st(zero: int, impl: int, recompute: int = 2) -> Strategies:
    return Strategies.of(tp=1, pp=1, dp=64, micro_batch=1, global_batch=64 * M, zero=zero, recompute=recompute,
                         zero_impl=impl)  # fmt: skip


@pytest.mark.parametrize(("impl", "gathers"), [(0, 3), (1, 2)])
def test_zero3_gathers_per_micro_batch_with_full_recompute(impl, gathers):
    st = _st(3, impl)
    r, c = evaluate(MODEL, SYSTEM, st), comm_times(MODEL, SYSTEM, st)
    assert float(r["dp_allgather_s"]) == pytest.approx(M * gathers * float(c["dp_ag_z3_s"]), rel=1e-12)
    assert float(r["dp_reducescatter_s"]) == pytest.approx(M * float(c["dp_rs_z3_s"]), rel=1e-12)
    # without recompute both gather twice
    r0 = evaluate(MODEL, SYSTEM, _st(3, impl, recompute=0))
    assert float(r0["dp_allgather_s"]) == pytest.approx(M * 2 * float(c["dp_ag_z3_s"]), rel=1e-12)


def test_zero2_fsdp_gathers_every_micro_batch_and_reduce_scatters():
    c = comm_times(MODEL, SYSTEM, _st(2, 1))
    fsdp, ds = evaluate(MODEL, SYSTEM, _st(2, 1)), evaluate(MODEL, SYSTEM, _st(2, 0))
    assert float(fsdp["dp_allgather_s"]) == pytest.approx(M * float(c["dp_ag_z3_s"]), rel=1e-12)
    assert float(fsdp["dp_reducescatter_s"]) == pytest.approx(M * float(c["dp_rs_z3_s"]), rel=1e-12)
    assert float(ds["dp_allgather_s"]) == pytest.approx(float(c["dp_ag_s"]), rel=1e-12)
    assert float(ds["dp_reducescatter_s"]) == pytest.approx(M * float(c["dp_reduce_s"]), rel=1e-12)
    # memory does not depend on the implementation
    assert float(fsdp["mem_total_bytes"]) == float(ds["mem_total_bytes"])


def test_llm_foundry_rows_run_as_fsdp_and_the_cli_option():
    df, _ = read_table(MOSAIC)
    assert set(df["zero_impl"]) == {"fsdp"}
    a = run("predict", "--hardware", "dgx-a100-80gb", "--model", "gpt-13b", "--gpus", "64", "--zero", "3",
            "--recompute", "full", "--global-batch", "256", "--csv").output  # fmt: skip
    b = run("predict", "--hardware", "dgx-a100-80gb", "--model", "gpt-13b", "--gpus", "64", "--zero", "3",
            "--recompute", "full", "--global-batch", "256", "--zero-impl", "fsdp", "--csv").output  # fmt: skip
    col = a.splitlines()[0].split(",").index("dp_allgather_s")
    ag_ds, ag_fsdp = (float(x.splitlines()[1].split(",")[col]) for x in (a, b))
    # FSDP: 2 gathers per micro-batch of L + 1 = 41 flat parameters; DeepSpeed: 3 of
    # 40 x 4 + 1 = 161 tensors (analytic.zero_overlap.collective_counts).  Same bytes, so
    # ag_ds / ag_fsdp = 3 (S + 161 a) / (2 (S + 41 a)) with a the per-call latency, S the bytes' time
    from calib.analytic.machine import default_calibration
    from calib.analytic.specs import load_hardware, load_model
    from calib.analytic.strategy import Strategies
    from calib.analytic.timemodel import System, comm_times

    hw = load_hardware("dgx-a100-80gb")
    sysm = System(default_calibration(hw), hw)
    st = Strategies.of(tp=1, pp=1, dp=64, micro_batch=1, global_batch=256, zero=3, recompute=2,
                       zero_impl=[0, 1])  # fmt: skip
    c = comm_times(load_model("gpt-13b"), sysm, st)["dp_ag_z3_s"]
    m = 256 / 64
    assert ag_ds == pytest.approx(3 * m * c[0], rel=1e-4) and ag_fsdp == pytest.approx(2 * m * c[1], rel=1e-4)
    assert c[0] > c[1]  # 120 more calls, each paying the 64-rank ring's latency


def test_collective_counts_follow_each_implementation():
    """analytic.zero_overlap.collective_counts, by hand.  GPT-3 175B, one stage of 96 layers:
    FSDP 97 flat parameters (layers + embedding); DeepSpeed 96 x 4 weight matrices (fused QKV,
    projection, fc1, fc2) + the embedding = 385 gathers, and ceil(174.6e9 / 5e8) = 350
    reduce-scatter buckets.  A d = 256 layer's projection (65,536 elements) stays below the
    1e5 persistence threshold and is never gathered: 3 per layer; a SwiGLU layer gathers 5."""
    from calib.analytic import zero_overlap as ZO

    ag, rs = ZO.collective_counts([96, 96], 174.6e9, 12288, 4 * 12288, 1.0, 2.0, 1.0, [True, False])
    assert ag.tolist() == [385.0, 97.0] and rs.tolist() == [350.0, 97.0]
    ag, rs = ZO.collective_counts(4, 3.5e6, 256, 1024, 1.0, 2.0, 1.0, True)
    assert (float(ag), float(rs)) == (4 * 3 + 1, 1.0)
    ag, _ = ZO.collective_counts(32, 6.7e9, 4096, 11008, 1.0, 3.0, 1.0, True)
    assert float(ag) == 32 * 5 + 1
