"""The H100 device model on runs it never saw: a second H100 machine (fixtures/traces/h100b)
and H200 twins of its new shapes (fixtures/traces/h200b), recorded at stop 28.

Splits written down before any prediction was run (SOURCE.txt there):
* dense: calibrate on the five shipped H100 runs and their GEMM bench (the scoreboard's
  fit); the seven new dense shapes (GQA, a Llama-3-8B-wide layer, d 3072, 8K-32K tokens,
  GPT-2 medium at batch 16) and the repeat of the shipped Llama run are held out;
* MoE: the MoE terms are measured on mixtral-d1024-e8 alone; five new MoE shapes (top-k
  1-8, 8-64 experts, d up to 2048, 4K tokens) are held out.
Bounds are the observed errors rounded up (observed figures in each docstring).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "traces"
H100, H100B, H200, H200B = (FIX / n for n in ("h100", "h100b", "h200", "h200b"))
SHIPPED = json.loads((H100 / "measured_steps.json").read_text())["runs"]
MEASURED = json.loads((H100B / "measured_steps.json").read_text())["runs"]
MEASURED_H200 = {
    **json.loads((H200B / "measured_steps.json").read_text())["runs"],
    "mixtral-d1024-e8": json.loads((H200 / "measured_steps.json").read_text())["runs"]["mixtral-d1024-e8"],
}
NEW_DENSE = ("g350m-b16", "llama-bf16-d4096-s2k", "llama-d1024-s16k", "llama-d1024-s8k-b2", "llama-d2048-s32k",
             "llama-d3072-s2k", "llama-gqa-d2048-s4k")  # fmt: skip
REPEAT = "llama-d1024-l16-repeat"
MOE_DEV = "mixtral-d1024-e8"
MOE_HELD = ("mixtral-d1024-e8-top1", "mixtral-d1024-e32-top4", "mixtral-d1024-e64-top8", "mixtral-d2048-e8",
            "mixtral-d1536-e16-s4k")  # fmt: skip


def _report_module():
    """benchmarks/device_heldout.py, whose fit and model specs the tests share."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_heldout", ROOT / "benchmarks" / "device_heldout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _report_module()
_spec = BENCH.spec  # a run's model as a user would write it


def _fit(runs, system: str, bench: Path):
    """A fit of ``runs`` ((folder, name) pairs) with ``bench``'s GEMM bench."""
    return BENCH.fit([(folder.name, name) for folder, name in runs], system, bench.name)


def _row(model, name: str, measured: dict, **kw):
    sh = measured[name]["shape"]
    p = model.predict(_spec(name, sh), gpus=[1], micro_batch=sh["b"], flash_attention=True, **kw)
    return p.table.iloc[0], p.notes, measured[name]


@pytest.fixture(scope="module")
def shipped_fit():
    return _fit([(H100, n) for n in sorted(SHIPPED)], "h100-hf", H100)


def test_the_second_machine_repeats_the_gpu_bound_run_and_not_the_host_bound_one():
    """g760m-b8 (GPU-bound) ran 219.8 ms on the second H100 against
    219.6 ms on the first; the Llama run of many small kernels 65.6 against 81.9 ms (its
    host issues 25 % faster; the H200 machine's host: 66.1 ms)."""
    assert MEASURED["g760m-b8-repeat"]["step_s_unprofiled_median"] == pytest.approx(
        SHIPPED["g760m-b8"]["step_s_unprofiled_median"], rel=0.005
    )
    assert (
        MEASURED[REPEAT]["step_s_unprofiled_median"]
        < 0.85 * SHIPPED["llama-d1024-l16"]["step_s_unprofiled_median"]
    )


def test_new_dense_shapes_on_another_h100_held_out(shipped_fit):
    """The scoreboard's fit predicts the seven new dense shapes through ``predict`` (the
    user's path): observed +1.8, -1.0, +2.9, -2.0, +2.4, +3.2, +3.1 % (median 2.4 %), each
    inside its 90 % interval; peak memory within 1.6 %."""
    errs, mem = [], []
    for name in NEW_DENSE:
        row, _, m = _row(shipped_fit, name, MEASURED)
        meas = m["step_s_unprofiled_median"]
        errs.append(row["iter_s"] / meas - 1.0)
        mem.append(row["mem_total_gb"] / m["peak_mem_gb"] - 1.0)
        assert row["iter_s_lo"] <= meas <= row["iter_s_hi"], (name, row["iter_s_lo"], meas, row["iter_s_hi"])
    errs, mem = np.abs(errs), np.abs(mem)
    assert np.median(errs) <= 0.03 and errs.max() <= 0.04, errs
    assert mem.max() <= 0.02, mem


def test_a_host_bound_step_on_another_host_lies_inside_its_interval(shipped_fit):
    """The repeat of the shipped Llama run is predicted at the first host's issue rate, 81.5
    ms (+24 %); the interval reaches down to the step's device time, and the note says the
    host cost is the traced host's (until stop 28 it ended at 78.3 ms, the repeat outside)."""
    row, notes, m = _row(shipped_fit, REPEAT, MEASURED)
    meas = m["step_s_unprofiled_median"]
    assert row["iter_s"] > 1.2 * meas
    assert row["iter_s_lo"] <= meas <= row["iter_s_hi"]
    assert any("the traced host's" in n for n in notes)


def test_moe_terms_from_one_run_carry_to_new_moe_shapes():
    """MoE terms measured on mixtral-d1024-e8 alone (beside the same machine's dense runs)
    predict the five held-out MoE shapes: on the H100 -1.6, -2.3, +1.1, -2.0, -1.9 %; on the
    H200 +9.3 (top-1, host-bound there), -3.4, -3.7, -2.8, -1.6 %; each inside its interval.
    The hand count used without an MoE trace is 20-40 % fast on HF's grouped experts (its
    masks and copies), and peak memory is within 1 %."""
    h100_dense = [(H100B, n) for n in (REPEAT, *NEW_DENSE)]
    h100 = _fit([*h100_dense, (H100B, MOE_DEV)], "h100-hf", H100)
    h200_dense = [(H200, n) for n in ("g125m-b8", "g760m-b8", "g2p7b-b4", "g1p3b-s2k-b2", "llama-d1024-l16",
                                      "llama-bf16-d4096-s2k", "llama-d1024-s16k", "llama-d2048-s32k",
                                      "llama-gqa-d2048-s4k")]  # fmt: skip
    h200 = _fit([*h200_dense, (H200, MOE_DEV)], "h200-hf", H200)
    assert h100.device_model_.moe.runs == (MOE_DEV,) and h200.device_model_.moe.runs == (MOE_DEV,)
    for model, measured, med, worst in ((h100, MEASURED, 0.025, 0.03), (h200, MEASURED_H200, 0.04, 0.10)):
        errs = []
        for name in MOE_HELD:
            row, _, m = _row(model, name, measured)
            errs.append(row["iter_s"] / m["step_s_unprofiled_median"] - 1.0)
            assert abs(row["mem_total_gb"] / m["peak_mem_gb"] - 1.0) <= 0.01, name
            # the H200 top-1 run is host-bound: inside through the host-bound lower end
            assert row["iter_s_lo"] <= m["step_s_unprofiled_median"] <= row["iter_s_hi"], name
        errs = np.abs(errs)
        assert np.median(errs) <= med and errs.max() <= worst, errs
    hand = _fit(h100_dense, "h100-hf", H100)  # no MoE trace: the hand count
    assert hand.device_model_.moe is None
    errs = np.array([_row(hand, n, MEASURED)[0]["iter_s"] / MEASURED[n]["step_s_unprofiled_median"] - 1.0
                     for n in MOE_HELD])  # fmt: skip
    assert np.all((errs > -0.42) & (errs < -0.18)), errs
    # and predict says which routing it used
    assert any(n.startswith("MoE routing: hand count") for n in _row(hand, MOE_HELD[0], MEASURED)[1])
    assert any("measured on mixtral-d1024-e8" in n for n in _row(h100, MOE_HELD[0], MEASURED)[1])


def _kernels(folder: Path) -> dict:
    rows = json.loads((folder / "measured_steps.json").read_text())["kernels"]["bandwidth"]
    return {(r["kind"], r.get("mib", r.get("mparams"))): r["gbps"] for r in rows}


def _ratios():
    """The presets' compute (measured achievable matmul) and HBM ratios, H200 over H100."""
    from calib.analytic.specs import load_hardware

    a, b = load_hardware("h100"), load_hardware("h200")
    return b.mamf_tflops / a.mamf_tflops, b.hbm_tbps / a.hbm_tbps


def test_memory_bound_kernels_move_between_the_compute_and_the_hbm_ratio():
    """The same kernel bench on both GPUs (same SMs and clocks, 1.43x the HBM bandwidth):
    copy 1.42x, mul 1.43, add 1.37, silu 1.30, gelu 1.10, FP8 cast 1.12, FP32 cast 1.09,
    softmax 0.99, fused AdamW 1.31 (fp32) and 1.20 (bf16) -- each between the compute ratio
    (1.0) and the HBM ratio, as a kernel at the lower of its two limits must be.  One kind
    does not: torch's rms_norm ran 1.76x faster (2.05 TB/s on the H100 at every size; not
    investigated).  The trace classes of the eight new twin runs agree: element-wise
    1.16-1.33, optimizer 1.17-1.33, copies 1.09-1.19, memcpy 1.32-1.39; GEMMs and attention
    0.99-1.05 (tests/test_h200_device.py for the first five twins)."""
    fs, bs = _ratios()
    a, b = _kernels(H100B), _kernels(H200B)
    big = [k for k in a if k[1] in (1024, 4096, 128, 512)]  # past the L2 and the launch costs
    outside = sorted({k[0] for k in big if not fs * 0.97 <= b[k] / a[k] <= bs * 1.03})
    assert outside == ["rms_norm"], outside
    assert min(b[k] / a[k] for k in big) < 1.02 and max(b[k] / a[k] for k in big if k[0] != "rms_norm") > 1.4


def test_cross_gpu_twins_lie_inside_the_moved_interval(shipped_fit):
    """The H100 fit moved to the H200 and the H200 fit moved to the H100 (presets' ratios):
    the interval now holds both ends of the memory-bound kernels' transfer
    (analytic.interval.sm_bound_transfer), and all 20 twin runs lie inside (4 of 12 outside
    in the H100 -> H200 direction before).  Point errors, not changed: H100 -> H200 median
    4.4 % on the nine first twins and 3.8 % on the three new; H200 -> H100 7.3 %."""
    h200_fit = _fit([(H200, n) for n in ("g125m-b8", "g760m-b8", "g2p7b-b4", "g1p3b-s2k-b2",
                                                   "llama-d1024-l16")], "h200-hf", H200)  # fmt: skip
    first = json.loads((H200 / "measured_steps.json").read_text())["runs"]
    twins = [(shipped_fit, "h200", first, n) for n in ("g125m-b8", "g760m-b8", "g2p7b-b4", "g1p3b-s2k-b2",
                                                         "llama-d1024-l16", "llama-bf16-d4096-s2k", "llama-d1024-s16k",
                                                         "llama-d2048-s32k", "llama-gqa-d2048-s4k")]  # fmt: skip
    twins += [
        (shipped_fit, "h200", MEASURED_H200, n)
        for n in ("g350m-b16", "llama-d1024-s8k-b2", "llama-d3072-s2k")
    ]
    twins += [(h200_fit, "h100", MEASURED, n) for n in (REPEAT, *NEW_DENSE)]
    errs = {"h200": [], "h100": []}
    for model, hw, measured, name in twins:
        row, notes, m = _row(model, name, measured, hardware=hw)
        meas = m["step_s_unprofiled_median"]
        assert row["iter_s_lo"] <= meas <= row["iter_s_hi"], (
            hw,
            name,
            row["iter_s_lo"],
            meas,
            row["iter_s_hi"],
        )
        assert any("between the compute ratio and the HBM ratio" in n for n in notes)
        errs[hw].append(abs(row["iter_s"] / meas - 1.0))
    assert np.median(errs["h200"]) <= 0.05 and np.median(errs["h100"]) <= 0.08, errs


def test_compiled_runs_held_out_on_the_second_h100():
    """Every second-H100 run but three held out (the H200 split of tests/test_device_compile.py):
    the FP8 GEMM speed-up measured on the eager FP8 runs is 1.81 +- 0.06 (the H200's 1.78);
    the FP8 + compiled runs -6.8 and +6.2 %; the compiled Mixtral +7.4 % with the MoE routing
    fused as the compiled family fuses the dense layer (analytic.device_path.compile_fusion;
    +34.5 % before -- the rule was written after that error was seen, from the traces' own
    x0.24 / x0.23 memory-bound ratios, so this run is not a blind check of it).  Peak memory
    +3.2, +0.2 and -0.1 % (+0.9, -1.5 and +10.7 % until stop 34, when the compiled family
    took the eager loss's logit bytes: device_compile._memory)."""
    held = ("llama-fp8-compiled-d2048-s4k", "llama-fp8-compiled-d4096-s2k", "mixtral-compiled-d1024-e8")
    runs = [(H100B, n) for n in sorted(MEASURED) if n not in held and MEASURED[n]["call"] < 4]  # as split
    runs = [r for r in runs if (H100B / "runs" / r[1]).is_dir()]
    model = _fit(runs, "h100-hf", H100)
    sp = model.device_model_.fp8_gemm_speedup
    assert abs(sp.value - 1.78) <= 2 * sp.stderr and sp.stderr <= 0.1, sp
    for name, bound in zip(held, (0.07, 0.07, 0.08)):
        row, notes, m = _row(model, name, MEASURED, compiled=True, fp8="fp8" in name)
        err = row["iter_s"] / m["step_s_unprofiled_median"] - 1.0
        assert abs(err) <= bound, (name, err)
        assert abs(row["mem_total_gb"] / m["peak_mem_gb"] - 1.0) <= 0.04, name
        assert any("torch.compile: the swiglu/bf16/compiled family" in n for n in notes)


def test_other_moe_implementations_never_fitted():
    """HF's DeepSeek-V3 (MLA, shared experts, a dense first layer) and Qwen2-MoE (a gated
    shared expert) at three shapes, predicted from the second H100's dense runs and the
    Mixtral MoE terms -- another implementation of the routing, never fitted.  The specs
    count the models' parameters (611 M, 1,207 M, 834 M; the MLA norms, biases
    and gates apart, within 0.005 %); observed -5.9, +8.7, -3.6 % with the grouping law of
    stop 33 (-6.8, +7.0, -5.2 before it; stop 28, before the shared experts' element-wise
    work was priced: -7.4, +4.8, -5.5), each inside its
    interval; peak memory -1.6, +1.8, -2.1 % (-3.5, +1.8, -3.7 before stop 32 counted what HF's
    MLA keeps beyond that count; -5.5, +1.8, -5.3 before stop 29 counted multi-head latent
    attention's kept tensors in the device path's memory)."""
    from calib.analytic import moe as MOE

    model = _fit([(H100B, n) for n in (REPEAT, *NEW_DENSE, MOE_DEV)], "h100-hf", H100)
    for name in ("dsv3-d1024-e64-top6", "qwen2moe-d1024-e60-top4", "dsv3-d2048-e32-top4"):
        m = MEASURED[name]
        sh, meas = m["shape"], m["step_s_unprofiled_median"]
        spec = _spec(name, sh)
        assert MOE.total_and_active_params(spec)[0] == pytest.approx(m["params"], rel=1e-4), name
        row = model.predict(spec, gpus=[1], micro_batch=sh["b"], flash_attention=True).table.iloc[0]
        assert abs(row["iter_s"] / meas - 1.0) <= 0.09, (name, row["iter_s"], meas)
        assert row["iter_s_lo"] <= meas <= row["iter_s_hi"], name
        assert abs(row["mem_total_gb"] / m["peak_mem_gb"] - 1.0) <= 0.025, name


def test_the_held_out_report_prints_the_kernel_ratios(capsys):
    """benchmarks/device_heldout.py prints every figure above run by run; its kernel section
    reads the two benches (copy at 4 GiB: 3,027 -> 4,302 GB/s, x1.42)."""
    BENCH.main(["--section", "kernels"])
    out = capsys.readouterr().out
    copy = next(line for line in out.splitlines() if line.split()[:3] == ["copy", "4096", "MiB"])
    assert copy.split()[-1] == "x1.42", copy


def test_each_eager_fp8_run_from_the_other():
    """The second H100's eager FP8 runs (unfused per-op casts), each predicted from a fit with
    the other beside the dense runs: -1.5 and -2.5 % (the H200's: -1.8 %), memory +2 %.
    Without an FP8 run the stated default (Transformer Engine's fused casts) is about 46 %
    fast on them, as its note warns."""
    dense = [(H100B, n) for n in (REPEAT, *NEW_DENSE)]
    a, b = "llama-fp8-d2048-s4k", "llama-fp8-d4096-s2k"
    for train, held in ((a, b), (b, a)):
        model = _fit([*dense, (H100B, train)], "h100-hf", H100)
        row, _, m = _row(model, held, MEASURED, fp8=True)
        assert abs(row["iter_s"] / m["step_s_unprofiled_median"] - 1.0) <= 0.03, held
        assert abs(row["mem_total_gb"] / m["peak_mem_gb"] - 1.0) <= 0.03, held
    row, notes, m = _row(_fit(dense, "h100-hf", H100), a, MEASURED, fp8=True)
    assert -0.5 <= row["iter_s"] / m["step_s_unprofiled_median"] - 1.0 <= -0.4
    assert any("can make FP8 slower than bf16" in n for n in notes)
