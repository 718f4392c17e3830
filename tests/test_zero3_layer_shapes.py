"""ZeRO-3's gathered layers, DeepSpeed's gather count and largest matrix, and MLA's kept
activations follow the layer's real matrices (analytic/shape_terms.py ``layer_params_gpu``,
analytic/zero_overlap.py ``layer_matrices``, analytic/mla.py ``attention_kept_coeffs``).

Shapes from analytic/data/models.yaml: llama3-8b (Llama 3 paper Table 3: d 4096, 32 heads,
8 KV heads, SwiGLU ffn 14336), Mixtral 8x7B (arXiv:2401.04088 Table 1: d 4096, 8 KV heads,
hidden 14336, 8 experts), DeepSeek-V3 (arXiv:2412.19437 sec. 4.2 and config.json: d 7168,
128 heads, q_lora_rank 1536, kv_lora_rank 512, rope 64, qk head 192, v head 128, dense ffn
18432, 256 routed + 1 shared experts of 2048, 3 dense layers of 61)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from calib.analytic import formulas as F
from calib.analytic import memory as M
from calib.analytic import mla as MLA
from calib.analytic import zero_overlap as ZO
from calib.analytic.machine import default_calibration
from calib.analytic.modern import moe_params
from calib.analytic.shape_terms import attention_proj_params, layer_params_gpu, shape_terms, stage_params
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, evaluate

LLAMA, MIXTRAL, DSV3, GPT3 = (
    load_model(n) for n in ("llama3-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b")
)


def test_llama3_8b_gathered_layers():
    """Llama 3 8B layer: attention (2 + 2 x 8/32) d^2 = 2.5 x 4096^2 = 41,943,040, SwiGLU 3 d ffn
    = 3 x 4096 x 14336 = 176,160,768: 218,103,808 (GPT's 12 d^2 would say 201,326,592).  FSDP
    holds two gathered layers in fp16: 2 x 2 x 218,103,808 = 872,415,232 bytes at TP 1 and
    436,207,616 at TP 2."""
    assert float(layer_params_gpu(LLAMA, 1)) == 218_103_808
    assert float(M.gathered_bytes(layer_params_gpu(LLAMA, 1), 3)) == 872_415_232
    assert float(M.gathered_bytes(layer_params_gpu(LLAMA, 2), 3)) == 436_207_616
    assert float(M.gathered_bytes(layer_params_gpu(LLAMA, 2), 2)) == 0.0  # ZeRO-2 gathers nothing


def test_gpt3_175b_unchanged():
    """GPT-3 175B (d 12288, GeLU 4d, 96 full heads): 12 d^2 exactly, two layers 3.624e9; as
    tests/test_zero3_live_params.py: FSDP holds them (7.25 GB), DeepSpeed its 1e9 cap (2 GB)."""
    d = 12288.0
    lay = layer_params_gpu(GPT3, 1)
    assert float(lay) == 12 * d * d and 2 * float(lay) == pytest.approx(3.624e9, rel=1e-3)
    big = ZO.largest_matrix(d, 1, 4 * d, 1.0, GPT3, 2.0)
    assert float(big) == 4 * d * d  # one MLP matrix, as before
    assert float(M.gathered_bytes(lay, 3, (big, False))) == 2 * 2 * 12 * d * d
    assert float(M.gathered_bytes(lay, 3, (big, True))) == 2 * 1e9


def test_deepseek_v3_gathered_layer_uses_mla_projections():
    """DeepSeek-V3 at TP 1: MLA attention 187,105,280 (analytic/mla.py docstring); a dense
    layer + 3 x 7168 x 18432 = 396,361,728 -> 583,467,008.  A MoE layer: expert 3 x 7168 x 2048
    = 44,040,192; shared 1 x that; router 7168 x 256 = 1,835,008; at EP 64, 4 local experts
    176,160,768 -> 409,141,248 (+ the MTP projection 2 x 7168^2 = 102,760,448: 511,901,696) < the
    dense layer, which is gathered; at EP 8, 32 local experts 1,409,286,144 -> 1,642,266,624, and
    the MTP block, a MoE layer with its projection, 1,745,027,072 (tests/test_mla_completeness.py)."""
    assert float(attention_proj_params(DSV3)) == 187_105_280
    assert float(layer_params_gpu(DSV3, 1, 64)) == 187_105_280 + 396_361_728
    moe_8 = 187_105_280 + 44_040_192 + 1_835_008 + 1_409_286_144
    assert float(layer_params_gpu(DSV3, 1, 8)) == moe_8 + 102_760_448
    assert float(layer_params_gpu(replace(DSV3, mtp_layers=0), 1, 8)) == moe_8


def test_mixtral_moe_layer_gathered_params():
    """Mixtral 8x7B (no dense layers, no shared experts): attention 41,943,040 + router 4096 x 8
    = 32,768 + E / ep experts of 3 x 4096 x 14336 = 176,160,768.  EP 1: 8 experts ->
    1,451,261,952; EP 8: one -> 218,136,576.  (The old count, 12 d^2 + the experts, said
    1,610,612,736 at EP 1: a dense 8 d^2 MLP the MoE layer does not have, full-head K/V.)"""
    assert float(layer_params_gpu(MIXTRAL, 1, 1)) == 41_943_040 + 32_768 + 8 * 176_160_768
    assert float(layer_params_gpu(MIXTRAL, 1, 8)) == 41_943_040 + 32_768 + 176_160_768
    # TP 2, EP 8: attention and router split, the whole expert not (expert TP 1)
    assert float(layer_params_gpu(MIXTRAL, 2, 8)) == (41_943_040 + 32_768) / 2 + 176_160_768


def test_gather_counts_weigh_the_two_kinds_of_layer_by_their_share():
    """DeepSeek-V3 (no MTP, EP 64, TP 1) mixes 3 dense layers (583,467,008 weights) with 58 MoE
    layers (409,141,248): ZeRO-3 gathers the larger whole, while DeepSpeed's per-layer matrix
    list (what collective_counts counts) stands for the average layer, (3 x 583,467,008 + 58 x
    409,141,248) / 61."""
    model = replace(DSV3, mtp_layers=0)
    ffn, kv, mats, _ = shape_terms(model)
    avg = sum(e * c for e, c, _ in ZO.layer_matrices(model.d_model, ffn, kv, mats, model, 64.0))
    assert float(avg) == pytest.approx((3 * 583_467_008 + 58 * 409_141_248) / 61, rel=1e-12)
    assert float(layer_params_gpu(model, 1.0, 64.0)) == 583_467_008


def test_deepspeed_gather_counts():
    """GPT-3 (4 per layer: QKV, proj, fc1, fc2) unchanged: 96 x 4 + 1 = 385.  DeepSeek-V3, 61
    layers, TP 1, EP 64: MLA's 5 projections per layer (q_a 11.0 M, q_b 37.7 M, kv_a 4.1 M,
    kv_b 16.8 M, o 117.4 M, all >= 1e5); 3 dense layers x 3 MLP matrices; 58 MoE layers x
    (4 local experts x 3 + shared 3 + router 1 = 16): 61 x 5 + 9 + 928 + the embedding = 1243.
    A full-rank query (q_lora_rank 0): 4 projections, 61 fewer."""
    d = 12288.0
    ag, _ = ZO.collective_counts(96, 174.6e9, d, 4 * d, 1.0, 2.0, 1.0, True, GPT3)
    assert float(ag) == 385.0
    ffn, kv, mats, _ = shape_terms(DSV3)
    ag, _ = ZO.collective_counts(61, 1e10, 7168.0, ffn, kv, mats, 1.0, True, DSV3, 64.0)
    assert float(ag) == pytest.approx(1243.0, abs=1e-9)
    full_q = replace(DSV3, q_lora_rank=None)
    assert len(MLA.attention_linears(full_q)) == 4
    ag, _ = ZO.collective_counts(61, 1e10, 7168.0, ffn, kv, mats, 1.0, True, full_q, 64.0)
    assert float(ag) == pytest.approx(1243.0 - 61.0, abs=1e-9)


def test_largest_matrix_follows_the_layer():
    """DeepSeek-V3 TP 1: the dense MLP's 7168 x 18432 = 132,120,576 beats o_proj's 16384 x 7168
    = 117,440,512.  Mixtral TP 8, EP 8: a whole expert matrix 4096 x 14336 = 58,720,256
    (the old formula split it over TP: 7,340,032)."""
    ffn, kv, mats, _ = shape_terms(DSV3)
    assert float(ZO.largest_matrix(7168.0, 1.0, ffn, kv, DSV3, mats, 64.0)) == 132_120_576
    ffn, kv, mats, _ = shape_terms(MIXTRAL)
    assert float(ZO.largest_matrix(4096.0, 8.0, ffn, kv, MIXTRAL, mats, 8.0)) == 58_720_256


def test_mla_kept_activations_deepseek_v3():
    """Per token, bf16 (2 bytes), DeepSeek-V3 at TP 1: the two norm inputs and the attention and
    MLP inputs 4 x 2 x 7168 = 57,344 (no dropout masks); MLA's latents c_q and its norm
    2 x 2 x 1536 = 6144, c_kv + k_rope 2 x 576 = 1152 and c_kv's norm 2 x 512 = 1024 (8320);
    q and k 2 x 128 x 192 each, v and the attention output 2 x 128 x 128 each (163,840); a
    dense layer's SwiGLU intermediates 2 x 3 x 18432 = 110,592.  Flash (no score tensors),
    b 1, s 4096: 340,096 x 4096 = 1,393,033,216 bytes, where full heads said (57,344 +
    114,688 + 110,592) x 4096 = 922,746,880.  At TP 8 without sequence parallelism the latents
    stay whole like the norm inputs: (65,664 + 274,432 / 8) x 4096 = 409,468,928."""
    kept = MLA.attention_kept_coeffs(DSV3)
    assert kept == pytest.approx((163_840 / 7168, 8320 / 7168))
    args = (1.0, 4096.0, 7168.0, 128.0)
    one = F.activation_bytes_layer(*args, 1, False, F.NONE, True, 18432 / 7168, 1.0, 3.0, False, kept)
    assert float(one) == pytest.approx(1_393_033_216, rel=1e-12)
    old = F.activation_bytes_layer(*args, 1, False, F.NONE, True, 18432 / 7168, 1.0, 3.0, False)
    assert float(old) == pytest.approx(922_746_880, rel=1e-12)
    tp8 = F.activation_bytes_layer(*args, 8, False, F.NONE, True, 18432 / 7168, 1.0, 3.0, False, kept)
    assert float(tp8) == pytest.approx(409_468_928, rel=1e-12)
    assert MLA.attention_kept_coeffs(LLAMA) is None and MLA.attention_kept_coeffs(MIXTRAL) is None


def _weights(model, ep, zero_impl):
    hw = load_hardware("dgx-a100-80gb")
    st = Strategies.of(tp=2, pp=1, dp=8, ep=ep, micro_batch=1, global_batch=8, zero=3, zero_impl=zero_impl,
                       seq_parallel=True, recompute=2)  # fmt: skip
    return float(np.ravel(evaluate(model, System(default_calibration(hw), hw), st)["mem_weights_bytes"])[0])


def test_time_model_charges_the_real_layer():
    """Through timemodel.evaluate, TP 2, DP 8, ZeRO-3 FSDP: weights = 2 P / 8 (the stage's
    shards) + 2 x 2 x the gathered layer.  Llama 3 8B: + 436,207,616; Mixtral 8x7B at EP 8
    (experts over EDP = 2 x 8 / 8 = 2): + 4 x ((41,943,040 + 32,768) / 2 + 176,160,768)."""
    ffn, kv, mats, tied = shape_terms(LLAMA)
    P = stage_params(
        4096.0, 32.0, 8192.0, 128256.0, 2.0, 1.0, ffn, kv, mats, tied, attention_proj_params(LLAMA)
    )
    assert _weights(LLAMA, 1, 1) == pytest.approx(2 * float(P) / 8 + 436_207_616, rel=1e-12)
    ffn, kv, mats, tied = shape_terms(MIXTRAL)
    shared, routed = moe_params(MIXTRAL, 4096.0, 2.0, 1.0, 8.0, mats)
    dense = stage_params(
        4096.0, 32.0, 32768.0, 32000.0, 2.0, 1.0, 0.0, kv, mats, tied, attention_proj_params(MIXTRAL)
    )
    states = 2 * float(dense + shared) / 8 + 2 * float(routed) / 2
    layer = (41_943_040 + 32_768) / 2 + 176_160_768
    assert _weights(MIXTRAL, 8, 1) == pytest.approx(states + 4 * layer, rel=1e-12)
