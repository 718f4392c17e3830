"""ZeRO-2/3 with pipeline parallelism (analytic.sharded_pp).

Hand-worked from the semantics: ZeRO-3 with PP as FSDP2 + torch pipelining run it (no
resharding, gradient sync at the last micro-batch): per step one parameter all-gather and
one gradient reduce-scatter per module whatever the number of micro-batches m, and
ZeRO-1's model states at the step's peak (2 P + 2 P + 12 P / d).  ZeRO-2 with PP is
ZeRO-2 per stage (Llama 3, arXiv:2407.21783 sec. 3.3.2): gradients reduced every
micro-batch and sharded, 2 P + 2 P / d + 12 P / d.
"""

from __future__ import annotations

import pytest
from calib.analytic.machine import default_calibration
from calib.analytic.shape_terms import shape_terms, stage_params
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies, check_config
from calib.analytic.timemodel import System, comm_times, evaluate

from tests.conftest import run

HW = load_hardware("dgx-a100-80gb")
SYSTEM = System(default_calibration(HW), HW)
MODEL = load_model("gpt-13b")  # 40 layers


def _st(zero: int, pp: int, m: int = 8, dp: int = 8, **kw) -> Strategies:
    return Strategies.of(tp=1, pp=pp, dp=dp, micro_batch=1, global_batch=m * dp, zero=zero, recompute=2, **kw)


def _stage_params(pp: int) -> float:
    ffn, kv, mats, tied = shape_terms(MODEL)
    m = MODEL
    return float(stage_params(m.d_model, m.n_layers, m.seq_len, m.vocab, 1.0, float(pp), ffn, kv, mats, tied))


def test_zero3_one_gather_and_one_reduce_scatter_per_step():
    st = _st(3, pp=4, m=8)
    r, c = evaluate(MODEL, SYSTEM, st), comm_times(MODEL, SYSTEM, st)
    # no overlap: the totals are the per-module collectives once per step, not m (or 3 m) times
    assert float(r["dp_allgather_s"]) == pytest.approx(float(c["dp_ag_z3_s"]), rel=1e-12)
    assert float(r["dp_reducescatter_s"]) == pytest.approx(float(c["dp_rs_z3_s"]), rel=1e-12)
    assert float(r["dp_allreduce_s"]) == 0.0
    # the same ZeRO-3 without PP gathers three times (full recompute) per micro-batch
    flat = evaluate(MODEL, SYSTEM, _st(3, pp=1, m=8, dp=32))
    c1 = comm_times(MODEL, SYSTEM, _st(3, pp=1, m=8, dp=32))
    assert float(flat["dp_allgather_s"]) == pytest.approx(8 * 3 * float(c1["dp_ag_z3_s"]), rel=1e-12)


def test_zero3_model_states_are_zero1s_at_the_peak():
    P, d = _stage_params(4), 8
    r = evaluate(MODEL, SYSTEM, _st(3, pp=4))
    assert float(r["mem_weights_bytes"]) == pytest.approx(2.0 * P, rel=1e-9)
    assert float(r["mem_grads_bytes"]) == pytest.approx(2.0 * P, rel=1e-9)
    assert float(r["mem_optimizer_bytes"]) == pytest.approx(12.0 * P / d, rel=1e-9)


def test_zero2_with_pp_is_zero2_per_stage():
    P, d, m = _stage_params(4), 8, 8
    st = _st(2, pp=4, m=m)
    r, c = evaluate(MODEL, SYSTEM, st), comm_times(MODEL, SYSTEM, st)
    assert float(r["mem_weights_bytes"]) == pytest.approx(2.0 * P, rel=1e-9)
    assert float(r["mem_grads_bytes"]) == pytest.approx(2.0 * P / d, rel=1e-9)
    assert float(r["mem_optimizer_bytes"]) == pytest.approx(12.0 * P / d, rel=1e-9)
    assert float(r["dp_reducescatter_s"]) == pytest.approx(m * float(c["dp_reduce_s"]), rel=1e-12)
    assert float(r["dp_allgather_s"]) == pytest.approx(float(c["dp_ag_s"]), rel=1e-12)


def test_traffic_equals_the_distributed_optimizers_up_to_module_latency():
    z3 = evaluate(MODEL, SYSTEM, _st(3, pp=4, dp_overlap=True))
    do = evaluate(MODEL, SYSTEM, _st(1, pp=4, dp_overlap=True, dist_opt=True))
    a, b = float(z3["dp_allgather_s"]), float(do["dp_allgather_s"])
    assert b <= a <= 1.25 * b  # L / p + 1 module gathers pay the ring latency L / p more times


def test_accepted_and_hybrid_with_pp():
    assert check_config(MODEL, 64, 1, 4, 1, 128, zero=3) == 16
    assert check_config(MODEL, 64, 1, 4, 1, 128, zero=3, shard=8) == 16
    out = run("predict", "--hardware", "dgx-a100-80gb", "--model", "gpt-13b", "--gpus", "32",
              "--zero", "3", "--pp", "4", "--global-batch", "64", "--csv").output  # fmt: skip
    row = dict(zip(*(line.split(",") for line in out.splitlines()[:2]), strict=True))
    assert float(row["iter_s"]) > 0 and row["zero"] == "3" and row["pp"] == "4"


def test_fsdp_zero2_with_pp_runs_as_torch_pipelining():
    # FSDP's SHARD_GRAD_OP under torch pipelining: one gather + one reduce-scatter per step
    st = _st(2, pp=4, m=8, zero_impl=1)
    r, c = evaluate(MODEL, SYSTEM, st), comm_times(MODEL, SYSTEM, st)
    assert float(r["dp_allgather_s"]) == pytest.approx(float(c["dp_ag_z3_s"]), rel=1e-12)
    assert float(r["dp_reducescatter_s"]) == pytest.approx(float(c["dp_rs_z3_s"]), rel=1e-12)
    assert float(r["mem_grads_bytes"]) == pytest.approx(2.0 * _stage_params(4), rel=1e-9)
