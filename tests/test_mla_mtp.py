"""Multi-head latent attention's low-rank projections and the multi-token-prediction module
(analytic.mla), DeepSeek-V3 as the check.

Sources: deepseek-ai/DeepSeek-V3 config.json (hidden_size 7168, num_attention_heads 128,
q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim
128, num_nextn_predict_layers 1, vocab 129280, 61 layers, first_k_dense_replace 3,
intermediate_size 18432, moe_intermediate_size 2048, 256 routed experts, 8 per token, 1
shared); modeling_deepseek.py's projections (q_a_proj, q_b_proj, kv_a_proj_with_mqa,
kv_b_proj, o_proj); report arXiv:2412.19437 abstract ("671B total parameters with 37B
activated for each token") and sec. 2.2 (the MTP module: one block, a 2d x d projection,
embedding and head shared).

Hand counts (d = 7168):
    MLA per layer   q_a 7168 x 1536 = 11,010,048; q_b 1536 x 128 x 192 = 37,748,736;
                    kv_a 7168 x 576 = 4,128,768; kv_b 512 x 128 x 256 = 16,777,216;
                    o 128 x 128 x 7168 = 117,440,512; sum 187,105,280
    expert          3 x 7168 x 2048 = 44,040,192; router 7168 x 256 = 1,835,008
    dense MLP       3 x 7168 x 18432 = 396,361,728
    embeddings      2 x 129280 x 7168 = 1,853,358,080 (untied; the lookup is half)
    total           61 x 187,105,280 + 3 x 396,361,728 + 58 x (257 x 44,040,192 + 1,835,008)
                    + 1,853,358,080 = 671,025,397,760
    active          the same with 9 experts: 37,551,276,032; without the lookup 36,624,596,992
    MTP depth       block 187,105,280 + 257 x 44,040,192 + 1,835,008 = 11,507,269,632
                    + projection 2 x 7168^2 = 102,760,448: 11,610,030,080
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from calib.analytic import mla as MLA
from calib.analytic import moe as MOE
from calib.analytic.machine import default_calibration
from calib.analytic.specs import ModelSpec, load_hardware, load_model, model_names
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, evaluate

from calib.core.errors import InputError
from tests.conftest import bad

DS = load_model("deepseek-v3")
NO_MLA = replace(DS, q_lora_rank=None, kv_lora_rank=None, qk_rope_head_dim=None, mtp_layers=0)
MLA_LAYER = 11_010_048 + 37_748_736 + 4_128_768 + 16_777_216 + 117_440_512
EXCESS = 4 * 7168**2 - MLA_LAYER  # per layer, what (2 + 2 kv/a) d^2 counted more
MTP_DEPTH = 187_105_280 + 257 * 44_040_192 + 1_835_008 + 2 * 7168**2
H100 = load_hardware("dgx-h100")
SYS = System(default_calibration(H100), H100)


def test_the_preset_carries_config_json_fields():
    assert (DS.q_lora_rank, DS.kv_lora_rank, DS.qk_rope_head_dim, DS.mtp_layers) == (1536, 512, 64, 1)
    assert (DS.qk_head_dim, DS.v_head_dim) == (128 + 64, 128)


def test_mla_projection_weights_per_layer_by_hand():
    assert MLA_LAYER == 187_105_280 and 4 * 7168**2 == 205_520_896
    assert float(MLA.attention_proj_params(DS)) == 187_105_280
    # full-rank queries: d x a h_qk in place of q_a + q_b
    full_q = replace(DS, q_lora_rank=0)
    assert (
        float(MLA.attention_proj_params(full_q)) == 187_105_280 - 11_010_048 - 37_748_736 + 7168 * 128 * 192
    )


def test_main_model_totals_match_the_report_mtp_excluded():
    total, active = MOE.total_and_active_params(DS)
    assert total == 61 * 187_105_280 + 3 * 396_361_728 + 58 * (257 * 44_040_192 + 1_835_008) + 1_853_358_080
    assert total == 671_025_397_760 and abs(total / 671.0e9 - 1) < 0.002
    lookup = DS.vocab * DS.d_model
    assert active == 37_551_276_032 and active - lookup == 36_624_596_992
    assert abs((active - lookup) / 36.6e9 - 1) < 0.002 and abs((active - lookup) / 37e9 - 1) < 0.02
    # before MLA's projections the preset counted 61 x 18,415,616 more (672.1 B / 38.7 B)
    t0, a0 = MOE.total_and_active_params(NO_MLA)
    assert (t0 - total, a0 - active) == (61 * EXCESS, 61 * EXCESS) and t0 == 672_148_750_336


def test_mtp_module_adds_one_block_and_its_projection():
    assert MTP_DEPTH == 11_610_030_080
    tot, act = MLA.mtp_params(DS)
    assert tot == MTP_DEPTH and act == 187_105_280 + 9 * 44_040_192 + 1_835_008 + 2 * 7168**2
    main, _ = MOE.total_and_active_params(DS)
    assert round((main + tot) / 1e9, 2) == 671.03 + 11.61
    two = replace(DS, mtp_layers=2)
    assert MLA.mtp_params(two)[0] == 2 * MTP_DEPTH and MLA.mtp_params(NO_MLA) == (0.0, 0.0)


def test_flops_per_token_change_by_the_hand_worked_amount():
    """Forward FLOPs per token: 2 x active weights + 4 s d per layer (analytic.moe); MLA takes
    2 x 61 x 18,415,616 off.  The MTP depth adds 2 x (block active + 2 d^2) + 4 s d + 2 d V,
    and the time model's model FLOPs are 3 B s x (main + MTP) per iteration."""
    assert MOE.forward_flops_per_token(NO_MLA) - MOE.forward_flops_per_token(DS) == 2 * 61 * EXCESS
    act = 187_105_280 + 9 * 44_040_192 + 1_835_008 + 2 * 7168**2
    mtp = 2 * act + 4 * 4096 * 7168 + 2 * 7168 * 129280
    assert MLA.mtp_forward_flops_per_token(DS) == mtp == 1_376_124_928 + 117_440_512 + 1_853_358_080
    st = Strategies.of(tp=1, pp=16, dp=128, ep=64, micro_batch=1, global_batch=15360, zero=1, recompute=2)
    r = evaluate(DS, SYS, st)
    model_flops = float(r["model_tflops_per_gpu"]) * 1e12 * float(r["iter_s"]) * 2048
    want = 3 * 15360 * 4096 * (MOE.forward_flops_per_token(DS) + mtp)
    assert model_flops == pytest.approx(want, rel=1e-9)


def test_mtp_head_pass_rides_with_the_head_and_its_weights_are_charged():
    """with_mtp: head + n head (1 + 2d/V) (the MTP block itself is a layer of the partition);
    stage weights: MTP attention, projection, shared expert and router over TP, its routed
    experts over EP (t 1, ep 64: 4 experts)."""
    (got,) = MLA.with_mtp(DS, 7168.0, 129280.0, (np.array(1.0),))
    assert float(got) == 1.0 + 1.0 * (1.0 + 2 * 7168 / 129280)
    dense, routed = MLA.mtp_stage_params(DS, 7168.0, 1.0, 64.0, 3.0)
    assert float(dense) == 187_105_280 + 2 * 7168**2 + 44_040_192 + 1_835_008
    assert float(routed) == 4 * 44_040_192
    st = Strategies.of(tp=1, pp=16, dp=128, ep=64, micro_batch=1, global_batch=15360, zero=1, recompute=2)
    with_mtp, without = evaluate(DS, SYS, st), evaluate(replace(DS, mtp_layers=0), SYS, st)
    assert float(with_mtp["iter_s"]) > float(without["iter_s"])
    assert float(with_mtp["mem_weights_bytes"] - without["mem_weights_bytes"]) == 2.0 * (
        float(dense) + float(routed)
    )


# values computed on main (4e114b8, before this change) with tests/../analytic at that commit
MAIN_PARAMS = {
    "gpt3-175b": (174563733504.0, 174563733504.0),
    "llama3-70b": (70552387584.0, 70552387584.0),
    "llama3-405b": (405849243648.0, 405849243648.0),
    "mixtral-8x7b": (46702526464.0, 12879659008.0),
    "mixtral-8x22b": (140619939840.0, 39151337472.0),
    "megatron-1t": (1007943680000.0, 1007943680000.0),
}
MAIN_ITER = {  # evaluate(...) on dgx-h100 default calibration: iter_s, mem_total_bytes, model TFLOP/s
    "gpt3-175b": (dict(tp=8, pp=8, dp=16, micro_batch=1, global_batch=1536, recompute=1, seq_parallel=True),
                  (9.113618135914553, 57043481600.0, 362.82178257666976)),
    "llama3-70b": (dict(tp=8, pp=4, dp=8, micro_batch=1, global_batch=512, zero=1, recompute=2),
                   (38.0634041989074, 27096902656.0, 207.2286455769688)),
    "mixtral-8x7b": (dict(tp=1, pp=1, dp=64, micro_batch=1, global_batch=256, ep=8, zero=1, recompute=2),
                     (101.37833132616899, 123544499200.0, 165.53139117017022)),
}  # fmt: skip


def test_models_without_mla_fields_are_unchanged():
    for name, want in MAIN_PARAMS.items():
        assert MOE.total_and_active_params(load_model(name)) == want
    for name in model_names():
        m = load_model(name)
        if name == "deepseek-v3":
            continue
        assert not MLA.uses_mla(m) and MLA.depths(m) == 0
        kv = m.kv_head_count / m.n_heads
        assert float(MLA.attention_proj_params(m)) == (2.0 + 2.0 * kv) * m.d_model * m.d_model
    for name, (kw, want) in MAIN_ITER.items():
        r = evaluate(load_model(name), SYS, Strategies.of(**kw))
        got = tuple(
            float(np.asarray(r[k]).ravel()[0]) for k in ("iter_s", "mem_total_bytes", "model_tflops_per_gpu")
        )
        assert got == want


@pytest.mark.parametrize(
    ("over", "text"),
    [
        ({"q_lora_rank": -1}, "q_lora_rank must be a non-negative integer"),
        ({"kv_lora_rank": "512"}, "kv_lora_rank must be a non-negative integer"),
        ({"mtp_layers": 1.5}, "mtp_layers must be a non-negative integer"),
        ({"kv_lora_rank": 0}, "qk_rope_head_dim 64 needs kv_lora_rank"),
        ({"qk_rope_head_dim": 192}, "qk_rope_head_dim 192 must be below the query/key head width 192"),
    ],
)
def test_bad_spec_values_are_one_line_errors(over, text):
    with pytest.raises(InputError) as exc:
        replace(DS, **over)
    assert text in str(exc.value) and "\n" not in str(exc.value)


def test_bad_cli_values_exit_2_with_one_line():
    base = (
        "predict",
        "--hardware",
        "h800",
        "--model",
        "deepseek-v3",
        "--gpus",
        "2048",
        "--pp",
        "16",
        "--ep",
        "64",
    )
    assert "expected an integer" in str(bad(*base, "--q-lora-rank", "abc"))
    assert "must be >= 0" in str(bad(*base, "--mtp-layers", "-1"))
    err = bad(*base, "--kv-lora-rank", "0")
    assert err.where == "deepseek-v3" and err.problem.startswith("qk_rope_head_dim 64 needs kv_lora_rank")
    proc = subprocess.run([sys.executable, "-m", "calib.cli", *base, "--qk-rope-dim", "-3"],
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--qk-rope-dim" in proc.stderr


def test_a_table_row_takes_the_columns(tmp_path):
    from calib.analytic.vshape import row_models
    from calib.analytic.vtable import read_table

    head = "label,hardware,model,gpus,tp,pp,dp,micro_batch,global_batch,measured_iter_s"
    (tmp_path / "t.csv").write_text(
        f"{head},kv_lora_rank,mtp_layers\nr1,dgx-h100,deepseek-v3,1024,1,16,64,1,1024,10,,0\n"
        "r2,dgx-h100,llama3-8b,8,1,1,8,1,8,1,256,\n"
    )
    df, _ = read_table(tmp_path / "t.csv")
    groups = {tuple(i): m for i, m in row_models(df)}
    ds, llama = groups[(0,)], groups[(1,)]
    assert isinstance(ds, ModelSpec) and ds.kv_lora_rank == 512 and ds.mtp_layers == 0  # blank: preset
    assert (
        isinstance(llama, ModelSpec)
        and llama.kv_lora_rank == 256
        and float(MLA.attention_proj_params(llama)) > 0
    )
    (tmp_path / "b.csv").write_text(
        f"{head},q_lora_rank\nr1,dgx-h100,deepseek-v3,1024,1,16,64,1,1024,10,-5\n"
    )
    with pytest.raises(InputError) as exc:
        read_table(tmp_path / "b.csv")
    assert "q_lora_rank" in str(exc.value) and "\n" not in str(exc.value)


def test_mtp_blocks_are_layers_of_the_pipeline_partition():
    """61 layers + 1 MTP block over 16 stages split like 62 layers (analytic.uneven: 14 stages
    of 4, the last of 3): the largest stage keeps 4 layers, so against a 62-layer model without
    MTP the pipeline differs only by the head's second pass and MTP's extra FLOPs, never by a
    fifth layer on the last stage."""
    from calib.analytic import uneven as U

    assert U.stage_layers(61 + MLA.depths(DS), 16) == (4.0, 3.0)
    st = Strategies.of(tp=1, pp=16, dp=128, ep=64, micro_batch=1, global_batch=15360, zero=1, recompute=2)
    r = {n: evaluate(replace(DS, mtp_layers=n), SYS, st) for n in (0, 1)}
    m = 15360 / 128
    extra_s = float(r[1]["iter_s"] - r[0]["iter_s"])
    # the block on top of the last stage's own layers (the placement in mla's docstring that
    # was not taken) adds half the iteration here; as a layer of the partition it adds the
    # head's second pass and the MTP FLOPs: under a quarter
    assert 0.0 < extra_s < float(r[0]["iter_s"]) / 4.0
    assert m == 120.0


def test_dualpipe_pairs_the_last_stage_with_the_first():
    """DualPipe holds stages i and p - 1 - i on GPU i (deepseek-ai/DualPipe
    examples/example_dualpipe.py: ``nn.Sequential(full_modules[rank], full_modules[pp_size - 1
    - rank])``), each direction half of the micro-batches: the last stage's excess is halved."""
    from calib.analytic import uneven as U
    from calib.analytic.bubble import DUALPIPE, ONE_F_ONE_B

    assert U.head_excess_s(3.0, 2.0, 4, 3, ONE_F_ONE_B) == pytest.approx(1.0)
    assert U.head_excess_s(3.0, 2.0, 4, 3, DUALPIPE) == pytest.approx(0.5)
    assert U.head_excess_s(1.5, 2.0, 4, 3, DUALPIPE) == pytest.approx(0.0)


def test_mtp_activations_count_where_their_stage_sets_the_peak():
    """One stage, or DualPipe (GPU 0 holds the first and the last stage): one layer's kept
    activations + one head's logits per depth; 1F1B with PP: the last stage never sets the
    peak, nothing added."""
    from calib.analytic.bubble import DUALPIPE, ONE_F_ONE_B

    assert float(MLA.mtp_activation_bytes(DS, 1, 3.0, 2.0)) == 5.0
    assert float(MLA.mtp_activation_bytes(DS, 16, 3.0, 2.0, DUALPIPE)) == 5.0
    assert float(MLA.mtp_activation_bytes(DS, 16, 3.0, 2.0, ONE_F_ONE_B)) == 0.0
    assert float(MLA.mtp_activation_bytes(replace(DS, mtp_layers=0), 1, 3.0, 2.0)) == 0.0
