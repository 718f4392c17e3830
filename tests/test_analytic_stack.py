"""Context parallelism, FP8, pipeline schedules, overlap fractions, the distributed optimizer:
hand-worked values on the papers' formulas (analytic/context.py, precision.py, bubble.py,
overlap.py, modern.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from calib.analytic import context as CP
from calib.analytic import overlap as OV
from calib.analytic import precision as PR
from calib.analytic.bubble import (
    DUALPIPE,
    ONE_F_ONE_B,
    ZB_H1,
    bubble_s,
    in_flight_scale,
    param_copies,
    pipeline_time_s,
)
from calib.analytic.machine import default_calibration
from calib.analytic.modern import attn_fwd_flops, check_modern, cp_attention_extra_flops
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, comm_times, evaluate

from calib.core.errors import InputError

H100 = load_hardware("dgx-h100")
SYS = System(default_calibration(H100), H100)


# ---- context parallelism ---------------------------------------------------------------------
def test_ring_attention_bytes_by_hand():
    """Liu et al. 2023 (Ring Attention) sec. 3: each of the c - 1 steps sends the K and V block
    of the local s / c tokens.  Llama 3 70B shape (d 8192, 8 of 64 kv heads), s = 131072,
    CP 8, TP 8, bf16: 2 x 16384 x 8192 x 1/8 / 8 x 2 = 8,388,608 bytes per step; per layer
    (c - 1) forward + 2 (c - 1) backward (K, V and dK, dV) = 21 steps' bytes = 176,160,768."""
    step = CP.ring_step_bytes(1, 131072, 8192, 8 / 64, 8, 8)
    assert step == 8_388_608
    assert CP.ring_bytes_layer(1, 131072, 8192, 8 / 64, 8, 8) == 21 * 8_388_608 == 176_160_768
    assert CP.ring_bytes_layer(1, 131072, 8192, 8 / 64, 8, 8, recompute_full=True) == 28 * 8_388_608


def test_ulysses_volume_is_the_papers_4Nh_over_P():
    """Jacobs et al. 2023 (DeepSpeed-Ulysses) sec. 3.2: Q, K, V and output all-to-alls move an
    aggregate 4 N h / P per GPU for multi-head attention: N 32768, h 4096, P 8 -> 67,108,864."""
    qkv, out = CP.ulysses_buffer_bytes(1, 32768, 4096, 1.0, 8, 1, bytes_per_value=1.0)
    assert qkv + out == CP.ulysses_volume_elements(32768, 4096, 8) == 4 * 32768 * 4096 / 8 == 67_108_864
    # grouped-query attention (8 of 64 heads): (2 + 2 / 8) N h / P
    qkv, out = CP.ulysses_buffer_bytes(1, 32768, 4096, 1 / 8, 8, 1, bytes_per_value=1.0)
    assert qkv + out == (2 + 2 / 8) * 32768 * 4096 / 8


def test_cp_attention_flops_and_causal_balance():
    """Attention core forward 4 b s^2 d (Narayanan et al. eq. 3 convention); a GPU of a
    load-balanced CP group computes 1/c of it: s = 1,048,576 (seed 002's million-token regime),
    d 4096, CP 64, TP 8 -> 4 x 2^40 x 4096 / 512 = 3.5184e16.  The time model counts the local
    (s/c)^2 block and adds (c - 1) more, which must equal that; a blockwise (flash) backward does
    2.5x the forward (recomputed scores), so a training step is 3.5 forwards of it.  Naive
    contiguous chunks: the last GPU does (2c - 1)/c times the mean (Megatron's 2c-chunk split
    removes it)."""
    s, d, c, t = 1_048_576, 4096, 64, 8
    per_gpu = CP.attention_flops_per_gpu(1, s, d, c, t)
    assert per_gpu == pytest.approx(4 * 2.0**40 * 4096 / 512)
    s_loc = s / c
    local = attn_fwd_flops(1, s_loc, d, t)
    counted = (
        3 * local
        + CP.flash_backward_extra_flops(local, True)
        + cp_attention_extra_flops(1, s_loc, d, t, c, 0)
    )
    assert counted == pytest.approx(3.5 * per_gpu, rel=1e-12)
    assert CP.causal_imbalance(8, balanced=False) == pytest.approx(15 / 8)
    assert CP.causal_imbalance(8) == 1.0
    assert CP.attention_flops(1, 4, 1, causal=True) == pytest.approx(4 * 16 * 5 / 8)  # (s+1)/(2s)


def test_flash_backward_recomputes_the_scores_in_the_time_model():
    """FlashAttention's backward recomputes S = Q K^T: five matmuls against the forward's two
    (Dao et al. 2022 Algorithm 4), 2.5x the forward where a stored-probability backward does 2x.
    Llama 3 8B, s 8192, one H100, no recompute, no element-wise traffic: switching flash on adds
    exactly L x 0.5 x 4 s^2 d FLOPs at the GEMM efficiency of the layer's matmuls
    (32 x 0.5 x 4 x 8192^2 x 4096 / (989e12 x eff)) to the transformer kernels' time."""
    import numpy as np
    from calib.analytic import formulas as F
    from calib.analytic.shape_terms import shape_terms

    assert (
        CP.flash_backward_extra_flops(4.0, True) == 2.0 and CP.flash_backward_extra_flops(4.0, False) == 0.0
    )
    cal = default_calibration(H100)
    sys0 = System(cal, H100, vector_passes=0.0)
    m, s = replace(load_model("llama3-8b"), seq_len=8192), 8192
    base = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, zero=0, recompute=0)
    on, off = (evaluate(m, sys0, Strategies.of(**base, flash_attention=f)) for f in (True, False))
    ffn, kv, mats, _ = shape_terms(m)
    eff = float(np.ravel(cal.gemm_efficiency(F.forward_flops_layer(1, s, m.d_model, ffn, kv, mats) / 6))[0])
    extra = m.n_layers * 0.5 * 4 * s * s * m.d_model / (H100.peak_tflops * 1e12 * eff)
    got = float(np.ravel(on["kernel_transformer_s"])[0] - np.ravel(off["kernel_transformer_s"])[0])
    assert got == pytest.approx(extra, rel=1e-9)
    # eff 0.8013: the H100's measured max achievable matmul 794.5 / 989 (the default plateau)
    # at this size (0.748 under the generic 0.75 plateau: 0.02378 s)
    assert extra == pytest.approx(0.02220, rel=1e-3)


def test_cp_in_the_time_model_divides_activations_and_overlaps_the_ring():
    """Llama 3 8B at s = 32768 on 8 GPUs: CP 8 holds 4096 tokens per GPU, so activations per
    GPU shrink ~8x; the ring exchange is charged comm - 0.8 min(comm, attention time)."""
    m = replace(load_model("llama3-8b"), seq_len=32768)
    base = dict(tp=1, pp=1, micro_batch=1, global_batch=1, flash_attention=True, zero=3, recompute=1)
    r1 = evaluate(m, SYS, Strategies.of(**base, dp=1))
    r8 = evaluate(m, SYS, Strategies.of(**base, dp=1, cp=8))
    ratio = float(r1["mem_activations_bytes"] / r8["mem_activations_bytes"])
    assert 7.0 < ratio <= 8.0 + 1e-9  # the fp32 logits of a single stage shrink 8x too
    assert float(r8["ep_cp_s"]) > float(r8["ep_cp_exposed_s"]) > 0
    assert float(r8["ep_cp_exposed_s"]) >= (1 - OV.CP_RING_OVERLAP) * float(r8["ep_cp_s"]) - 1e-15
    uly = evaluate(m, SYS, Strategies.of(**base, dp=1, cp=8, cp_kind=CP.ULYSSES))
    assert float(uly["ep_cp_exposed_s"]) == float(uly["ep_cp_s"])  # Ulysses: not overlapped
    # one ring step inside a DGX H100 (CP 8, TP 1): a send/recv pair of K and V of 4096 tokens,
    # 2 x 4096 x 4096 x 8/32 x 2 = 16,777,216 bytes at the stated 337.5 GB/s + 20 us
    c = comm_times(m, SYS, Strategies.of(**base, dp=1, cp=8))
    assert float(c["cp_ring_step_s"]) == pytest.approx(20e-6 + 16_777_216 / 337.5e9, rel=1e-9)
    # CP 8 over 8 nodes (TP 8): every GPU's send crosses a node boundary -- slower than inside
    c8 = comm_times(m, SYS, Strategies.of(**{**base, "tp": 8, "seq_parallel": True}, dp=1, cp=8))
    assert float(c8["cp_ring_step_s"]) > 20e-6 + 16_777_216 / 8 / 337.5e9


# ---- FP8 --------------------------------------------------------------------------------------
def test_fp8_gemm_time_by_hand():
    """H100 (hardware_accelerator_specs.csv): 989 TFLOP/s BF16, 1979 FP8 dense.  1e15 linear
    FLOPs at FP8 and 1e14 attention FLOPs at BF16, efficiency 0.75:
    1e15 / (1979e12 x 0.75) + 1e14 / (989e12 x 0.75) = 0.673741 + 0.134816 s."""
    t = PR.gemm_time_s(1e15, 1e14, 989e12, 1979e12, 0.75, True)
    assert t == pytest.approx(1e15 / (1979e12 * 0.75) + 1e14 / (989e12 * 0.75), rel=1e-12)
    assert t == pytest.approx(0.808557, rel=1e-5)
    assert PR.gemm_time_s(1e15, 1e14, 989e12, 1979e12, 0.75, False) == pytest.approx(1.1e15 / (989e12 * 0.75))


def test_fp8_gemm_rate_is_the_measured_one_on_hopper():
    """GH100 presets state the measured FP8 / BF16 GEMM rate (1.78: the traced FP8 GEMMs of
    fixtures/traces/h200 and h100b), not the datasheet's 1979 / 989; hardware without a
    measurement (B200) keeps the peak ratio, a stated default.  One Llama 3 8B layer at
    TP 1: the layer's GEMM time is linear / (peak x r) + attention / peak at one efficiency,
    so bf16 - fp8 = linear (1 - 1/r) / (peak eff)."""
    from calib.analytic.modern import gemm_and_casts

    assert [PR.fp8_speedup(load_hardware(h)) for h in ("dgx-h100", "h800", "h200")] == [1.78] * 3
    assert PR.fp8_speedup(load_hardware("b200")) == pytest.approx(4500 / 2250)
    assert PR.fp8_speedup(load_hardware("dgx-a100-80gb")) == 1.0  # no FP8 tensor cores
    # a spec file's rate must be a positive number, and only where the hardware has FP8 units
    for hw, bad in (
        ("dgx-h100", 0.0),
        ("dgx-h100", float("nan")),
        ("dgx-h100", "fast"),
        ("dgx-a100-80gb", 1.5),
    ):
        with pytest.raises(InputError, match="fp8_gemm_speedup needs peak_fp8_tflops, a number > 0"):
            replace(load_hardware(hw), fp8_gemm_speedup=bad)
    st = {
        x: Strategies.of(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, fp8=x, dist_opt=True)
        for x in (0, 1)
    }
    lin, attn = 1e15, 1e14  # FLOPs: f_train = lin + the attention core (3 passes of attn_fwd, no recompute)
    args = (lin + 3 * attn, attn, 0, 989e12, 0.75, 8192, 4096, 14336, 0.25, 3.0, 1)
    bf, f8 = (float(gemm_and_casts(st[x], H100, *args)[0]) for x in (0, 1))
    assert bf - f8 == pytest.approx(lin * (1 - 1 / 1.78) / (989e12 * 0.75), rel=1e-9)


def test_validation_says_which_fp8_rate_its_rows_ran_at():
    """llm-foundry's FP8 section: the measured 1.78 on the H100; run on a B200 instead, the
    datasheet ratio, said to be a stated default."""
    from pathlib import Path

    from calib.analytic.validate import validate
    from calib.analytic.vtable import read_table

    path = Path(__file__).parents[1] / "fixtures" / "published" / "mosaicml_llmfoundry_fsdp_h100_fp8.csv"
    df, _ = read_table(path)
    notes = validate(df, str(path), fit_kind="none").params["notes"]
    assert "FP8 rows on dgx-h100: linear GEMMs at x1.78 their bf16 rate (the preset's measured" in " ".join(
        notes
    )
    b200 = validate(df, str(path), fit_kind="none", base=System(default_calibration(load_hardware("b200")),
                                                                   load_hardware("b200")))  # fmt: skip
    assert any(n.startswith("FP8 rows on b200: linear GEMMs at x2 ") and "stated default" in n
               for n in b200.params["notes"])  # fmt: skip


def test_fp8_rate_agrees_with_the_recorded_matmul_benches():
    """The preset's 1.78 (a trace fit) against the matmul benches recorded with the traces:
    best FP8 over best BF16 TFLOP/s on the same shapes, each within 5 % of it."""
    import json
    from pathlib import Path

    traces = Path(__file__).parents[1] / "fixtures" / "traces"
    ratios = []
    for run in ("h200", "h200b", "h100b"):
        gemm = json.loads((traces / run / "measured_steps.json").read_text())["kernels"]["gemm"]
        ratios.append(max(g["fp8_tflops"] for g in gemm) / max(g["bf16_tflops"] for g in gemm))
    assert ratios == pytest.approx([1.77, 1.80, 1.84], abs=0.005)
    assert all(abs(r / load_hardware("dgx-h100").fp8_gemm_speedup - 1) <= 0.05 for r in ratios)


def test_fp8_casts_memory_and_optimizer_bytes():
    """Casts: 4 bytes per forward input value (read bf16, write two FP8 copies), 3 per gradient
    value.  Llama 3 8B layer, T = 8192 tokens, TP 1: inputs 3 d + ffn = 26,624, gradients
    (1 + 2/4) d + d + 2 ffn + d = 43,008 per token -> 8192 x (4 x 26,624 + 3 x 43,008) bytes.
    Memory: + 1 byte per linear weight (the FP8 copy; the embedding and the untied LM head, 2 x
    128,256 x 4,096 = 1,050,673,152 parameters, stay bf16); master weights bf16 drop 4 bytes
    per parameter."""
    got = PR.cast_bytes_layer(8192, 4096, 14336, 0.25, 3.0, 1)
    assert got == 8192 * (4 * 26_624 + 3 * 43_008)
    m = load_model("llama3-8b")
    base = dict(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, flash_attention=True, recompute=2)
    bf, f8 = (evaluate(m, SYS, Strategies.of(**base, fp8=x)) for x in (False, True))
    params = float(bf["mem_weights_bytes"]) / 2.0
    assert float(f8["mem_weights_bytes"]) == pytest.approx(3.0 * params - 2 * 128_256 * 4096)
    assert float(f8["kernel_transformer_s"]) < float(bf["kernel_transformer_s"])
    bm = evaluate(m, SYS, Strategies.of(**base, master=1))
    assert float(bf["mem_optimizer_bytes"] - bm["mem_optimizer_bytes"]) == pytest.approx(4.0 * params)
    with pytest.raises(InputError, match="peak_fp8"):
        a100 = load_hardware("dgx-a100-80gb")
        check_modern(m, a100, Strategies.of(**base, fp8=True))


# ---- schedules ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schedule", "v", "expected"),
    [
        (ONE_F_ONE_B, 1, 7 * 3.0),  # SC21: (p - 1)(F + B)
        (ONE_F_ONE_B, 2, 7 * 3.0 / 2),  # SC21 interleaved: / v
        (ZB_H1, 1, 7 * (1 + 2 - 2 * 1)),  # Qi et al. / DeepSeek-V3 Table 2: (p - 1)(F + B - 2W)
        (DUALPIPE, 1, 3 * (3 + 2 - 3 * 1)),  # DeepSeek-V3 Table 2: (p/2 - 1)(F&B + B - 3W)
    ],
)
def test_bubble_of_each_schedule_by_hand(schedule, v, expected):
    """p = 8, F = 1, B = 2 (full backward), W = 1 (weight gradient), F&B = F + B = 3."""
    assert float(bubble_s(1.0, 2.0, 1.0, 8, v, schedule)) == pytest.approx(expected)
    total, bubble = pipeline_time_s(3.0, 0.0, 8, 16, v, schedule, 1 / 3, 1 / 3)
    assert float(bubble) == pytest.approx(expected) and float(total) == pytest.approx(16 * 3.0 + expected)


def test_zero_bubble_is_a_third_of_1f1b_and_dualpipe_memory():
    """Qi et al. 2023: with T_F = T_B = T_W ZB-H1's bubble is 1/3 of 1F1B's.  DualPipe holds
    2x parameters and (p + 1)/p of 1F1B's activations (DeepSeek-V3 Table 2)."""
    one = bubble_s(1, 2, 1, 16, 1, ONE_F_ONE_B)
    assert float(bubble_s(1, 2, 1, 16, 1, ZB_H1) / one) == pytest.approx(1 / 3)
    assert param_copies(DUALPIPE) == 2.0 and param_copies(ZB_H1) == 1.0
    assert in_flight_scale(8, DUALPIPE) == pytest.approx(9 / 8)
    m = load_model("llama3-70b")
    base = dict(tp=8, pp=8, dp=1, micro_batch=1, global_batch=32, seq_parallel=True, recompute=2, zero=0)
    r1, rz, rd = (evaluate(m, SYS, Strategies.of(**base, schedule=s)) for s in (0, ZB_H1, DUALPIPE))
    assert float(rz["bubble_s"]) < float(r1["bubble_s"]) and float(rd["bubble_s"]) < float(r1["bubble_s"])
    assert float(rd["mem_weights_bytes"]) == pytest.approx(2 * float(r1["mem_weights_bytes"]))
    with pytest.raises(InputError, match="DualPipe"):
        check_modern(m, H100, Strategies.of(**{**base, "global_batch": 8}, schedule=DUALPIPE))


# ---- overlap and the distributed optimizer ----------------------------------------------------
def test_overlap_is_a_fraction_never_perfect():
    assert OV.exposed(1.0, 10.0, 0.8) == pytest.approx(0.2)  # window longer: (1 - f) comm stays
    assert OV.exposed(1.0, 0.5, 0.8) == pytest.approx(0.6)  # window shorter: comm - f window
    assert all(0 <= f < 1 for f in OV.DEFAULTS.values())


def test_distributed_optimizer_volume_and_overlap():
    """Megatron's distributed optimizer: reduce-scatter of the gradients + all-gather of the
    parameters (each 2(1 - 1/d)P bytes, together the all-reduce's 4(1 - 1/d)P); without
    overlap both are exposed, with --dp-overlap each keeps at least (1 - 0.8) of itself."""
    m = load_model("llama3-8b")
    base = dict(
        tp=1, pp=1, dp=64, micro_batch=1, global_batch=64, zero=1, dist_opt=True, flash_attention=True
    )
    c = comm_times(m, SYS, Strategies.of(**base))
    r = evaluate(m, SYS, Strategies.of(**base), comm=c)
    assert float(r["dp_allreduce_s"]) == 0.0
    assert float(r["dp_reducescatter_exposed_s"]) == pytest.approx(float(c["dp_rs_s"]))
    assert float(r["dp_allgather_exposed_s"]) == pytest.approx(float(c["dp_ag_s"]))
    ro = evaluate(m, SYS, Strategies.of(**base, dp_overlap=True), comm=c)
    assert float(c["dp_rs_s"]) * 0.2 - 1e-15 <= float(ro["dp_reducescatter_exposed_s"]) < float(c["dp_rs_s"])
    tp = dict(base, tp=8, dp=8, seq_parallel=True)
    r0, r1 = (evaluate(m, SYS, Strategies.of(**tp, tp_overlap=x)) for x in (False, True))
    assert (1 - OV.TP_OVERLAP) * float(r0["tp_s"]) - 1e-12 <= float(r1["tp_s"]) < float(r0["tp_s"])


@pytest.mark.parametrize(
    ("preset", "row"),
    [("dgx-h100", "NVIDIA H100 SXM5 80GB"), ("dgx-h200", "NVIDIA H200 SXM 141GB"), ("b200", "NVIDIA B200 SXM"),
     ("mi300x", "AMD MI300X (OAM)")],
)  # fmt: skip
def test_fp8_peaks_equal_the_accelerator_table(preset, row):
    """peak_fp8_tflops of each preset is the table's dense FP8 column (fixtures/published)."""
    import pandas as pd
    from calib.analytic.specs import HARDWARE_FILE

    table = pd.read_csv(
        HARDWARE_FILE.parents[2] / "fixtures" / "published" / "hardware_accelerator_specs.csv"
    )
    value = float(table.set_index("accelerator").loc[row, "peak_dense_fp8_tflops"])
    assert load_hardware(preset).peak_fp8_tflops == value
    assert load_hardware("dgx-a100-80gb").peak_fp8_tflops is None  # A100: no FP8 tensor cores


def test_gb200_nvl72_is_one_nvlink_domain_of_72():
    """NVIDIA's NVL72 figures: 72 GPUs on NVLink 5 (1.8 TB/s per GPU both ways = 900 one way);
    a TP x EP group of 64 stays on the NVLink curve there, but spans 8 nodes of a DGX H100."""
    nvl = load_hardware("gb200-nvl72")
    assert nvl.gpus_per_node == 72 and nvl.scale_up_gbps == 900 and nvl.peak_fp8_tflops == 2 * nvl.peak_tflops
    from calib.analytic.comm import members_per_node

    assert (
        members_per_node(64, 1, nvl.gpus_per_node) == 64 and members_per_node(64, 1, H100.gpus_per_node) == 8
    )


def test_llama3_allgather_cp_by_hand():
    """Llama 3 (arXiv:2407.21783 sec. 3.3.2) all-gathers K and V of the whole sequence before
    the local queries' attention.  405B shape (d 16384, 8 of 128 kv heads), s 131072, TP 8,
    bf16: 2 x 131072 x 16384 x 1/16 / 8 x 2 = 67,108,864 bytes gathered per layer; each of the
    16 CP ranks contributes 1/16.  Charged as an all-gather forward and a reduce-scatter of
    dK, dV backward per layer, not overlapped."""
    assert CP.allgather_kv_bytes(1, 131072, 16384, 1 / 16, 8) == 67_108_864
    m = replace(load_model("llama3-8b"), seq_len=65536)
    base = dict(
        tp=1, pp=1, dp=1, micro_batch=1, global_batch=1, flash_attention=True, cp=8, cp_kind=CP.ALLGATHER_KV
    )
    c = comm_times(m, SYS, Strategies.of(**base))
    # inside one DGX H100 (CP 8, TP 1): 2 x 65536 x 4096 x 8/32 x 2 = 268,435,456 bytes at the
    # nccl-tests all-gather time 20 us + size (n - 1)/n / 337.5 GB/s
    assert float(c["cp_ag_s"]) == pytest.approx(20e-6 + 268_435_456 * 7 / 8 / 337.5e9, rel=1e-9)
    r = evaluate(m, SYS, Strategies.of(**base), comm=c)
    assert float(r["ep_cp_s"]) == float(r["ep_cp_exposed_s"]) > 0
    assert float(r["ep_cp_s"]) == pytest.approx(32 * (float(c["cp_ag_s"]) + float(c["cp_rs_s"])))
