"""Hybrid sharding (FSDP HYBRID_SHARD, MiCS): hand-worked memory and replica all-reduce.

Hand formulas (analytic.hybrid; PyTorch FSDP ShardingStrategy docs; MiCS, VLDB 2023, sec. 3):
ZeRO-3 over a shard group of g_s ranks keeps 16 P / g_s bytes of model states per GPU;
each rank's gradient shard G / g_s is all-reduced across r = g / g_s replicas, one rank
per node each, so the gpn ranks of a node push gpn (G / g_s) 2 (r - 1) / r bytes
through the node's NICs at the bus bandwidth of a full-node all-reduce over the r nodes.
"""

from __future__ import annotations

import numpy as np
import pytest
from calib.analytic import modern as X
from calib.analytic.machine import default_calibration
from calib.analytic.predict import Plan, predict
from calib.analytic.shape_terms import shape_terms, stage_params
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies, check_config
from calib.analytic.timemodel import System, comm_times, evaluate

from calib.core.collective_names import ALLREDUCE
from calib.core.errors import InputError
from tests.conftest import bad, run

HW = load_hardware("dgx-a100-80gb")  # 8 GPUs per node, inter-node busbw a stated default
SYSTEM = System(default_calibration(HW), HW)
MODEL = load_model("gpt-13b")


def _st(gpus: int, shard: int, zero: int = 3) -> Strategies:
    return Strategies.of(tp=1, pp=1, dp=gpus, micro_batch=1, global_batch=gpus, zero=zero,
                         recompute=2, shard=shard)  # fmt: skip


def _params() -> float:
    ffn, kv, mats, tied = shape_terms(MODEL)
    m = MODEL
    return float(stage_params(m.d_model, m.n_layers, m.seq_len, m.vocab, 1.0, 1.0, ffn, kv, mats, tied))


def test_shard_group_equal_to_the_dp_group_is_full_sharding():
    full, whole = evaluate(MODEL, SYSTEM, _st(64, 0)), evaluate(MODEL, SYSTEM, _st(64, 64))
    for key in ("iter_s", "mem_total_bytes", "dp_reducescatter_s", "dp_allgather_s"):
        assert np.allclose(full[key], whole[key], rtol=1e-12), key


@pytest.mark.parametrize("zero", [2, 3])
def test_model_states_are_sharded_over_the_shard_group_only(zero):
    P = _params()
    r = evaluate(MODEL, SYSTEM, _st(64, 8, zero))
    assert float(r["mem_optimizer_bytes"]) == pytest.approx(12.0 * P / 8, rel=1e-9)
    assert float(r["mem_grads_bytes"]) == pytest.approx(2.0 * P / 8, rel=1e-9)
    flat = evaluate(MODEL, SYSTEM, _st(64, 0, zero))
    assert float(flat["mem_optimizer_bytes"]) == pytest.approx(12.0 * P / 64, rel=1e-9)


@pytest.mark.parametrize("gpus", [16, 32, 128])
def test_replica_allreduce_moves_the_shard_through_the_node_nics(gpus):
    g_s, gpn = 8, HW.gpus_per_node
    G = 2.0 * _params()  # bf16 gradients of the whole model (TP = PP = 1)
    r = gpus / g_s
    # the bus bandwidth the calibration gives a full-node all-reduce over the same r nodes
    S, n_full = 1e10, r * gpn
    busbw = S * 2.0 * (n_full - 1.0) / n_full / float(SYSTEM.comm_cal.collective_time_s(ALLREDUCE, S, n_full))
    hand = gpn * (G / g_s) * 2.0 * (r - 1.0) / r / busbw
    got = float(X.replica_allreduce_s(SYSTEM.comm_cal, gpn, G, 0.0, _st(gpus, g_s)))
    assert got == pytest.approx(hand, rel=0.01)  # the rest is the curve's latency
    # the time model issues it per module (each layer and the embedding), once per micro-batch
    c = comm_times(MODEL, SYSTEM, _st(gpus, g_s))
    assert float(c["dp_hsdp_ar_s"]) == pytest.approx(hand, rel=0.05)
    assert float(comm_times(MODEL, SYSTEM, _st(gpus, 0))["dp_hsdp_ar_s"]) == 0.0


def test_hybrid_gathers_inside_the_node():
    # the parameter all-gather of a node-sized shard group runs over NVLink: faster than over 16 nodes
    hy, flat = comm_times(MODEL, SYSTEM, _st(128, 8)), comm_times(MODEL, SYSTEM, _st(128, 0))
    G = 2.0 * _params()
    nvlink = G * 7.0 / 8.0 / (HW.intra_busbw_gbps * 1e9)  # all-gather busbw factor (n - 1) / n
    assert float(hy["dp_ag_z3_s"]) == pytest.approx(nvlink, rel=0.05)
    assert float(hy["dp_ag_z3_s"]) < float(flat["dp_ag_z3_s"])


def test_invalid_shard_groups_name_the_field():
    with pytest.raises(InputError) as e:
        check_config(MODEL, 64, 1, 1, 1, 64, zero=1, shard=8)
    assert e.value.where == "shard" and "ZeRO-2/3" in e.value.problem
    with pytest.raises(InputError) as e:
        check_config(MODEL, 48, 1, 1, 1, 48, zero=3, shard=32)
    assert "does not divide" in e.value.problem


def test_cli_shard_group():
    out = run("predict", "--hardware", "dgx-a100-80gb", "--model", "gpt-13b", "--gpus", "16,64",
              "--zero", "3", "--shard-group", "8", "--json").output  # fmt: skip
    assert '"shard": 8' in out
    err = bad("predict", "--hardware", "dgx-a100-80gb", "--model", "gpt-13b", "--gpus", "64",
              "--zero", "1", "--shard-group", "8")  # fmt: skip
    assert err.where == "--shard-group" and "ZeRO-2/3" in err.problem


def test_predict_plan_shard_matches_evaluate():
    p = predict(MODEL, SYSTEM, [64], Plan(zero=3, shard=8, recompute=2))
    r = evaluate(MODEL, SYSTEM, _st(64, 8))
    assert p.table["iter_s"].iloc[0] == pytest.approx(float(r["iter_s"]), rel=1e-12)


def test_validate_reads_hybrid_rows(tmp_path):
    """A llm-foundry row run with HYBRID_SHARD is predicted with its node-sized shard group."""
    import pandas as pd

    from tests.test_validation_defects import MOSAIC

    df = pd.read_csv(MOSAIC).head(2)
    df["Sharding Strategy"] = ["FULL_SHARD", "HYBRID_SHARD"]
    f = tmp_path / "hybrid.csv"
    df.to_csv(f, index=False)
    import json

    rows = json.loads(run("validate", str(f), "--fit", "none", "--json").output)["per_row"]
    assert len(rows) == 2 and all(np.isfinite(r["predicted"]) for r in rows)


def test_search_adds_one_strategy_per_hybrid_shard_group():
    """Every ZeRO-2/3 strategy whose DP group 8 divides (and exceeds) gains a hybrid twin."""
    from calib.analytic.search import Space, search

    from tests.test_analytic_model import _brute_force

    model, N, B = load_model("megatron-1.7b"), 32, 64
    flat = search(model, SYSTEM, N, B, Space(), top=3)
    hybrid = search(model, SYSTEM, N, B, Space(shard=(0, 8)), top=3)
    every = _brute_force(model, N, B, Space())
    twins = int(np.count_nonzero((every.zero >= 2) & (every.dp % 8 == 0) & (every.dp > 8)))
    assert twins > 0 and hybrid.n_strategies == flat.n_strategies + twins
    best = hybrid.top.iloc[0]
    st = Strategies.of(**{k: int(best[k]) for k in ("tp", "pp", "dp", "micro_batch", "interleave", "zero",
                                                     "recompute", "shard")},
                       seq_parallel=bool(best["seq_parallel"]), dp_overlap=bool(best["dp_overlap"]), global_batch=B)  # fmt: skip
    assert float(evaluate(model, SYSTEM, st)["iter_s"]) == pytest.approx(best["iter_s"], rel=1e-12)
