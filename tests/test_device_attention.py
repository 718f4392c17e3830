"""The device model's attention term (calibrate/device_attention.py) on real traces: the
matmul, exponential and per-row terms of a flash-attention kernel, fitted to the traced
attention kernel time of the H100 reference runs and the H200 runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from calib.calibrate import device_attention as A
from calib.calibrate import device_facts
from calib.calibrate import device_step as D
from calib.calibrate.device_model import DeviceModel
from scipy.optimize import nnls

from calib.api import SystemModel, ingest_run, load_runs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
H100, H200 = FIX / "h100", FIX / "h200"
REPLICAS = ("g125m-b8", "g760m-b8", "g2p7b-b4", "g1p3b-s2k-b2", "llama-d1024-l16")
LONG = ("llama-bf16-d4096-s2k", "llama-d1024-s16k", "llama-d2048-s32k", "llama-gqa-d2048-s4k")


def _facts(tmp: Path, src: Path, system: str, names) -> list:
    for n in names:
        ingest_run(src / "runs" / n, system=system, store=tmp)
    return [device_facts.facts(r) for r in load_runs(system=system, store=tmp, kind="trace")]


@pytest.fixture(scope="module")
def h100_runs(tmp_path_factory):
    return _facts(tmp_path_factory.mktemp("h100"), H100, "h100-hf", REPLICAS)


def _loo(runs, fit, predict) -> np.ndarray:
    errs = []
    for i, f in enumerate(runs):
        c = fit([g for j, g in enumerate(runs) if j != i])
        errs.append(predict(c, f) / f.class_s["attention"] - 1.0)
    return np.array(errs)


def test_each_reference_runs_attention_from_the_other_four(h100_runs):
    """Leave one run out: the three-term model predicts each H100 reference run's traced
    attention kernel time from the other four (head widths 64-128, s 1024-2048).  Observed
    3.2 % median; the two-term model with a 64-wide head tile that calib used until stop 22
    (matmul and per-row terms only; hd 80 and 96 priced as 128) missed by 17.4 %: it cannot
    hold the narrow heads' exponentials."""
    three = _loo(h100_runs, lambda rs: A.fit_attention(rs), lambda c, f: float(
        np.dot(A.run_features(f), [c[0].value, c[2].value, c[1].value])))  # fmt: skip

    def two_fit(rs):
        X = np.array([_old(f) for f in rs])
        y = np.array([f.class_s["attention"] for f in rs])
        return nnls(X / y[:, None], np.ones(len(y)))[0]

    two = _loo(h100_runs, two_fit, lambda c, f: float(_old(f) @ c))
    assert np.median(np.abs(three)) <= 0.05, three
    assert np.median(np.abs(two)) >= 0.10, two


def _old(f) -> np.ndarray:
    X = f.L * A.features(f.b, f.a, f.s, A.padded_head(f.d, f.a, A.LEGACY_HEAD_TILE))
    return X[[0, 2]]


def test_long_sequences_and_wide_heads_held_out(tmp_path):
    """Fitted on the five H100-repeat runs on the H200 (s <= 2048), the attention time of
    the held-out dense runs: GQA at 4K, 16K and 32K tokens, an 8B-wide layer.  Observed
    +2.5, +8.2, +1.3, -3.8 % (the two-term model: +28, +20, +47 %, +5 %)."""
    fit = _facts(tmp_path / "fit", H200, "h200-hf", REPLICAS)
    c_flop, c_io, c_score = A.fit_attention(fit)
    held = {f.name: f for f in _facts(tmp_path / "held", H200, "h200-hf", LONG)}
    for name in LONG:
        f = held[name]
        pred = (
            A.layer_s(c_flop.value, c_io.value, c_score.value, f.b, f.a, f.s, A.padded_head(f.d, f.a)) * f.L
        )
        assert abs(float(pred) / f.class_s["attention"] - 1.0) <= 0.10, (name, pred, f.class_s["attention"])
    # each term is identified: more than three standard errors from zero
    assert all(p.value > 3 * p.stderr for p in (c_flop, c_io, c_score)), (c_flop, c_io, c_score)
    # the matmul term is the GEMMs' rate: 7 FLOPs per causal b a s^2 h' unit (2 forward,
    # 5 backward) at 700-900 TFLOP/s (the H200's measured GEMM best: 797)
    assert 700e12 <= 7.0 / c_flop.value <= 900e12


def test_layer_time_by_hand():
    """hd 80 runs in the 96-wide kernel (a multiple of 32): one layer of b 4, 32 heads,
    s 1024 costs c_flop b a s^2 96 + c_score b a s^2 + c_io b a s 96."""
    b, a, s, hd = 4, 32, 1024, 96.0
    got = A.layer_s(1e-14, 1e-11, 5e-13, b, a, s, A.padded_head(2560, 32))
    assert float(got) == pytest.approx(
        1e-14 * b * a * s * s * hd + 5e-13 * b * a * s * s + 1e-11 * b * a * s * hd
    )


def test_a_calibration_from_before_the_score_term_predicts_as_it_did(tmp_path):
    """A saved device model without ``attn_s_per_score`` / ``attn_head_tile`` (written before
    stop 23) keeps its two terms and the 64-wide tile it was fitted with."""
    store = tmp_path / "s"
    for n in REPLICAS:
        ingest_run(H100 / "runs" / n, system="h100-hf", store=store)
    for bench in (H100 / "gemm-bench").iterdir():
        shutil.copytree(bench, store / "h100-hf" / "runs" / bench.name)
    cal = SystemModel().fit(load_runs(system="h100-hf", store=store)).calibration_
    dm = cal.device_model
    assert dm.attn_head_tile == 32 and dm.attn_s_per_score is not None
    old = json.loads(json.dumps(cal.to_json()))["device_model"]
    del old["attn_s_per_score"], old["attn_head_tile"]
    legacy = DeviceModel.from_json(old)
    assert legacy.attn_head_tile == 64 and legacy.attn_s_per_score is None
    c1, c2 = legacy.attn_s_per_flop.value, legacy.attn_s_per_io.value
    want = c1 * 4 * 32 * 1024**2 * 128 + c2 * 4 * 32 * 1024 * 128  # hd 80 in a 128-wide tile
    assert float(D.attention_layer_s(legacy, 4, 1024, 2560, 32, 1, True)) == pytest.approx(want)
