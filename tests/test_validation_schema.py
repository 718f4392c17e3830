"""The validation table's model-shape and stack columns (analytic.vshape), and uneven
interleaved pipeline stages (analytic.uneven, Llama 3 arXiv:2407.21783 sec. 3.3.2).

The table path must give exactly what the time model gives for the same ModelSpec and
Strategies (the predict path); unknown values are one-line errors naming the value.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from calib.analytic import uneven as U
from calib.analytic.bubble import pipeline_time_s
from calib.analytic.machine import default_calibration
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies, check_config
from calib.analytic.timemodel import System, evaluate
from calib.analytic.validate import Table, validate
from calib.analytic.vtable import normalise

from calib.core.errors import InputError

ROW = {"label": "r", "hardware": "dgx-h100", "gpus": 64, "tp": 8, "pp": 2, "micro_batch": 1,
       "global_batch": 64, "recompute": "selective", "seq_parallel": True, "flash_attention": True,
       "measured_iter_s": 10.0}  # fmt: skip


def table(*rows: dict) -> pd.DataFrame:
    return normalise(pd.DataFrame([{**ROW, **r} for r in rows]), "t.csv")


def predicted_iter_s(df: pd.DataFrame) -> np.ndarray:
    hw = load_hardware("dgx-h100")
    return Table.of(df).iter_s({"dgx-h100": System(default_calibration(hw), hw)})[0]


def direct_iter_s(model_name: str, **st) -> float:
    hw = load_hardware("dgx-h100")
    kw = dict(tp=8, pp=2, dp=4, micro_batch=1, global_batch=64, recompute=1, seq_parallel=True,
              flash_attention=True)  # fmt: skip
    r = evaluate(load_model(model_name), System(default_calibration(hw), hw), Strategies.of(**{**kw, **st}))
    return float(np.asarray(r["iter_s"]).ravel()[0])


def test_model_preset_column_fills_the_shape_and_matches_the_predict_path():
    df = table({"model": "llama3-70b"}, {"model": "llama3-70b", "seq_len": 4096})
    spec = load_model("llama3-70b")
    assert (df["d_model"] == spec.d_model).all() and (df["ffn"] == spec.ffn).all()
    assert (df["kv_heads"] == 8).all() and set(df["mlp"]) == {"swiglu"} and not df["tied_embeddings"].any()
    assert df["seq_len"].tolist() == [8192, 4096]  # the row's own value wins over the preset's
    got = predicted_iter_s(df)
    assert got[0] == pytest.approx(direct_iter_s("llama3-70b"), rel=1e-12)


def test_explicit_shape_columns_equal_the_preset():
    spec = load_model("llama3-8b")
    explicit = {"d_model": spec.d_model, "n_layers": spec.n_layers, "n_heads": spec.n_heads, "seq_len": spec.seq_len,
                "vocab": spec.vocab, "ffn": spec.ffn, "kv_heads": spec.kv_heads, "mlp": "swiglu",
                "tied_embeddings": False}  # fmt: skip
    gelu = {**explicit, "ffn": "", "kv_heads": "", "mlp": "", "tied_embeddings": ""}
    df = table(explicit, {"model": "llama3-8b"}, gelu)
    it = predicted_iter_s(df)
    assert it[0] == pytest.approx(it[1], rel=1e-12) == pytest.approx(direct_iter_s("llama3-8b"), rel=1e-12)
    assert it[2] < it[0]  # 4d GeLU MLP, all heads K/V: fewer FLOPs than SwiGLU 14336 wide


def test_stack_columns_reach_the_strategy():
    df = table({"model": "llama3-8b", "gpus": 128, "cp": 2, "cp_kind": "allgather", "precision": "fp8",
                "schedule": "zb-h1", "zero": 1, "distributed_optimizer": True, "dp": 4})  # fmt: skip
    assert predicted_iter_s(df)[0] == pytest.approx(
        direct_iter_s("llama3-8b", cp=2, cp_kind=2, fp8=True, schedule=1, zero=1, dist_opt=True), rel=1e-12
    )
    with pytest.raises(InputError, match=r"dp=8 but gpus / \(tp x cp x pp\) = 4"):
        table({"model": "llama3-8b", "gpus": 128, "cp": 2, "dp": 8})


def test_moe_preset_rows_run_as_their_model():
    df = table({"model": "mixtral-8x7b", "seq_len": 4096, "ep": 8, "gpus": 64, "tp": 1, "pp": 2, "dp": 32,
                "seq_parallel": False})  # fmt: skip
    assert df["n_experts"].iloc[0] == 8 and df["top_k"].iloc[0] == 2
    assert predicted_iter_s(df)[0] == pytest.approx(
        float(np.ravel(evaluate(load_model("mixtral-8x7b").__class__(**{
            **load_model("mixtral-8x7b").__dict__, "seq_len": 4096}),
            System(default_calibration(load_hardware("dgx-h100")), load_hardware("dgx-h100")),
            Strategies.of(tp=1, pp=2, dp=32, micro_batch=1, global_batch=64, recompute=1, ep=8,
                          flash_attention=True))["iter_s"])[0]), rel=1e-12)  # fmt: skip


@pytest.mark.parametrize(
    ("col", "value", "words"),
    [
        ("mlp", "relu", "column 'mlp': unknown value 'relu'"),
        ("precision", "fp4", "column 'precision': unknown value 'fp4'"),
        ("schedule", "gpipe", "column 'schedule': unknown value 'gpipe'"),
        ("cp_kind", "striped", "column 'cp_kind': unknown value 'striped'"),
        ("master_weights", "fp16", "column 'master_weights': unknown value 'fp16'"),
        ("model", "gpt-9", "column 'model': unknown model preset 'gpt-9'"),
        ("tied_embeddings", "maybe", "column 'tied_embeddings' must be true/false, got 'maybe'"),
        ("cp", "0", "column 'cp' must be at least 1"),
        ("capacity_factor", "0.5", "column 'capacity_factor' must be a number >= 1"),
    ],
)
def test_unknown_values_are_one_line_errors_naming_the_value(col, value, words):
    row = {"model": "llama3-8b"} if col != "model" else {}
    with pytest.raises(InputError) as err:
        table({"model": "llama3-8b"}, {**row, col: value})
    assert words in err.value.problem and "row 2" in err.value.problem and "\n" not in str(err.value)


def test_inconsistent_shape_and_strategy_are_named():
    with pytest.raises(InputError, match="row 1: model shape: kv_heads 5 must divide n_heads 32"):
        table({"model": "llama3-8b", "kv_heads": 5})
    df = table({"model": "llama3-8b", "precision": "fp8", "hardware": "dgx-a100-80gb"})
    with pytest.raises(InputError, match=r"row 1 \(r\): hardware dgx-a100-80gb states no peak_fp8_tflops"):
        validate(df, "t.csv", fit_kind="none")


# ---- uneven interleaved stages ---------------------------------------------------------------
def test_uneven_virtual_stages_hand_worked():
    # L = 10 over p = 4, v = 2: 8 virtual stages, c = ceil(10/8) = 2, r = 2: stages 0, 1 hold 2
    # layers, 2..7 one; GPU q holds stages q and q + 4: GPU 0, 1 three layers, GPU 2, 3 two.
    assert U.chunk_layers(10, 4, 2) == 2.0
    assert tuple(map(float, U.stage_layers(10, 4))) == (3.0, 2.0)  # busiest GPU, last GPU
    # Llama 3 405B: 126 layers, 16 stages, v = 8 -> one layer per virtual stage
    assert U.chunk_layers(126, 16, 8) == 1.0 and tuple(map(float, U.stage_layers(126, 16))) == (8.0, 7.0)
    # pipeline: m (stage + head) + (p - 1)(F + B) / v with F + B = v x the slowest virtual stage
    t_layer, p2p, m, p, v = 1.0, 0.05, 8, 4, 2
    stage = 3 * t_layer + 2 * v * p2p  # GPU 0: 3 layers, 2 v sends per micro-batch
    chunk = v * (2 * t_layer) + 2 * v * p2p
    total, bubble = pipeline_time_s(stage, 0.0, p, m, v, bubble_stage_s=chunk)
    assert bubble == pytest.approx((p - 1) * (2 * t_layer + 2 * p2p))  # 3 hops of the 2-layer stage
    assert total == pytest.approx(m * stage + bubble)


def test_llama3_interleaving_is_accepted_and_its_bubble_is_one_layer_per_hop():
    spec = load_model("llama3-405b")
    assert check_config(spec, 8192, 8, 16, 1, 2048, interleave=8) == 64
    with pytest.raises(InputError, match="v=9 exceeds the 8 layers of the largest pipeline stage"):
        check_config(spec, 8192, 8, 16, 1, 2048, interleave=9)
    hw = load_hardware("dgx-h100")
    sysm = System(default_calibration(hw), hw)
    r = {v: evaluate(spec, sysm, Strategies.of(tp=8, pp=16, dp=64, micro_batch=1, global_batch=2048,
                                               interleave=v, recompute=1, seq_parallel=True, flash_attention=True))
         for v in (1, 8)}  # fmt: skip
    m = 2048 / 64
    pp1, pp8 = float(r[1]["pp_s"]) / m, float(r[8]["pp_s"]) / m  # 2 v sends per micro-batch
    assert pp8 == pytest.approx(8 * pp1)
    layer = (float(r[1]["bubble_s"]) / 15 - pp1) / 8  # v = 1: 15 hops of 8 layers + 2 sends
    assert float(r[8]["bubble_s"]) == pytest.approx(15 * (layer + pp8 / 8), rel=1e-9)
