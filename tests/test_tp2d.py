"""2D tensor parallelism and the science-transformer regime (seed 002), hand-worked."""

from __future__ import annotations

import numpy as np
import pytest
from calib.analytic import tp2d as T

B, L, E = 1, 1024, 1024
BLE = 2.0 * B * L * E  # bytes of one bf16 (b, l, e) activation


def test_1d_volumes_seed_table():
    # 4 collectives (AG, RS, AG, RS) of b l e, ring share (n-1)/n
    assert T.traffic_1d(B, L, E, 4) == pytest.approx(4 * BLE * 3 / 4)
    # per-GPU traffic of 1D TP does not shrink with n_t: 4 b l e in the limit
    assert T.traffic_1d(B, L, E, 1024) == pytest.approx(4 * BLE, rel=1e-3)


def test_2d_volumes_seed_table():
    t1, t2 = T.traffic_2d(B, L, E, 4, 4)
    assert t1 == pytest.approx(4 * BLE / 4 * 3 / 4)  # AG/RS of b (l/n2) e in the n1 group
    assert t2 == pytest.approx(2 * BLE / 4 * 3 / 4)  # K, V all-gathers of b l e / n1 in the n2 group
    # 16 GPUs: 1D moves 3.75 ble, 2D 4x4 1.125 ble: 3.33x less
    assert T.traffic_1d(B, L, E, 16) / (t1 + t2) == pytest.approx(3.75 / 1.125)
    # a 2 x 1 grid is 1D TP over 2
    assert sum(T.traffic_2d(B, L, E, 2, 1)) == pytest.approx(T.traffic_1d(B, L, E, 2))


def test_summa_volumes():
    e, f = 1024, 4096
    a, w = T.traffic_summa(B, L, e, f, 2, 2)
    ble = B * L * e
    act = (
        2 * 2 * ble / 2 + ble / 2 + ble / 2 + B * L * f / 2 + ble / 2
    ) * 0.5  # V1, V2, V3 activation panels
    wts = (e * e / 2 + e * f / 2 + f * e / 2 + 2 * ble / 2) * 0.5  # V1, V2, V3 weight panels + K, V
    assert a == pytest.approx(2 * act) and w == pytest.approx(2 * wts)


def test_where_2d_wins():
    # inside one NVLink domain, 16-way: a square-ish grid beats 1D by the traffic ratio
    g = T.best_grid(B, L, E, 16, 300.0, 25.0, domain=64)
    assert g["n1"] * g["n2"] == 16 and g["n2"] > 1 and g["speedup"] == pytest.approx(3.75 / 1.125)
    # 2 GPUs: nothing to gain over 1D with the n1 group (the 1 x 2 grid is context parallelism)
    assert T.best_grid(B, L, E, 2, 300.0, 25.0, domain=64)["speedup"] >= 1.0
    # 64-way over NVL8: 1D crosses the network for all its traffic, 2D keeps n1 = 8 inside
    g = T.best_grid(B, L, E, 64, 300.0, 25.0, domain=8)
    assert g["n1"] <= 8 and g["speedup"] > 5


def test_science_regime():
    """Seed 002: science transformers (moderate parameters, O(100K-1M) tokens) are attention-dominated,
    can cost more per token than a trillion-parameter LLM, and need parallelism beyond the NVLink domain."""
    vit = {"l": 250_000, "e": 8192, "L": 99}  # 'Large ViT (80B, 250K)': 12 e^2 L = 80e9 (assumed shape)
    gpt = {"l": 2048, "e": 25600, "L": 128}  # GPT3-1T
    assert T.attention_flop_share(vit["l"], vit["e"]) > 0.8
    assert T.attention_flop_share(gpt["l"], gpt["e"]) < 0.02
    p_gpt = 12 * 25600**2 * 128
    llm = T.flops_per_token(p_gpt, 128, 2048, 25600)
    small = 12 * 2048**2 * 20  # a 1B science model, e 2048, 20 layers
    s = np.array([1e6, 1e8])
    per_tok = T.flops_per_token(small, 20, s, 2048)
    assert per_tok[0] < llm < per_tok[1]  # O(1M) tokens: cheaper; O(100M): dearer than GPT3-1T
    hbm = 80.0
    assert T.min_model_parallel(1, gpt["l"], gpt["e"], gpt["L"], hbm) <= 8  # fits one NVL8 domain
    assert T.min_model_parallel(1, vit["l"], vit["e"], vit["L"], hbm) > 64  # spans many domains
