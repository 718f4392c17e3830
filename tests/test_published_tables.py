"""Published large runs added for issue 14 item 6, and the shipped tables, under one split.

(a) Round trip: every measured value read from the CSVs equals the figure transcribed
    below from the source text (the constants are typed from the quoted text, independently
    of the CSV), and each row's ``quote`` column carries the same numbers.
(b) Regression bounds: ``--calibrate-on every-third`` (rows 1, 4, 7, ... by position,
    chosen before any error was seen; never changed afterwards) gives a held-out median
    |error| below a bound equal to the value observed when the tables were added, rounded
    up to the next 5 %.  These bounds are *regression* bounds, not accuracy targets: e.g.
    SC21 Table 2 (ZeRO-3 rows) is 35.6 % and bounded at 40 % (35.8 % before ZeRO-3's
    per-module collectives).  docs/analytic.md reports
    every value and what the model cannot express for each run.

Sources (full citations and quoted lines in fixtures/published/SOURCE.txt and the CSVs'
``source``/``quote`` columns): BLOOM-176B bigscience-workshop/bigscience tr11-176B-ml
chronicles-prequel.md "Rebalancing layers" + README.md production log line; MT-NLG 530B
arXiv:2201.11990 Sec. 2.4 as quoted by cli99/llm-analysis; Narayanan et al. SC21
(arXiv:2104.04473) Table 2 via two agreeing transcriptions; Llama 3 405B Table 4
(arXiv:2407.21783 p.10) from the paper's PDF text (row 3's DP from three transcriptions that
agree with its GPU and token counts; SOURCE.txt says why).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
from calib.analytic.specs import load_hardware
from calib.analytic.validate import validate
from calib.analytic.vtable import read_table

PUB = Path(__file__).parents[1] / "fixtures" / "published"
BLOOM = PUB / "bloom176b_bigscience_jean_zay_iteration_times.csv"
MTNLG = PUB / "mtnlg530b_smith2022_iteration_times.csv"
SC21T2 = PUB / "megatron_sc21_table2_ptdp_vs_zero3.csv"
H100 = PUB / "mosaicml_llmfoundry_fsdp_h100_bf16.csv"
H100_FP8 = PUB / "mosaicml_llmfoundry_fsdp_h100_fp8.csv"
TORCHTITAN = PUB / "torchtitan_fsdp2_a100_llama.csv"
LLAMA3 = PUB / "llama3_405b_table4_scaling.csv"
DSV3 = PUB / "deepseek_v3_h800_pretraining.csv"

# chronicles-prequel.md "Rebalancing layers" (02-28): (hidden, layers, DP, TP, PP, MBS, NHEADS) -> (Sec/it, TFLOPs)
BLOOM_SOURCE = {
    (12288, 106, 8, 4, 12, 2, 64): (116.54, 149.75), (12288, 106, 8, 4, 12, 2, 96): (118.79, 146.90),
    (12288, 106, 8, 4, 12, 2, 128): (121.42, 143.73), (12288, 106, 8, 4, 12, 4, 96): (120.34, 145.01),
    (12288, 100, 8, 8, 6, 2, 64): (139.72, 117.91), (12288, 100, 8, 8, 6, 4, 64): (120.96, 136.20),
    (13312, 82, 4, 8, 12, 4, 64): (111.79, 141.76), (13312, 82, 8, 4, 12, 2, 64): (104.45, 151.71),
    (13312, 82, 8, 4, 12, 2, 104): (123.71, 128.10), (13312, 82, 8, 4, 12, 2, 128): (108.78, 145.68),
    (13312, 82, 8, 4, 12, 4, 64): (104.82, 151.18), (13312, 94, 8, 4, 12, 2, 128): (124.10, 146.12),
    (14336, 70, 4, 8, 12, 2, 64): (121.63, 128.92), (14336, 70, 8, 4, 12, 2, 64): (102.03, 153.68),
    (14336, 70, 8, 4, 12, 2, 112): (104.50, 150.05), (14336, 70, 8, 4, 12, 2, 128): (105.89, 148.08),
    (14336, 70, 8, 4, 12, 4, 64): (102.27, 153.33),
    # README.md "Important checkpoints": iteration 85376, the production layout (TP=4 PP=12 DP=8 MBS=2)
    (14336, 70, 8, 4, 12, 2, 112, "production"): (104.70, 149.77),
}  # fmt: skip
# Section 2.4 as quoted: GPUs (280/350/420 DGX A100 x 8) -> (latency per iteration s, TFLOP/s per GPU)
MTNLG_SOURCE = {2240: (60.1, 126), 2800: (50.2, 121), 3360: (44.4, 113)}
# Table 2: (scheme, params B, GPUs) -> (batch, microbatch, TFLOP/s per GPU)
SC21T2_SOURCE = {
    ("zero-3", 175, 384): (1536, 4, 144), ("zero-3", 175, 768): (1536, 2, 88), ("zero-3", 175, 1536): (1536, 1, 44),
    ("zero-3", 530, 640): (2560, 4, 138), ("zero-3", 530, 1120): (2240, 2, 98), ("zero-3", 530, 2240): (2240, 1, 48),
    ("ptd-p", 175, 384): (1536, 1, 153), ("ptd-p", 175, 768): (1536, 1, 149), ("ptd-p", 175, 1536): (1536, 1, 141),
    ("ptd-p", 530, 560): (2240, 1, 171), ("ptd-p", 530, 1120): (2240, 1, 167), ("ptd-p", 530, 2240): (2240, 1, 159),
}  # fmt: skip


def _cells(quote: str) -> list[str]:
    return [c.strip() for c in quote.split("|")[1:-1]]


def test_bloom_values_round_trip_from_the_source():
    df, fmt = read_table(BLOOM)
    assert fmt == "canonical" and len(df) == len(BLOOM_SOURCE) == 18
    got = {}
    for r in df.itertuples():
        key = (r.d_model, r.n_layers, r.dp, r.tp, r.pp, r.micro_batch, r.n_heads)
        key += ("production",) if r.group == "production" else ()
        got[key] = (r.measured_iter_s, r.source_tflops_per_gpu)
        if r.group == "production":
            assert "104.70" in r.quote and "149.77" in r.quote and "85376" in r.quote
            continue
        nodes, _, dp, tp, pp, mbs, heads, gbs, _, sec, tflops, note = _cells(r.quote)
        assert (int(nodes) * 8, int(dp), int(tp), int(pp), int(mbs), int(heads), int(gbs), note) == (
            r.gpus,
            r.dp,
            r.tp,
            r.pp,
            r.micro_batch,
            r.n_heads,
            r.global_batch,
            "02-28",
        )
        assert (float(sec), float(tflops)) == (r.measured_iter_s, r.source_tflops_per_gpu)
    assert got == BLOOM_SOURCE
    assert set(df["hardware"]) == {"jean-zay-a100-80gb"} and set(df["vocab"]) == {250880}
    assert (df["gpus"] == df["dp"] * df["tp"] * df["pp"]).all()  # 48 nodes x 8 = 384 in every row


def test_mtnlg_values_round_trip_from_the_source():
    df, _ = read_table(MTNLG)
    got = {r.gpus: (r.measured_iter_s, r.source_tflops_per_gpu) for r in df.itertuples()}
    assert got == MTNLG_SOURCE
    quoted = re.findall(r"`([\d.]+)`", df["quote"].iloc[0])  # 1920, 280, 350, 420, 60.1, ..., 113
    assert quoted == ["1920", "280", "350", "420", "60.1", "50.2", "44.4", "126", "121", "113"]
    assert set(df["global_batch"]) == {1920} and (df["gpus"] == df["dp"] * 280).all()


def test_sc21_table2_values_round_trip_from_the_source():
    df, _ = read_table(SC21T2)
    got = {}
    for r in df.itertuples():
        size = 175 if r.d_model == 12288 else 530
        got[(r.group, size, r.gpus)] = (r.global_batch, r.micro_batch, r.measured_tflops_per_gpu)
        scheme, params, mp, batch, gpus, micro, tflops, _days = _cells(r.quote.split(" (file")[0])
        assert (scheme.lower(), int(batch.rstrip("*")), int(gpus), int(micro), float(tflops)) == (
            r.group,
            r.global_batch,
            r.gpus,
            r.micro_batch,
            r.measured_tflops_per_gpu,
        )
        assert int(mp) == r.tp * r.pp  # model-parallel size 1 (ZeRO-3), 96 = 8 x 12, 280 = 8 x 35
    assert got == SC21T2_SOURCE


# Dubey et al. 2024 (arXiv:2407.21783) Table 4, typed from the quoted PDF text:
# (GPUs, TP, CP, PP, seq) -> (DP as printed, batch size / DP, TFLOP/s per GPU, BF16 MFU %)
LLAMA3_SOURCE = {
    (8192, 8, 1, 16, 8192): (64, 32, 430, 43), (16384, 8, 1, 16, 8192): (128, 16, 400, 41),
    (16384, 8, 16, 16, 131072): (4, 16, 380, 38),
}  # fmt: skip


def test_llama3_table4_values_round_trip_from_the_source():
    df, fmt = read_table(LLAMA3)
    assert fmt == "canonical" and len(df) == 3 and set(df["model"]) == {"llama3-405b"}
    for r in df.itertuples():
        dp_printed, per_dp, tflops, mfu = LLAMA3_SOURCE[(r.gpus, r.tp, r.cp, r.pp, r.seq_len)]
        cells = r.quote.split(" (")[0].replace(",", "").split()
        assert [int(c) for c in cells[:7]] == [r.gpus, r.tp, r.cp, r.pp, dp_printed, r.seq_len, per_dp]
        assert (cells[7], float(cells[8]), cells[9]) == ("16M", r.measured_tflops_per_gpu, f"{mfu}%")
        assert r.measured_tflops_per_gpu == tflops and r.source_bf16_mfu_pct == mfu
        # row 3 prints DP 4; DP 8 is the value that makes TP x CP x PP x DP = GPUs and 16M tokens
        assert r.gpus == r.tp * r.cp * r.pp * r.dp and r.global_batch == r.dp * per_dp
        assert 16e6 < r.global_batch * r.seq_len < 17e6  # "16M" tokens per batch


def test_deepseek_v3_point_is_the_quoted_gpu_hours_per_trillion_tokens():
    df, fmt = read_table(DSV3)
    r = df.iloc[0]
    assert fmt == "canonical" and len(df) == 1 and r["model"] == "deepseek-v3"
    assert "180K H800 GPU hours" in r["quote"] and "2048 H800 GPUs" in r["quote"]
    assert "16-way Pipeline Parallelism (PP), 64-way Expert Parallelism (EP)" in r["quote"]
    assert r["source_h800_gpu_hours_per_1e12_tokens"] == 180_000
    assert r["measured_tokens_per_s_per_gpu"] == pytest.approx(1e12 / (180_000 * 3600), abs=0.005)
    assert (r["gpus"], r["pp"], r["ep"], r["tp"], r["dp"]) == (2048, 16, 64, 1, 128)
    assert (r["schedule"], r["precision"], r["zero"]) == ("dualpipe", "fp8", 1)


def test_h800_preset_is_the_h100_with_its_nvlink_cut():
    h800, h100 = load_hardware("h800"), load_hardware("dgx-h100")
    assert h800.scale_up_gbps == 400 / 2 and h100.scale_up_gbps == 450  # 400 GB/s bidirectional
    assert h800.node_nic_gbps == 8 * 50  # DeepSeek-V3 sec. 3.2.2: "IB (50 GB/s)" per GPU
    same = ("peak_tflops", "peak_fp8_tflops", "mamf_tflops", "hbm_gb", "hbm_tbps", "gpus_per_node")
    assert [getattr(h800, f) for f in same] == [getattr(h100, f) for f in same]


def test_deepseek_v3_uncalibrated_error_stays_under_its_regression_bound():
    # one row: nothing to calibrate on (decided before running); observed -9.09 % once the h800
    # preset carries the H100's measured achievable matmul as it carries its peaks (stop 21),
    # -13.76 % with MLA's projections' FP8 casts (-13.05 % with fused-QKV full-head casts); -13.05 % with MLA's
    # low-rank projections and the MTP module (analytic.mla: its block a layer of the pipeline
    # partition, its head pass with the LM head; DualPipe pairs the last stage with the first,
    # analytic.uneven); -1.25 % without MTP; -22.79 % without the DualPipe pairing; -34.17 %
    # with the block on top of the last stage's layers (each seen before the rule was chosen,
    # docs/analytic.md); -3.13 % with MLA's attention widths only (+12.09 % before them,
    # +13.16 % before flash's recomputing backward, +13.65 % before the busiest-EP-rank load
    # factor); bound 15 %, the observed value rounded up to 5 %
    df, _ = read_table(DSV3)
    v = validate(df, str(DSV3), fit_kind="none")
    assert v.summary["n_heldout"] == 1 and not v.rows["oom"].any()
    assert v.summary["median_abs_pct"] < 15.0
    assert df["qk_head_dim"].tolist() == [192] and df["v_head_dim"].tolist() == [128]  # from the preset
    assert df[["q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "mtp_layers"]].values.tolist() == [
        [1536, 512, 64, 1]
    ]


# llm-foundry README "H100 80GB BF16" (typed from the README text, a sample across the table):
# (Model, SeqLen, # GPUs) -> (MicroBatchSize, GlobalBatchSize, Throughput T/s, Throughput T/s/GPU)
H100_SOURCE = {
    ("70b", 2048, 64): (8, 2048, 66523, 1039), ("30b", 8192, 8): (1, 168, 11072, 1384),
    ("13b", 2048, 64): (2, 128, 307209, 4800), ("7b", 65536, 8): (1, 16, 15654, 1956),
    ("3b", 512, 8): (40, 1920, 223721, 27965), ("1b", 2048, 64): (20, 1280, 2841754, 44402),
    ("760m", 512, 8): (96, 1536, 669998, 83749),
}  # fmt: skip


def test_mosaic_h100_bf16_values_round_trip_from_the_source():
    raw = pd.read_csv(H100)
    assert len(raw) == 52 and set(raw["Precision"]) == {"amp_bf16"} and set(raw["GPU"]) == {"h100_80gb"}
    key = list(zip(raw["Model"], raw["SeqLen (T)"], raw["# GPUs"], strict=True))
    got = dict(zip(key, raw[["MicroBatchSize", "GlobalBatchSize", "Throughput (T/s)", "Throughput (T/s/GPU)"]]
                   .itertuples(index=False, name=None), strict=True))  # fmt: skip
    assert {k: got[k] for k in H100_SOURCE} == H100_SOURCE
    # every row: the per-GPU column is the total over the GPUs (the README truncates to an integer)
    per_gpu = raw["Throughput (T/s)"] / raw["# GPUs"]
    assert ((per_gpu - raw["Throughput (T/s/GPU)"]).abs() < 1).all()
    df, fmt = read_table(H100)
    assert fmt == "mosaicml" and set(df["hardware"]) == {"dgx-h100"} and set(df["zero"]) == {3}
    assert df["measured_tokens_per_s_per_gpu"].tolist() == raw["Throughput (T/s/GPU)"].tolist()


def test_mosaic_h100_fp8_values_round_trip_from_the_source():
    # "|  3b | 2048 | 8 | h100_80gb | 27.7 | 27.7 |  5.482421E+14 | 10 | 6 | 480 | 119 | 244692 | 30586 |
    #  983040 | amp_fp8 | DEFAULT | FULL_SHARD | False | False | 2651837440 |" (README, section H100 80GB FP8)
    raw = pd.read_csv(H100_FP8)
    assert len(raw) == 10 and set(raw["Precision"]) == {"amp_fp8"}
    row = raw[(raw["Model"] == "3b") & (raw["SeqLen (T)"] == 2048)].iloc[0]
    assert (row["MicroBatchSize"], row["GlobalBatchSize"], row["Throughput (T/s)"], row["Throughput (T/s/GPU)"]) == (
        10, 480, 244692, 30586)  # fmt: skip
    per_gpu = raw["Throughput (T/s)"] / raw["# GPUs"]
    assert ((per_gpu - raw["Throughput (T/s/GPU)"]).abs() < 1).all()
    df, fmt = read_table(H100_FP8)
    assert fmt == "mosaicml" and set(df["precision"]) == {"fp8"} and set(df["hardware"]) == {"dgx-h100"}


def test_torchtitan_values_round_trip_from_the_source():
    # "| 70B | 2 | full | 353 | 50.5% |" (docs/performance.md, Llama 2 table); WPS per GPU
    df, fmt = read_table(TORCHTITAN)
    assert fmt == "canonical" and len(df) == 6 and set(df["zero_impl"]) == {"fsdp"}
    got = dict(zip(df["label"], df["measured_tokens_per_s_per_gpu"], strict=True))
    assert got == {"tt-llama3-8b-b1-selop": 2973, "tt-llama3-70b-b1-full": 331, "tt-llama2-13b-b2-none": 2162,
                   "tt-llama2-13b-b2-selop": 1904, "tt-llama2-70b-b1-selop": 355, "tt-llama2-70b-b2-full": 353}  # fmt: skip
    assert (df["global_batch"] == 64 * df["micro_batch"]).all() and set(df["gpus"]) == {64}


def test_jean_zay_preset_is_four_100g_links_per_node():
    hw = load_hardware("jean-zay")
    assert hw.node_nic_gbps == 4 * 100 / 8  # "4 OmniPath links", 100 Gb/s each -> GB/s per node
    assert (hw.gpus_per_node, hw.hbm_gb, hw.peak_tflops) == (8, 80, 312)


# (table, held-out rows, observed median |err| % when added, bound = observed rounded up to 5 %)
# Stop 21: the element-wise traffic factor is kept only where identified, as the attention
# ratio and the network scale are (analytic.vfit): BLOOM 1.60 -> 2.09, SC21 Table 2 10.17 ->
# 9.25, Korthikanti 1.67 -> 3.90, Megatron 2020 2.98 -> 4.81, FP8 8.77 -> 6.18, torchtitan
# 2.44 -> 6.28 (the observed values below are these).
EVERY_THIRD = [
    (BLOOM, 12, 2.09, 5.0),
    (MTNLG, 2, 2.50, 5.0),
    (SC21T2, 8, 9.25, 10.0),  # 34.47 with the compute fit; 10.17 with the network fit (stop 20)
    (PUB / "megatron_sc21_table1_weak_scaling.csv", 6, 3.05, 5.0),
    (PUB / "korthikanti2022_table5_iteration_times.csv", 5, 3.90, 5.0),
    (PUB / "megatron_readme_2020_tp_dp_scaling_iteration_times.csv", 8, 4.81, 5.0),
    # A flash backward's recomputed scores (analytic.context.FLASH_BWD_OVER_FWD) moved the
    # flash-attention tables: A100 9.06 -> 7.30, H100 BF16 12.97 -> 10.68, FP8 12.92 -> 8.77,
    # torchtitan 6.94 -> 6.13, Llama 3 7.17 -> 3.51; then the attention efficiency ratio, fitted
    # where the calibration rows identify it (analytic.vfit), the three llm-foundry tables:
    (PUB / "mosaicml_llmfoundry_fsdp_a100.csv", 92, 3.65, 5.0),
    (H100, 34, 4.16, 5.0),
    (H100_FP8, 6, 6.18, 10.0),  # 4 calibration rows: the attention ratio is not identified (Student's t)
    # added at stop 17 (split every-third, decided before running); 6.13 before its "selective
    # op" rows ran as torchtitan's op-level SAC (recompute op) instead of the attention core
    (TORCHTITAN, 4, 6.28, 10.0),
    # calibrate on row 1 (decided before running, fixtures/published/SOURCE.txt); 3.51 until stop 25
    # ran the rows as ZeRO-1 + distributed optimizer, then as the ZeRO-2 the paper states: the
    # one-row fit moves y_max 0.62 -> 0.68 and the 128k row goes +6.6 -> +14.0 % (--fit none on
    # all three rows: 2.57 -> 2.49 %, and the 8,192-GPU row no longer predicted out of memory)
    (LLAMA3, 2, 7.35, 10.0),
]


@pytest.mark.parametrize(
    ("path", "held", "observed", "bound"), EVERY_THIRD, ids=lambda v: getattr(v, "stem", None)
)
def test_every_third_held_out_median_stays_under_its_regression_bound(path, held, observed, bound):
    df, _ = read_table(path)
    v = validate(df, str(path), calibrate_on="every-third")
    assert int((v.rows["role"] == "held-out").sum()) == held
    assert v.summary["median_abs_pct"] < bound
    assert observed < bound <= observed + 5.0  # the bound is the reported value rounded up to 5 %


def test_a_bf16_calibration_predicts_the_fp8_section(tmp_path):
    """Calibrate on the BF16 section only (every third row, as above), save it, and predict the
    whole FP8 section of the same README with it, no FP8 row fitted: FP8 GEMMs at the fitted
    fraction of the FP8 peak, casts as memory passes, attention in bf16 (analytic.precision).
    Observed 5.94 % median / 13.06 % max, every row but one predicted too fast; bound 10 %
    (the observed value rounded up to 5 %)."""
    import json

    from tests.conftest import run

    store = str(tmp_path / "store")
    run(
        "validate", str(H100), "--calibrate-on", "every-third", "--store", store, "--save-calibration", "bf16"
    )
    out = run(
        "validate", str(H100_FP8), "--calibration", "bf16", "--store", store, "--fit", "none", "--json"
    ).output
    s = json.loads(out)["summary"]
    assert s["n_heldout"] == 10 and s["median_abs_pct"] < 10.0
    # the saved BF16 fit's 90 % interval (analytic.fit_interval) holds 10 of the 10 FP8 rows
    assert s["n_with_interval"] == 10 and s["n_inside_interval"] >= 8
    # without the BF16 calibration (stated defaults) the same rows are far off
    df, _ = read_table(H100_FP8)
    assert validate(df, str(H100_FP8), fit_kind="none").summary["median_abs_pct"] > 30.0
