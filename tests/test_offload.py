"""Offload (seeds 000/001, Calculon): hand-worked traffic and memory, and seed 001's takeaways."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from calib.analytic.offload import Offload, offload_terms
from calib.analytic.specs import ModelSpec, load_hardware
from calib.analytic.strategy import Strategies

from calib.core.errors import InputError

ROOT = Path(__file__).parents[1]
MODEL = ModelSpec("m", 1024, 8, 8, 1024, 1000)  # d 1024, 8 layers, 8 heads, s 1024
ST = Strategies.of(tp=1, pp=1, dp=1, micro_batch=1, global_batch=4)  # m = 4 micro-batches
GB = 1e9
# a hand-made time-model result: 4 micro-batches x 8 layers, 0.32 s of compute -> 10 ms per layer
R = {"compute_s": 0.32, "iter_s": 0.5, "mem_weights_bytes": 8 * GB, "mem_grads_bytes": 8 * GB,
     "mem_optimizer_bytes": 48 * GB, "mem_activations_bytes": 16 * GB}  # fmt: skip
HW = replace(load_hardware("dgx-h100"), offload_gb=1000.0, offload_gbps=10.0)


def test_weight_offload_hand_worked():
    o = offload_terms(MODEL, ST, R, Offload.of(weights=True), HW)
    W = 2 * 12 * 1024**2  # fp16 bytes of one layer's 12 d^2 weights
    # forward a third of the layer time, backward two thirds (no recompute): 3.33 ms, 6.67 ms
    t_f, t_b = (
        0.01 * (24 * 1024**2 * 1024 * 1 + 4 * 1024**2 * 1024) / (3 * (24 * 1024**3 + 4 * 1024**3)),
        None,
    )
    t_f = 0.01 / 3
    t_b = 0.02 / 3
    assert o["offload_required_gbps"] == pytest.approx(max(W / t_f, 2 * W / t_b) / GB)
    # 2 of 8 layers of weights and gradients stay in HBM, 6 of 8 go out
    assert o["offload_bytes"] == pytest.approx(16 * GB * 6 / 8)
    assert o["hbm_bytes"] == pytest.approx(16 * GB * 2 / 8 + 48 * GB + 16 * GB + HW.runtime_reserve_gb * GB)
    exposed = 4 * 8 * (max(0, W / 10e9 - t_f) + max(0, 2 * W / 10e9 - t_b))
    assert o["offload_exposed_s"] == pytest.approx(exposed)
    assert o["iter_offload_s"] == pytest.approx(0.5 + exposed)


def test_optimizer_and_activation_offload_hand_worked():
    o = offload_terms(MODEL, ST, R, Offload.of(optimizer=True), HW)
    assert o["offload_bytes"] == pytest.approx(48 * GB)
    assert o["offload_exposed_s"] == pytest.approx(14 * (48 * GB / 12) / 10e9)  # states streamed in and out
    a = offload_terms(MODEL, ST, R, Offload.of(activations=True), HW)
    # Korthikanti: s b d (34 + 5 a s / d) bytes per layer, two layers kept
    layer_a = 1024 * 1024 * (34 + 5 * 8 * 1024 / 1024)
    assert a["offload_bytes"] == pytest.approx(16 * GB - 2 * layer_a)
    # unlimited bandwidth hides everything
    free = offload_terms(MODEL, ST, R, Offload.of(True, True, True), replace(HW, offload_gbps=0.0))
    assert free["offload_exposed_s"] == 0.0


def test_offload_spec_fields_are_checked():
    with pytest.raises(InputError, match="offload_gbps"):
        replace(HW, offload_gbps=-1.0)


@pytest.fixture(scope="module")
def seed001():
    spec = importlib.util.spec_from_file_location("seed001", ROOT / "benchmarks" / "seed001_offload.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_seed001_table_ii_parameter_counts(seed001):
    """Table II's names are the parameter counts: 12 d^2 l within 5 %."""
    for name, (d, L) in seed001.TABLE_II.items():
        assert 12 * d * d * L / 1e12 == pytest.approx(float(name[:-1]), rel=0.08)


def test_seed001_takeaways(seed001):
    # 1: a ~100T model needs ~1 TiB of offload memory per GPU at ~100 GB/s
    r, _, _ = seed001.best("96T", 16384, 270.0, 8)
    assert 0.5 * 1024 < r["offload_gib"] < 2 * 1024 and 50 < r["offload_required_gbps"] < 200
    # 2: larger LLMs need larger HBM even with offload memory: 96T does not run on 80 GB
    assert (
        seed001.best("96T", 16384, 80.0, 8)[0] is None and seed001.best("1T", 16384, 80.0, 8)[0] is not None
    )
    # 4: 1T scales worse to 16k GPUs than to 4k (MFU)
    assert (
        seed001.best("1T", 16384, 80.0, 8)[0]["mfu_offload"]
        < seed001.best("1T", 4096, 80.0, 8)[0]["mfu_offload"]
    )
    # 6: TP is held to the NVLink domain: the big model takes all of it
    assert r["tp"] == 8
    # the offload efficiency grows with bandwidth (seed 001's bandwidth panel)
    lo, hi = (
        seed001.best("96T", 16384, 270.0, 8, gbps=25.0)[0],
        seed001.best("96T", 16384, 270.0, 8, gbps=400.0)[0],
    )
    assert lo["iter_offload_s"] > hi["iter_offload_s"]
    assert np.isfinite(hi["iter_offload_s"])
