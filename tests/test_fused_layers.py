"""Calculon's "fused layers" knob (seed 000's execution-strategy table: memory time down) and
2D tensor parallelism in ``calib predict`` (seed 002), hand-worked and against the search."""

from __future__ import annotations

from dataclasses import replace

import pytest
from calib.analytic import formulas as F
from calib.analytic.machine import default_calibration
from calib.analytic.predict import Plan, predict
from calib.analytic.search import Space, search
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import FUSED_VECTOR_PASSES, VECTOR_PASSES, System, evaluate

from calib.core.errors import InputError

H100 = load_hardware("dgx-h100")
SYS = System(default_calibration(H100), H100)
GPT1 = replace(load_model("gpt3-175b"), n_layers=1)  # one layer of GPT-3 175B


def test_fused_layers_saves_two_activation_passes_on_one_layer():
    # Korthikanti et al. eq. 1: one layer keeps s b d (34 + 5 a s / d) bytes; GPT-3 175B,
    # s 2048, d 12288, a 96, b 1: 2048 * 12288 * (34 + 80) = 2,868,903,936 bytes.
    # Unfused the element-wise kernels traverse them 5 times, fused 3: 2 x 2.8689 GB saved
    # per layer and micro-batch at the H100's 3.35 TB/s = 1.7128 ms; 4 micro-batches: 6.851 ms.
    assert VECTOR_PASSES - FUSED_VECTOR_PASSES == 2.0
    assert not SYS.k2_covers_other_kernels  # default calibration: the traffic term is in
    kw = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=4)
    off = evaluate(GPT1, SYS, Strategies.of(**kw))
    on = evaluate(GPT1, SYS, Strategies.of(**kw, fused_layers=True))
    saved = float(off["kernel_transformer_s"] - on["kernel_transformer_s"])
    assert saved == pytest.approx(4 * 2 * 2_868_903_936 / 3.35e12, rel=1e-9)  # 6.851 ms
    # the iteration saves it divided by k1 k2 at the layer's mean matmul size (seed 004's
    # non-kernel shares, defaults here), no more: 6.851 ms / 0.760 = 9.015 ms
    x = F.forward_flops_layer(1, 2048, 12288) / 6.0
    k12 = float(SYS.cal.k1(x) * SYS.cal.k2(x))
    assert float(off["iter_s"] - on["iter_s"]) == pytest.approx(saved / k12, rel=1e-9)
    # memory is not changed by the knob (Calculon's "mem cap" arrow is not modelled)
    assert float(on["mem_total_bytes"]) == float(off["mem_total_bytes"])


def test_fused_layers_is_a_search_axis():
    model, gpus, B = load_model("gpt3-13b"), 64, 256
    both = search(model, SYS, gpus, B, Space(fused_layers=(False, True)), top=3)
    off = search(model, SYS, gpus, B, Space(), top=3)
    on = search(model, SYS, gpus, B, Space(fused_layers=(True,)), top=3)
    assert both.n_strategies == 2 * off.n_strategies  # a full axis of the grid
    assert bool(both.top.iloc[0].fused_layers) and not bool(off.top.iloc[0].fused_layers)
    assert both.top.iloc[0].iter_s == pytest.approx(on.top.iloc[0].iter_s)
    assert on.top.iloc[0].iter_s < off.top.iloc[0].iter_s


def _cli(args):
    from click.testing import CliRunner

    from calib.cli import cli

    out = CliRunner().invoke(cli, args, standalone_mode=False, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    return [dict(zip(*[ln.split(",") for ln in (out.output.splitlines()[0], row)], strict=True))
            for row in out.output.splitlines()[1:]]  # fmt: skip


def _rc(v):
    return ("none", "selective", "full")[int(v)] if v.isdigit() else v


VIT = ["--d", "8192", "--l", "99", "--a", "64", "--s", "262144", "--V", "1024"]


def test_predict_2d_tp_equals_the_search_row():
    """The search's best 2D-grid strategy, given to predict, has the same iteration time."""
    base = ["--hardware", "b200", *VIT, "--global-batch", "64", "--flash-attention", "--csv"]
    row = _cli(["search", *base, "--gpus", "256", "--top", "1", "--tp-cols", "2", "--zero", "0,1",
                "--fused-layers", "on,off"])[0]  # fmt: skip
    assert row["tp_c"] == "2"
    pred = _cli(["predict", *base, "--gpus", "256", "--tp", row["tp"], "--pp", row["pp"],
                 "--micro-batch", row["micro_batch"], "--zero", row["zero"], "--recompute", _rc(row["recompute"]),
                 "--interleave", row["interleave"], "--seq-parallel", "--tp-cols", "2"]
                + (["--dp-overlap"] if row["dp_overlap"] == "True" else [])
                + (["--fused-layers"] if row["fused_layers"] == "True" else []))[0]  # fmt: skip
    assert float(pred["iter_s"]) == pytest.approx(float(row["iter_s"]), rel=1e-6)


def test_predict_2d_tp_errors_and_summa():
    base = ["predict", "--hardware", "b200", *VIT, "--global-batch", "64", "--gpus", "256", "--tp", "16",
            "--seq-parallel", "--recompute", "full", "--flash-attention", "--csv"]  # fmt: skip
    with pytest.raises(InputError, match="--tp-cols"):  # 3 divides neither TP 16 nor the sequence
        _cli([*base, "--tp-cols", "3"])
    with pytest.raises(InputError, match="--tp-cols"):  # a grid needs sequence-parallel rows
        _cli([a for a in base if a != "--seq-parallel"] + ["--tp-cols", "2"])
    plan = dict(tp=16, micro_batch=1, global_batch=64, recompute=2, seq_parallel=True, flash_attention=True)
    model = load_model("gpt3-175b")
    vit = replace(model, d_model=8192, n_layers=99, n_heads=64, seq_len=262144, vocab=1024)
    b200 = load_hardware("b200")
    sysb = System(default_calibration(b200), b200)
    two = predict(vit, sysb, [256], Plan(**plan, tp_c=2)).table.iloc[0]
    summa = predict(vit, sysb, [256], Plan(**plan, tp_c=2, tp2d_kind=1)).table.iloc[0]
    # SUMMA splits the weights over all 16 GPUs of the grid, the 2D table over its 8 rows
    assert two.mem_weights_gb == pytest.approx(2.0 * summa.mem_weights_gb)
    with pytest.raises(InputError, match="tp_c"):
        predict(vit, sysb, [256], Plan(**plan, tp_c=32))


def test_fused_layers_with_a_traced_k2_takes_the_passes_off_the_kernel_time():
    """A k2 fitted on traces holds the (unfused) element-wise kernels in its 1 - k2 share: the
    traffic term is left out and fusion's 2 passes come off the kernel time instead."""
    cal = SYS.cal
    k2 = cal.k2_curve
    traced = System(replace(cal, k2_curve=replace(k2, y_max=replace(k2.y_max, status="fitted"))), H100)
    assert traced.k2_covers_other_kernels
    kw = dict(tp=1, pp=1, dp=1, micro_batch=1, global_batch=4)
    off = evaluate(GPT1, traced, Strategies.of(**kw))
    on = evaluate(GPT1, traced, Strategies.of(**kw, fused_layers=True))
    assert float(on["kernel_transformer_s"]) == float(off["kernel_transformer_s"])  # the GEMMs
    x = F.forward_flops_layer(1, 2048, 12288) / 6.0
    saved = 4 * 2 * 2_868_903_936 / 3.35e12  # the same 2 passes as above: 6.851 ms
    assert float(off["iter_s"] - on["iter_s"]) == pytest.approx(saved / float(cal.k1(x)), rel=1e-9)


def test_api_predict_and_search_take_the_knobs():
    from calib.api import SystemModel

    sm = SystemModel.from_hardware("dgx-h100")
    kw = dict(tp=8, micro_batch=1, global_batch=64)
    off = sm.predict("gpt3-13b", 64, **kw).table.iloc[0]
    on = sm.predict("gpt3-13b", 64, **kw, fused_layers=True).table.iloc[0]
    grid = sm.predict("gpt3-13b", 64, **kw, seq_parallel=True, tp_c=2).table.iloc[0]
    assert on.iter_s < off.iter_s and grid.iter_s > 0
    res = sm.search("gpt3-13b", 64, global_batch=256, top=1, fused_layers=(False, True))
    assert bool(res.top.iloc[0].fused_layers)
