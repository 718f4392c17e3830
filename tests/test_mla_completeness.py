"""Multi-head latent attention where the model used to take full heads of d / a: op-level SAC's
re-run matmuls and kept outputs, context parallelism's K/V bytes, FP8 casts, and the MTP block
as a ZeRO-3 gathered layer (analytic/mla.py module docstring).

DeepSeek-V3 (analytic/data/models.yaml, config.json: d 7168, 128 heads, q_lora_rank 1536,
kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128 -> qk head 192, v head 128, dense
SwiGLU ffn 18432).  Its projections (in -> out): q_a 7168 -> 1536, q_b 1536 -> 24576 (128 x 192),
kv_a 7168 -> 576 (512 + 64), kv_b 512 -> 32768 (128 x (128 + 128)), o 16384 (128 x 128) -> 7168.
Non-MLA models (llama3-8b) must give exactly the numbers of the full-head formulas."""

from __future__ import annotations

from dataclasses import replace

import pytest
from calib.analytic import formulas as F
from calib.analytic import mla as MLA
from calib.analytic.specs import load_model

LLAMA, DSV3 = (load_model(n) for n in ("llama3-8b", "deepseek-v3"))
D, FFN, S = 7168.0, 18432.0, 4096.0


def test_op_sac_follows_the_mla_projections():
    """torchtitan's op-SAC re-runs every second mm of the block (``_custom_policy``); its
    DeepSeek-V3 Attention.forward calls wq_a, wq_b, wkv_a, wkv_b, wo (models/deepseek_v3/model/
    model.py), then the MLP's w1, w3, w2.  Re-run: q_b 1536 x 24576 = 37,748,736 and kv_b
    512 x 32768 = 16,777,216 (54,525,952), then -- five attention mms, so the MLP starts on an
    even one -- w1 and w2, 2 x 7168 x 18432 = 264,241,152: forward FLOPs 2 s x 318,767,104 =
    2,611,340,115,968 at s 4096 (full heads said 2 s (2 d^2 + d f) = 1,924,145,348,608).
    Kept per token, 2 bytes a value: the block input 7168, q_a's 1536, kv_a's 576, o's 7168,
    the attention output 16384 (o's input) and w3's 18432: 102,528 bytes (full heads: 2 (5 d + f)
    = 108,544); x 4096 tokens = 419,954,688 bytes per layer at TP 1."""
    op = MLA.op_sac_terms(DSV3)
    assert op == (54_525_952.0, pytest.approx(2 * 25_664 / D), 5)
    assert float(F.op_sac_recompute_flops(1, S, D, FFN, 1.0, op, 3.0)) == 2_611_340_115_968
    assert float(F.op_sac_recompute_flops(1, S, D, FFN, 1.0)) == 1_924_145_348_608
    assert float(F.op_sac_kept_coeff(FFN / D, 1.0, 3.0, op)) * D == pytest.approx(102_528, rel=1e-12)
    kept = MLA.attention_kept_coeffs(DSV3)
    one = F.activation_bytes_layer(1, S, D, 128, 1, False, F.OP, True, FFN / D, 1.0, 3.0, False, kept, op)
    assert float(one) == pytest.approx(419_954_688, rel=1e-12)
    extra = F.training_flops_layers(1, S, D, 1, F.OP, FFN, 1.0, 3.0, 187_105_280.0, op) - (
        F.training_flops_layers(1, S, D, 1, F.NONE, FFN, 1.0, 3.0, 187_105_280.0, op)
    )
    assert float(extra) == pytest.approx(2_611_340_115_968, rel=1e-12)


def test_op_sac_full_rank_query_keeps_the_old_parity():
    """q_lora_rank 0: q, kv_a, kv_b, o (four mms, the MLP starts on an odd one as with full
    heads).  Re-run kv_a 7168 x 576 = 4,128,768 + o 16384 x 7168 = 117,440,512 = 121,569,280;
    kept: q's 24576 + kv_b's 32768 + the attention output 16384 = 73,728 values; with the block
    input and w1's and w2's outputs 2 (73,728 + 7168 + 18432 + 7168) = 212,992 bytes per token."""
    op = MLA.op_sac_terms(replace(DSV3, q_lora_rank=None))
    assert op[0] == 121_569_280 and op[2] == 4
    assert float(F.op_sac_kept_coeff(FFN / D, 1.0, 3.0, op)) * D == pytest.approx(212_992, rel=1e-12)
    assert float(F.op_sac_recompute_flops(1, S, D, FFN, 1.0, op, 3.0)) == 2 * S * (121_569_280 + D * FFN)


def test_op_sac_non_mla_unchanged():
    """Llama 3 8B: no MLA terms, and the op-SAC numbers are the full-head formulas' exactly
    (tests/test_op_sac.py: 2 s (d^2/4 + d^2 + d f) and 15.5 d bytes)."""
    assert MLA.op_sac_terms(LLAMA) is None
    d, s, f = 4096.0, 8192.0, 14336.0
    assert float(F.op_sac_recompute_flops(1, s, d, f, 0.25, MLA.op_sac_terms(LLAMA), 3.0)) == 2 * s * (
        d * d / 4 + d * d + d * f
    )
    args = (1, s, d, 32, 1, False, F.OP, True, f / d, 0.25, 3.0, False)
    assert F.activation_bytes_layer(*args, None, None) == F.activation_bytes_layer(*args) == 15.5 * s * d


def test_context_parallel_exchanges_the_up_projected_k_and_v():
    """Megatron-Core's MLA up-projects K and V on each CP rank (multi_latent_attention.py) and
    its CP attention exchanges them: per token k 128 x 192 = 24,576 and v 128 x 128 = 16,384
    values (40,960; full heads 2 d kv/a = 14,336).  b 1, s 4096, CP 4, TP 1, bf16: a ring step
    1024 x 40,960 x 2 = 83,886,080 bytes (full heads 29,360,128); Ulysses q + k + v 1024 x
    65,536 x 2 = 134,217,728 and the output 1024 x 16,384 x 2 = 33,554,432; Llama 3's
    all-gather of K and V 4096 x 40,960 x 2 = 335,544,320."""
    from calib.analytic import context as CP

    w = MLA.head_widths(DSV3)
    assert w == (24_576.0, 24_576.0, 16_384.0, 16_384.0)
    assert float(CP.ring_step_bytes(1, S, D, 1.0, 4, 1, widths=w)) == 83_886_080
    assert float(CP.ring_step_bytes(1, S, D, 1.0, 4, 1)) == 29_360_128
    assert float(CP.ring_bytes_layer(1, S, D, 1.0, 4, 1, widths=w)) == 9 * 83_886_080
    qkv, o = CP.ulysses_buffer_bytes(1, S, D, 1.0, 4, 1, widths=w)
    assert (float(qkv), float(o)) == (134_217_728, 33_554_432)
    assert float(CP.allgather_kv_bytes(1, S, D, 1.0, 1, widths=w)) == 335_544_320


def _system_strategy(**kw):
    from calib.analytic.machine import default_calibration
    from calib.analytic.specs import load_hardware
    from calib.analytic.strategy import Strategies
    from calib.analytic.timemodel import System

    hw = load_hardware("dgx-h100")
    base = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "global_batch": 8, "flash_attention": True}
    return System(default_calibration(hw), hw), Strategies.of(**{**base, **kw})


def test_context_parallel_time_uses_the_mla_bytes():
    """comm_times' CP all-gather for DeepSeek-V3 at CP 4 is the time of the 335,544,320 bytes
    above; Llama 3 8B keeps 2 s d kv/a x 2 = 2 x 8192 x 1024 x 2 = 33,554,432 bytes."""
    from calib.analytic.comm import group_time_s, members_per_node
    from calib.analytic.timemodel import comm_times

    from calib.core.collective_names import ALLGATHER

    for model, nbytes in ((DSV3, 335_544_320.0), (LLAMA, 33_554_432.0)):
        system, st = _system_strategy(cp=4, cp_kind=2)
        want = group_time_s(system.comm_cal, ALLGATHER, nbytes, 4.0, members_per_node(4.0, 1.0, 8))
        assert float(comm_times(model, system, st)["cp_ag_s"]) == float(want)
    assert MLA.head_widths(LLAMA) is None


def test_fp8_casts_follow_the_mla_projections():
    """Each MLA projection is its own FP8 linear casting its own input (Transformer Engine):
    inputs per token q_a 7168 + q_b 1536 + kv_a 7168 + kv_b 512 + o 16384 = 32,768 (fused QKV +
    projection of full heads: 2 d = 14,336); gradient outputs 1536 + 24,576 + 576 + 32,768 +
    7168 = 66,624 (full heads 4 d = 28,672).  A dense layer adds fc1 d and fc2 f inputs and
    (mats - 1) f + d gradients: 4 x (32,768 + 7168 + 18,432) + 3 x (66,624 + 36,864 + 7168) =
    233,472 + 331,968 = 565,440 bytes per token (full heads 4 x 39,936 + 3 x 72,704 = 377,856);
    with full recompute the inputs twice: 798,912."""
    from calib.analytic import precision as PR

    io = MLA.linear_io(MLA.attention_linears(DSV3))
    assert io == (32_768.0, 66_624.0)
    assert float(PR.cast_bytes_layer(S, D, FFN, 1.0, 3.0, 1, 1.0, io)) == 565_440 * S
    assert float(PR.cast_bytes_layer(S, D, FFN, 1.0, 3.0, 1, 1.0)) == 377_856 * S
    assert float(PR.cast_bytes_layer(S, D, FFN, 1.0, 3.0, 8, 2.0, io)) == 798_912 * S / 8
    assert MLA.linear_io(MLA.attention_linears(LLAMA)) is None
    llama = PR.cast_bytes_layer(8192, 4096, 14336, 0.25, 3.0, 1, 1.0, None)
    assert float(llama) == 8192 * (4 * (3 * 4096 + 14336) + 3 * (1.5 * 4096 + 4096 + 2 * 14336 + 4096))


def test_mtp_block_is_a_gathered_layer():
    """DeepSeek-V3's MTP depth (mla.py "MTP") is one more MoE layer with the 2d x d projection
    2 x 7168^2 = 102,760,448 (Megatron-Core's MultiTokenPredictionLayer holds both: one
    ZeRO-3 unit).  TP 1, EP 8: a MoE layer 187,105,280 + shared 44,040,192 + router 1,835,008
    + 32 local experts 1,409,286,144 = 1,642,266,624, the MTP block 1,745,027,072, gathered.
    At EP 64 (the published run) the MoE layer is 409,141,248, the MTP block 511,901,696, and
    the dense layer 583,467,008 stays the largest: no change there."""
    from calib.analytic import zero_overlap as ZO
    from calib.analytic.shape_terms import layer_params_gpu, shape_terms

    assert float(layer_params_gpu(DSV3, 1, 8)) == 1_745_027_072
    assert float(layer_params_gpu(DSV3, 1, 64)) == 583_467_008
    no_mtp = replace(DSV3, mtp_layers=0)
    assert float(layer_params_gpu(no_mtp, 1, 8)) == 1_642_266_624
    ffn, kv, mats, _ = shape_terms(DSV3)
    mtp = ZO.mtp_matrices(D, ffn, kv, mats, DSV3, 8.0)
    assert sum(e * c for e, c, _ in mtp) == pytest.approx(1_745_027_072, rel=1e-12)
    assert ZO.mtp_matrices(D, ffn, kv, mats, no_mtp, 8.0) == []
    # the projection (102.8 M) is below the dense MLP matrix 7168 x 18432 = 132,120,576
    assert float(ZO.largest_matrix(D, 1.0, ffn, kv, DSV3, mats, 64.0)) == 132_120_576


def test_mtp_block_in_the_gather_counts():
    """DeepSpeed gathers matrix by matrix: with one stage (DeepSpeed's ZeRO-3 runs without
    PP) the stage holds the MTP block too: 1243 for the 61 layers and the embedding
    (tests/test_zero3_layer_shapes.py) + MLA's 5 + 4 local experts x 3 + shared 3 + router 1 +
    the projection 1 = 22 at EP 64: 1265.  FSDP: one module more, 61 + 1 + 1 = 63.  With PP the
    MTP block sits on the last stage, the timed (largest) stage's count leaves it out (mtp 0)."""
    from calib.analytic import zero_overlap as ZO
    from calib.analytic.shape_terms import shape_terms

    ffn, kv, mats, _ = shape_terms(DSV3)
    args = (1e10, D, ffn, kv, mats, 1.0)
    ds, _ = ZO.collective_counts(61, *args, True, DSV3, 64.0, 1.0)
    fsdp, _ = ZO.collective_counts(61, *args, False, DSV3, 64.0, 1.0)
    assert (float(ds), float(fsdp)) == (pytest.approx(1265.0, abs=1e-9), 63.0)
    assert float(ZO.collective_counts(61, *args, True, DSV3, 64.0)[0]) == pytest.approx(1243.0, abs=1e-9)
    lf, lkv, lm, _ = shape_terms(LLAMA)
    got = ZO.collective_counts(32, 8e8, 4096.0, lf, lkv, lm, 1.0, True, LLAMA, 1.0, 0.0)
    assert tuple(map(float, got)) == (
        32 * 5 + 1.0,
        2.0,
    )  # QKV, proj, 3 MLP per layer + embedding; 8e8 / 5e8 buckets


def test_mtp_block_under_op_sac():
    """The MTP block re-runs under op-level SAC what a layer of its kind does: a MoE block's
    experts are not re-run (as on the layers), so MLA's q_b and kv_b, 2 x 4096 x 54,525,952 =
    446,676,598,784 FLOPs per sequence; before, op-SAC re-ran nothing of the MTP block."""
    model_fl, hw_fl = MLA.mtp_iteration_flops(DSV3, 1.0, S, F.OP)
    assert float(hw_fl - model_fl) == 446_676_598_784
    model_fl, hw_fl = MLA.mtp_iteration_flops(DSV3, 1.0, S, F.NONE)
    assert float(hw_fl - model_fl) == 0.0
