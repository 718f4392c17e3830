"""Mixture of experts and expert parallelism: hand-worked parameters, FLOPs, all-to-all bytes
and times, memory sharding and the grouped expert GEMM shape (analytic/moe.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from calib.analytic import moe as MOE
from calib.analytic.machine import default_calibration
from calib.analytic.specs import ModelSpec, load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, comm_times, evaluate

from calib.core.errors import InputError

H100 = load_hardware("dgx-h100")
SYS = System(default_calibration(H100), H100)


def test_mixtral_8x7b_total_and_active_parameters():
    """Jiang et al. 2024 (arXiv:2401.04088) sec. 2: 46.7 B total, 12.9 B active.

    By hand (d 4096, 32 layers, 8 kv of 32 heads, SwiGLU experts of 14336, untied, V 32000):
    attention (2 + 2 x 8/32) d^2 x 32 = 1,342,177,280; one expert 3 d 14336 = 176,160,768;
    8 experts x 32 layers = 45,097,156,608; router 32 x 4096 x 8 = 1,048,576; embedding and
    head 2 x 32000 x 4096 = 262,144,000.
    """
    total, active = MOE.total_and_active_params(load_model("mixtral-8x7b"))
    assert total == 1_342_177_280 + 45_097_156_608 + 1_048_576 + 262_144_000 == 46_702_526_464
    assert active == 1_342_177_280 + 2 * 32 * 176_160_768 + 1_048_576 + 262_144_000 == 12_879_659_008
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9


def test_mixtral_8x22b_and_deepseek_v3_parameter_counts():
    """Model card: 8x22B 141 B / 39 B.  DeepSeek-V3 report (arXiv:2412.19437): 671 B total and
    36.6 B activated without the input embedding (its HF weight notes), with MLA's low-rank
    projections (187,105,280 weights per layer, analytic.mla; tests/test_mla_mtp.py by hand)."""
    t22, a22 = MOE.total_and_active_params(load_model("mixtral-8x22b"))
    assert abs(t22 / 141e9 - 1) < 0.005 and abs(a22 / 39e9 - 1) < 0.01
    ds = load_model("deepseek-v3")
    tot, act = MOE.total_and_active_params(ds)
    assert abs(tot / 671e9 - 1) < 0.005
    lookup = ds.vocab * ds.d_model
    assert abs((act - lookup) / 36.6e9 - 1) < 0.01


def test_flops_per_token_match_the_time_models_model_flops():
    """Forward FLOPs per token = 2 x active matrix parameters (Kaplan et al. 2020 sec. 2.1) +
    4 s d per layer; for Mixtral at s = 4096 by hand: 2 (12,879,659,008 - 131,072,000) +
    4 x 4096 x 4096 x 32 = 27,644,657,664.  The time model's model FLOPs per iteration must
    be exactly 3 x B x s x that (forward + backward)."""
    mx = replace(load_model("mixtral-8x7b"), seq_len=4096)
    fpt = MOE.forward_flops_per_token(mx)
    assert fpt == 2 * (12_879_659_008 - 131_072_000) + 4 * 4096 * 4096 * 32 == 27_644_657_664
    st = Strategies.of(tp=1, pp=1, dp=64, micro_batch=1, global_batch=256, ep=8, zero=1, recompute=2)
    r = evaluate(mx, SYS, st)
    model_flops = float(r["model_tflops_per_gpu"]) * 1e12 * float(r["iter_s"]) * 64
    assert model_flops == pytest.approx(3 * 256 * 4096 * fpt, rel=1e-12)
    # full recompute: the hardware FLOPs add one forward of the layers (not of the LM head, 6 B s d V)
    hw_flops = float(r["hw_tflops_per_gpu"]) * 1e12 * float(r["iter_s"]) * 64
    head = 6 * 256 * 4096 * 4096 * 32000
    assert hw_flops - model_flops == pytest.approx((model_flops - head) / 3, rel=1e-9)


def test_all_to_all_bytes_and_time_by_hand():
    """Mixtral, b 1, s 4096, TP 1, CP 1: T = 4096 tokens per GPU, top-2, d 4096, bf16 ->
    dispatch buffer 4096 x 2 x 4096 x 2 = 67,108,864 bytes (nccl-tests size), of which
    (ep - 1)/ep = 7/8 leaves the GPU.  EP = 8 inside a DGX H100: nccl-tests time
    alpha + size (n-1)/n / busbw = 20 us + 67,108,864 x 7/8 / 337.5 GB/s (the spec's stated
    defaults: 450 GB/s NVLink x 0.75), the buffer of the busiest EP rank: x 1.0148 (dropless
    routing, analytic.moe.max_load_factor)."""
    T = MOE.tokens_per_gpu(1, 4096, 1, 1)
    assert T == 4096
    nbytes = MOE.dispatch_bytes(T, 2, 4096)
    assert nbytes == 67_108_864
    mx = replace(load_model("mixtral-8x7b"), seq_len=4096)
    c = comm_times(mx, SYS, Strategies.of(tp=1, pp=1, dp=64, micro_batch=1, global_batch=64, ep=8))
    busiest = float(MOE.max_load_factor(4096, 2, 8))
    assert busiest == pytest.approx(1.0148, abs=1e-4)
    assert float(c["ep_dispatch_s"]) == pytest.approx(
        20e-6 + busiest * 67_108_864 * 7 / 8 / 337.5e9, rel=1e-9
    )
    # FP8 dispatch (DeepSeek-V3 sec. 3.3): 1 byte + one fp32 scale per 128 values; combine stays bf16
    c8 = comm_times(mx, SYS, Strategies.of(tp=1, pp=1, dp=64, micro_batch=1, global_batch=64, ep=8, fp8=True))
    assert float(c8["ep_combine_s"]) == float(c["ep_combine_s"])
    assert float(c8["ep_dispatch_s"]) == pytest.approx(
        20e-6 + busiest * 4096 * 2 * 4096 * (1 + 4 / 128) * 7 / 8 / 337.5e9
    )
    # per layer and micro-batch: dispatch + combine forward, both gradients backward (4 all-to-alls)
    assert MOE.a2a_count(False) == 4 and MOE.a2a_count(True) == 6


def test_expert_weights_shard_over_ep_and_states_over_edp():
    """Mixtral, PP 1, TP 1: one stage holds 32 x 8 experts of 176,160,768 weights; EP = 8 keeps
    one expert per layer per GPU: 32 x 176,160,768 = 5,637,144,576 weights; with the
    distributed optimizer (ZeRO-1) their fp32 states (12 bytes) shard over EDP = 64 / 8 = 8."""
    mx = replace(load_model("mixtral-8x7b"), seq_len=4096)
    shared, routed = MOE.params_split(mx, 4096, 1, 1, 8, 3.0)
    assert routed == 32 * 176_160_768 == 5_637_144_576
    assert shared == 32 * 4096 * 8  # the routers (no shared experts)
    base = dict(tp=1, pp=1, dp=64, micro_batch=1, global_batch=64, zero=1, dist_opt=True, recompute=2)
    r1, r8 = (evaluate(mx, SYS, Strategies.of(**base, ep=e)) for e in (1, 8))
    d_weights = float(r1["mem_weights_bytes"] - r8["mem_weights_bytes"])
    assert d_weights == pytest.approx(2 * (8 - 1) * 5_637_144_576, rel=1e-12)
    d_optim = float(r1["mem_optimizer_bytes"] - r8["mem_optimizer_bytes"])
    assert d_optim == pytest.approx(12 * (8 * 5_637_144_576 / 64 - 5_637_144_576 / 8), rel=1e-12)


def test_grouped_expert_gemm_efficiency_follows_the_per_expert_shape():
    """Per-expert GEMM: M = C ep T k / E tokens; Mixtral at EP 8, T 4096: M = 8192,
    2 M d f_e = 2 x 8192 x 4096 x 14336 = 962,072,674,304 FLOPs.  Splitting the same active
    work into 8x finer experts (E 64, top-16, f_e 1792) shrinks each GEMM 64-fold, so at the
    default saturating efficiency (half at 2 GFLOP) the experts take longer."""
    assert MOE.expert_gemm_flops(4096, 2, 1.0, 8, 8, 4096, 14336) == 962_072_674_304
    mx = replace(load_model("mixtral-8x7b"), seq_len=4096)
    fine = replace(mx, n_experts=64, top_k=16, expert_ffn=1792)
    assert MOE.forward_flops_per_token(fine) == pytest.approx(
        MOE.forward_flops_per_token(mx) + 2 * 32 * 4096 * 56, rel=1e-12
    )  # same expert FLOPs; only the router grows (64 - 8 columns)
    st = Strategies.of(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, ep=8, recompute=2)
    coarse_k = float(evaluate(mx, SYS, st)["kernel_transformer_s"])
    fine_k = float(evaluate(fine, SYS, st)["kernel_transformer_s"])
    assert fine_k > coarse_k


def test_capacity_factor_pads_expert_work_and_bad_moe_shapes_are_named():
    mx = replace(load_model("mixtral-8x7b"), seq_len=4096)
    st = Strategies.of(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, ep=8)
    base, padded = (comm_times(m, SYS, st)["ep_dispatch_s"] for m in (mx, replace(mx, capacity_factor=1.25)))
    assert float(padded) > float(base)
    with pytest.raises(InputError, match="top_k"):
        ModelSpec("x", 1024, 4, 8, 128, 1000, n_experts=8, top_k=9)
    with pytest.raises(InputError, match="n_experts"):
        ModelSpec("x", 1024, 4, 8, 128, 1000, top_k=2)
    with pytest.raises(InputError, match="capacity_factor"):
        ModelSpec("x", 1024, 4, 8, 128, 1000, n_experts=8, top_k=2, capacity_factor=0.5)
    assert np.all(MOE.dense_ffn_avg(load_model("deepseek-v3"), 18432) == 18432 * 3 / 61)


def test_fitted_device_model_path_shards_experts_too(tmp_path):
    """With a device model fitted on the real H100 traces (fixtures/traces/h100) the dense part
    comes from the fit and the experts from moe.py: EP 8 with the distributed optimizer shards
    the routed experts' 12 bytes of optimizer state over EDP = 8, as without a fit: EP 1 holds
    8 x 5,637,144,576 expert weights sharded over 64, EP 8 holds 5,637,144,576 over 8."""
    import shutil
    from pathlib import Path

    from calib.api import SystemModel, ingest_run, load_runs

    h100 = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "h100"
    for run in sorted((h100 / "runs").iterdir()):
        ingest_run(run, system="h100-hf", store=tmp_path)
    for bench in (h100 / "gemm-bench").iterdir():
        shutil.copytree(bench, tmp_path / "h100-hf" / "runs" / bench.name)
    model = SystemModel().fit(load_runs(system="h100-hf", store=tmp_path))
    mx = replace(load_model("mixtral-8x7b"), seq_len=4096)
    kw = dict(
        hardware="dgx-h100", global_batch=64, recompute="full", flash_attention=True, zero=1, dist_opt=True
    )
    t1, t8 = (model.predict(mx, [64], ep=e, **kw).table.iloc[0] for e in (1, 8))
    d_optim = (t1["mem_optimizer_gb"] - t8["mem_optimizer_gb"]) * 1e9
    assert d_optim == pytest.approx(12 * (8 * 5_637_144_576 / 64 - 5_637_144_576 / 8), rel=1e-9)
    assert t8["ep_cp_exposed_s"] > 0 and t8["iter_s"] > 0


def test_moe_activation_bytes_by_hand():
    """Per routed token: expert input d + SwiGLU gate, up and product 3 f_e + expert output d,
    bf16.  Mixtral at b 1, s 4096 (T 4096 tokens, top-2): 8192 routed tokens x (2 x 4096 +
    3 x 14336) values x 2 bytes = 838,860,800 bytes per MoE layer, replacing the dense MLP's
    19 s b d (Korthikanti sec. 4.1)."""
    mx = replace(load_model("mixtral-8x7b"), seq_len=4096)
    assert MOE.activation_bytes_layer(mx, 4096, 4096, 3.0) == 8192 * (2 * 4096 + 3 * 14336) * 2 == 838_860_800


def test_busiest_ep_rank_under_balanced_routing():
    """The statistical floor of MoE load imbalance (analytic.moe.max_load_factor): by hand
    (Blom's z for the largest of 8 normals, 1.434) and against multinomial routing drawn
    10,000 times (seeded): the busiest of 8 ranks carries 1.48 % more than the mean."""
    from calib.analytic.moe import max_load_factor

    assert float(max_load_factor(4096, 2, 8)) == pytest.approx(1 + 1.4338 * (0.875 / 8192) ** 0.5, rel=1e-5)
    assert float(max_load_factor(4096, 2, 1)) == 1.0
    rng = np.random.default_rng(0)
    loads = rng.multinomial(8 * 4096 * 2, [1 / 8] * 8, size=10_000)
    simulated = float(np.mean(loads.max(axis=1)) / (4096 * 2))
    assert simulated == pytest.approx(float(max_load_factor(4096, 2, 8)), abs=0.0015)


def test_mla_attention_core_by_hand():
    """DeepSeek-V3's multi-head latent attention (config.json: 128 heads, query/key 128 + 64,
    value 128): the attention core per layer is 2 b s^2 a (d_qk + d_v) = 81,920 b s^2 FLOPs
    forward against the 4 b s^2 d = 28,672 b s^2 a d / a-wide core would take: 2.857x.  The
    time model adds exactly (factor - 1) of the counted core's training passes, and flash's
    recomputed scores on the widened core."""
    from calib.analytic import formulas as F
    from calib.analytic.shape_terms import attention_dims_factor, shape_terms

    # the core alone: MLA's projections and the MTP module are tests/test_mla_mtp.py's
    m = replace(
        load_model("deepseek-v3"), q_lora_rank=None, kv_lora_rank=None, qk_rope_head_dim=None, mtp_layers=0
    )
    assert (m.qk_head_dim, m.v_head_dim) == (192, 128)
    assert attention_dims_factor(m) == pytest.approx(128 * (192 + 128) / (2 * 7168), rel=1e-12)
    assert attention_dims_factor(load_model("llama3-70b")) == 1.0
    # the time model's transformer kernels, MLA against the same model without the widths
    plain = replace(m, qk_head_dim=None, v_head_dim=None)
    st = Strategies.of(tp=1, pp=1, dp=1, ep=1, micro_batch=1, global_batch=1, zero=0, recompute=0,
                       flash_attention=True)  # fmt: skip
    sys0 = System(default_calibration(H100), H100, vector_passes=0.0)
    wide, narrow = (float(np.ravel(evaluate(x, sys0, st)["kernel_transformer_s"])[0]) for x in (m, plain))
    ffn, kv, mats, _ = shape_terms(m)
    x = F.forward_flops_layer(1, m.seq_len, m.d_model, MOE.dense_ffn_avg(m, ffn), kv, mats) / 6
    eff = float(np.ravel(sys0.cal.gemm_efficiency(x))[0])
    core = 4.0 * m.seq_len**2 * m.d_model  # forward, one layer
    added = m.n_layers * (attention_dims_factor(m) - 1.0) * core * 3.5 / (H100.peak_tflops * 1e12 * eff)
    assert wide - narrow == pytest.approx(added, rel=1e-9)
