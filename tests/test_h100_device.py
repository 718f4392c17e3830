"""The device model on the real H100 runs (fixtures/traces/h100): ingest, fit, check.

Bounds are the issue's acceptance figures, asserted on real measurements: each run's
unprofiled step time (run_config.json) and its measured peak memory (measured_steps.json).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from calib.analytic.specs import ModelSpec

from calib.api import SystemModel, ingest_run, load_runs

H100 = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "h100"
MEASURED = json.loads((H100 / "measured_steps.json").read_text())["runs"]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    for run in sorted((H100 / "runs").iterdir()):
        ingest_run(run, system="h100-hf", store=store)
    for bench in (H100 / "gemm-bench").iterdir():
        shutil.copytree(bench, store / "h100-hf" / "runs" / bench.name)
    model = SystemModel().fit(load_runs(system="h100-hf", store=store))
    return model, store


def _rows(model):
    return {r["run"]: r for r in model.device_model_.runs}


def test_every_gemm_is_counted_once(fitted):
    """Per training step: 4 linears per layer and the LM head, each a forward, an input-
    gradient and a weight-gradient GEMM (HF Conv1D's addmm nests inside addmm under
    autocast; counting both would double this)."""
    _, store = fitted
    for name, layers in (("g125m-b8", 12), ("g760m-b8", 24)):
        g = load_runs([name], system="h100-hf", store=store)[0].table("gemms")
        per_step = g.groupby("iteration").size()
        assert (per_step == (4 * layers + 1) * 3).all(), (name, per_step.to_dict())


def test_in_sample_and_leave_one_run_out_step_time(fitted):
    model, _ = fitted
    rows = _rows(model)
    assert set(rows) == set(MEASURED)
    ins = np.array(
        [r["insample_step_s"] / MEASURED[k]["step_s_unprofiled_median"] - 1 for k, r in rows.items()]
    )
    loo = np.array([r["loo_step_s"] / MEASURED[k]["step_s_unprofiled_median"] - 1 for k, r in rows.items()])
    assert np.max(np.abs(ins)) <= 0.03, ins
    assert np.median(np.abs(loo)) <= 0.05, loo
    assert np.max(np.abs(loo)) <= 0.10, loo


def test_leave_one_out_intervals_cover_the_runs(fitted):
    model, _ = fitted
    rows = _rows(model).values()
    inside = [r["loo_inside"] for r in rows]
    assert sum(inside) / len(inside) >= 0.9
    halves = [(r["loo_hi_s"] - r["loo_lo_s"]) / 2 / r["loo_step_s"] for r in rows]
    assert 0.0 < np.median(halves) <= 0.10, halves


def test_peak_memory_within_ten_percent(fitted):
    model, _ = fitted
    for k, r in _rows(model).items():
        assert abs(r["insample_mem_gb"] / MEASURED[k]["peak_mem_gb"] - 1) <= 0.10, k


def test_reference_memory_constants_follow_from_the_measurements():
    import importlib.util

    from calib.calibrate.device_fit import REFERENCE_ACT_SCALE, REFERENCE_LOGIT_BYTES

    spec = importlib.util.spec_from_file_location("memref", H100 / "memory_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ref = mod.reference()
    assert ref.pop("logit") == REFERENCE_LOGIT_BYTES
    assert ref == REFERENCE_ACT_SCALE


def test_predict_carries_the_interval_and_the_measured_step(fitted, tmp_path):
    model, store = fitted
    path = model.save(tmp_path / "h100.calib.json")
    from calib.api import SystemModel as SM

    m = SM.load(path)
    sh = MEASURED["g760m-b8"]["shape"]
    spec = ModelSpec("g760m", sh["d"], sh["l"], sh["a"], sh["s"], sh["V"])
    pred = m.predict(spec, gpus=[1], micro_batch=sh["b"], flash_attention=True)
    row = pred.table.iloc[0]
    meas = MEASURED["g760m-b8"]["step_s_unprofiled_median"]
    assert row["iter_s_lo"] < row["iter_s"] < row["iter_s_hi"]
    assert row["iter_s_lo"] <= meas <= row["iter_s_hi"]
    assert abs(row["mem_total_gb"] / MEASURED["g760m-b8"]["peak_mem_gb"] - 1) <= 0.10


def test_memory_leave_one_run_out_from_measured_peaks(fitted):
    """With each run's measured peak, act_scale is fitted per family and every run is
    predicted by a fit to the others: the Llama run, the only one of its family, then
    rests on its hand count alone (scale 1)."""
    from dataclasses import replace

    from calib.calibrate import compute, device_check, device_facts, device_fit

    _, store = fitted
    runs = load_runs(system="h100-hf", store=store)
    facts = [
        replace(f, peak_mem_bytes=MEASURED[f.name]["peak_mem_gb"] * 1e9)
        for f in (device_facts.facts(r) for r in runs if r.meta.kind == "trace")
        if f is not None
    ]
    bench = compute.bench_gemm_samples(runs)
    dm = device_fit.fit_device(facts, bench, "NVIDIA H100 80GB HBM3", 989.4, 3.35, "datasheet")
    rows = device_check.check_runs(dm, facts, bench)
    errs = {r["run"]: r["loo_mem_gb"] / r["measured_mem_gb"] - 1 for r in rows}
    assert max(abs(e) for e in errs.values()) <= 0.10, errs
    assert abs(errs["llama-d1024-l16"]) <= 0.05, errs


def test_transfer_rule_scales_rates_with_peak_and_bandwidths_with_hbm(fitted):
    """DeviceModel.on: FLOP-bound terms follow the peak ratio, byte-bound terms the HBM
    ratio, host costs stay (docs/calibrate.md)."""
    from calib.calibrate import device_step as D

    model, _ = fitted
    dm = model.device_model_
    moved = dm.on(dm.peak_tflops * 2.0, dm.hbm_tbps * 1.5)
    big = (8192.0, 8192.0, 8192.0)  # compute-bound GEMM: time - fixed halves
    t0, t1 = dm.gemm.time_s(*big), moved.gemm.time_s(*big)
    fixed = dm.gemm.fixed_s.value
    assert (t1 - fixed) == pytest.approx((t0 - fixed) / 2.0, rel=1e-9)
    fam, _ = dm.family("gelu")
    s0 = D.stream_layer_s(dm, fam, 8192, 2048, 8192, 1.0, False)
    s1 = D.stream_layer_s(moved, fam, 8192, 2048, 8192, 1.0, False)
    kern = fam.kernels_layer.value * dm.kernel_fixed_s.value
    assert (s1 - kern) == pytest.approx((s0 - kern) / 1.5, rel=1e-9)
    assert D.optimizer_s(moved, fam, 1e9) < D.optimizer_s(dm, fam, 1e9)
    assert D.host_s(moved, fam, 24, 1) == pytest.approx(D.host_s(dm, fam, 24, 1))


def test_another_device_gets_the_ratio_of_achievable_matmuls(fitted):
    """On another preset the fitted GEMM rate scales with the devices' measured maximum
    achievable matmul (A100 271.2 / H100 794.5 TFLOP/s, hardware_accelerator_specs.csv), not
    their datasheet peaks (312 / 989): the A100 reaches a larger share of its peak.  Without a
    measured value on either side the peak ratio stays."""
    from calib.analytic.specs import load_hardware
    from calib.analytic.timemodel import System

    model, _ = fitted
    dm = model.device_model_
    a100 = load_hardware("dgx-a100-80gb")
    moved = System(model.calibration_, a100).device_model
    assert moved.gemm.rate_tflops.value == pytest.approx(dm.gemm.rate_tflops.value * 271.2 / 794.5, rel=1e-12)
    assert moved.peak_tflops == 312
    # the A100 40GB (Polaris) carries the 80GB part's measurement since stop 31: the same ratio
    polaris = System(model.calibration_, load_hardware("polaris")).device_model
    assert polaris.gemm.rate_tflops.value == pytest.approx(moved.gemm.rate_tflops.value, rel=1e-12)
    v100 = System(model.calibration_, load_hardware("dgx-2")).device_model  # V100: not measured
    assert v100.gemm.rate_tflops.value == pytest.approx(dm.gemm.rate_tflops.value * 125 / dm.peak_tflops)


def test_fp8_under_the_device_model(fitted):
    """FP8 with a device model fitted on BF16 traces: the layer's linear GEMMs run at the
    fitted rate x the FP8 rate (here the datasheet's 1979 / 989 for the mechanics; on the
    dgx-h100 preset its measured 1.78 since stop 31), their casts stream at the fitted
    bandwidth, attention stays bf16 -- so a step gets faster, by less than that rate."""
    from dataclasses import replace

    import numpy as np
    from calib.analytic import device_path as DP
    from calib.analytic import precision as PR
    from calib.analytic.machine import build_system
    from calib.analytic.specs import load_hardware, load_model
    from calib.analytic.strategy import Strategies
    from calib.analytic.timemodel import evaluate
    from calib.calibrate import device_step as D

    model, _ = fitted
    dm = model.device_model_
    fam, _ = dm.family("swiglu")
    m = replace(load_model("llama3-8b"), seq_len=4096)
    sh = DP.shape_of(m)
    r8 = 1979 / 989
    bf, f8 = (DP.layer_terms(dm, fam, sh, 2, 1, False, 0, True, fp8, r8) for fp8 in (False, True))
    T = 2 * 4096
    args = (dm, T, sh.d, sh.a, sh.kv, sh.ffn, 1, "swiglu", 1.0)
    assert float(f8["transformer"] - bf["transformer"]) == pytest.approx(
        float(D.gemm_layer_s(*args, r8) - D.gemm_layer_s(*args)), rel=1e-9
    )
    casts = PR.cast_bytes_layer(T, sh.d, sh.ffn, sh.kv / sh.a, 3.0, 1, 1.0)
    assert float(f8["stream"] - bf["stream"]) == pytest.approx(float(casts) / (dm.stream_tbps.value * 1e12))
    sysm, _ = build_system(model.calibration_, load_hardware("dgx-h100"))
    st = Strategies.of(tp=1, pp=1, dp=8, micro_batch=2, global_batch=16, zero=3, flash_attention=True,
                       fp8=np.array([False, True]))  # fmt: skip
    it = evaluate(m, sysm, st)["iter_s"]
    assert 1.0 < it[0] / it[1] < PR.fp8_speedup(load_hardware("dgx-h100")) == 1.78
    # the prediction says where each FP8 term comes from (no FP8 run traced on this H100: the
    # preset's measured rate, the casts a stated default), once: the spec path's own FP8 note
    # is not added beside the device model's (stop 25)
    notes = [n for n in model.predict(m, gpus=[8], micro_batch=2, fp8=True, flash_attention=True).notes
             if n.startswith("FP8")]  # fmt: skip
    assert len(notes) == 1 and "x1.78 their bf16 rate (the preset's measured fp8_gemm_speedup)" in notes[0]
    assert notes[0].count("stated default") == 1 and "Transformer Engine" in notes[0]


def test_mla_widths_scale_the_device_models_attention(fitted):
    """A model whose heads are wider than d / a (MLA) costs attn_scale x the fitted attention
    core's time under a device model too, and nothing else changes."""
    from dataclasses import replace

    from calib.analytic import device_path as DP
    from calib.analytic.shape_terms import attention_dims_factor
    from calib.analytic.specs import load_model
    from calib.calibrate import device_step as D

    model, _ = fitted
    dm = model.device_model_
    fam, _ = dm.family("swiglu")
    m = replace(load_model("llama3-8b"), seq_len=4096, qk_head_dim=192, v_head_dim=128)
    f = attention_dims_factor(m)
    assert f == pytest.approx(32 * 320 / (2 * 4096))
    sh = DP.shape_of(m)
    one, wide = (DP.layer_terms(dm, fam, sh, 2, 1, False, 0, True, attn_scale=x) for x in (1.0, f))
    attn = D.attention_layer_s(dm, 2, sh.s, sh.d, sh.a, 1, True, 1.0)
    assert float(wide["transformer"] - one["transformer"]) == pytest.approx(float((f - 1.0) * attn), rel=1e-9)
    assert float(wide["stream"]) == pytest.approx(float(one["stream"]))


def test_mla_projections_in_the_device_models_gemms(fitted):
    """Under a device model each of MLA's projections is its own GEMM (analytic.mla
    attention_linears); their weights add up to the count every other site uses
    (shape_terms.attention_proj_params: 187,105,280 for DeepSeek-V3), also with a full-rank
    query, and a model without MLA fields keeps Q, K, V and O."""
    from dataclasses import replace

    from calib.analytic import device_path as DP
    from calib.analytic.mla import attention_linears
    from calib.analytic.shape_terms import attention_proj_params
    from calib.analytic.specs import load_model
    from calib.calibrate import device_step as D

    model, _ = fitted
    dm = model.device_model_
    fam, _ = dm.family("swiglu")
    ds = load_model("deepseek-v3")
    for m in (ds, replace(ds, q_lora_rank=0)):
        sh = DP.shape_of(m)
        attn = float(attention_proj_params(m))
        assert float(D.layer_params(sh.d, sh.a, sh.kv, sh.ffn, sh.mlp, sh.attn)) == attn + 3 * 7168 * 18432
    assert sum(i * o for i, o, _ in attention_linears(ds)) == 187_105_280
    assert DP.shape_of(load_model("llama3-8b")).attn is None
    sh = DP.shape_of(ds)
    plain = replace(sh, attn=None)
    t = {
        k: DP.layer_terms(dm, fam, x, 1, 1, False, 0, True)["transformer"]
        for k, x in (("mla", sh), ("qkvo", plain))
    }
    gemm = {k: D.gemm_layer_s(dm, 4096.0, 7168.0, 128.0, 128.0, 18432.0, 1, "swiglu", attn=a) for k, a in (("mla", sh.attn), ("qkvo", None))}  # fmt: skip
    assert float(t["mla"] - t["qkvo"]) == pytest.approx(float(gemm["mla"] - gemm["qkvo"]), rel=1e-9)


def test_validating_a_table_under_a_device_model_fits_nothing(fitted, tmp_path):
    """A trace-fitted device model times every kernel itself: the table's compute
    efficiencies would move nothing, so validate says so and predicts every row as given
    (it used to print the fit's starting values as if fitted)."""
    from tests.conftest import run

    model, _ = fitted
    cal = model.save(tmp_path / "h100.calib.json")
    table = H100.parents[1] / "published" / "mosaicml_llmfoundry_fsdp_h100_bf16.csv"
    args = ("--calibration", str(cal), "--override-hardware", "--calibrate-on", "every-third")
    out = run("validate", str(table), *args).output
    assert "note: no fit: the device model of h100-hf times every kernel" in out
    assert "fit (compute)" not in out and "held-out rows 52:" in out


def test_a_host_bound_step_says_so(fitted):
    """The traced H100 host issues llama-d1024-l16's many small kernels more slowly than the
    device runs them (the fitted host cost per operator times its operators exceeds the
    device's work), so the step is the host's time and a faster GPU would not shorten it:
    predict says so, with the host time equal to the step.  Moved to the H200 preset the host
    cost is kept (DeviceModel.on) and the note says the target's host is not measured -- the
    H200 machine's own run of that shape took 66.1 ms against the 81.5 ms the H100 host sets
    (fixtures/traces/h200/measured_steps.json: that host is faster).  g2p7b-b4 is
    device-bound: no note."""
    model, _ = fitted
    sh = MEASURED["llama-d1024-l16"]["shape"]
    llama = ModelSpec("llama", sh["d"], sh["l"], sh["a"], sh["s"], sh["V"], ffn=sh["ffn"], kv_heads=sh["kv"],
                      mlp="swiglu", tied_embeddings=False)  # fmt: skip
    pred = model.predict(llama, gpus=[1], micro_batch=sh["b"], flash_attention=True)
    note = [n for n in pred.notes if n.startswith("host-bound")]
    assert len(note) == 1 and "target hardware" not in note[0]
    ms = float(note[0].split("1 GPUs (")[1].split(" ms")[0])
    assert ms == pytest.approx(pred.table["iter_s"].iloc[0] * 1e3, rel=1e-3)
    moved = model.predict(llama, gpus=[1], hardware="h200", micro_batch=sh["b"], flash_attention=True)
    assert any(n.startswith("host-bound") and "target hardware" in n for n in moved.notes)
    sh = MEASURED["g2p7b-b4"]["shape"]
    gpt = ModelSpec("g2p7b", sh["d"], sh["l"], sh["a"], sh["s"], sh["V"])
    assert not any("host-bound" in n for n in model.predict(gpt, gpus=[1], micro_batch=sh["b"]).notes)
