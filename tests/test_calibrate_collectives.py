"""Collective curves fitted to real Polaris nccl-tests logs (setup 5, NCCL 2.18 + 2.21 pooled)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from calib.calibrate.calibration import FITTED, UNIDENTIFIABLE, Calibration
from calib.calibrate.collectives import SizeSeries, busbw_rel_errors, fit_series, heldout_errors, size_series
from calib.ingest.nccl_tests import ingest_nccl_tests

from tests.conftest import FIXTURES

MIB = 2**20


@pytest.fixture(scope="module")
def samples() -> pd.DataFrame:
    _, tables = ingest_nccl_tests([FIXTURES / "nccl-tests"], name="polaris", system="polaris")
    return tables["samples"]


@pytest.fixture(scope="module")
def setup5(samples) -> list[SizeSeries]:
    return size_series(samples[samples["setup"] == 5], "nccl-tests setup=5")


def test_series_are_medians_of_the_log_lines(samples, setup5):
    ar8 = next(s for s in setup5 if s.collective == "allreduce" and s.n_nodes == 8)
    assert (ar8.n_gpus, ar8.gpus_per_node, len(ar8.bytes)) == (32, 4, 29)
    rows = samples[
        (samples["setup"] == 5)
        & (samples["collective"] == "allreduce")
        & (samples["nnodes"] == 8)
        & (samples["bytes"] == 2**30)
    ]
    times = np.concatenate([rows["time_oop_us"], rows["time_ip_us"]])  # 2 logs x (oop, ip)
    assert len(times) == 4
    assert ar8.time_s[-1] == pytest.approx(np.median(times) * 1e-6)


def test_fit_reproduces_busbw_within_10_percent_from_1_mib(setup5):
    assert len(setup5) == 6  # allreduce, allgather, alltoall at 2 and 8 nodes
    worst = {}
    for s in setup5:
        curve = fit_series(s)
        err = busbw_rel_errors(curve, s)
        big = s.bytes >= MIB
        worst[(s.collective, s.n_nodes)] = float(np.max(np.abs(err[big])))
        assert curve.quality.max_abs_rel_err == pytest.approx(np.max(np.abs(err)))
        assert curve.busbw_gbps.status == FITTED and curve.busbw_gbps.stderr > 0
    print("max |busbw error| >= 1 MiB:", {k: f"{v:.1%}" for k, v in worst.items()})
    assert max(worst.values()) < 0.10, worst


def test_plateau_is_the_measured_large_message_busbw(samples, setup5):
    for s in setup5:
        curve = fit_series(s)
        rows = samples[
            (samples["setup"] == 5)
            & (samples["collective"] == s.collective)
            & (samples["nnodes"] == s.n_nodes)
            & (samples["bytes"] == 2**30)
        ]
        measured = float(np.median(np.concatenate([rows["busbw_oop_gbps"], rows["busbw_ip_gbps"]])))
        assert curve.busbw_curve_gbps(2**30) == pytest.approx(measured, rel=0.03)


def test_heldout_every_other_size(setup5):
    """Fit on sizes 0, 2, 4, ...; predict 1, 3, 5, ...  Reported per regime.

    In the bandwidth regime (>= 64 MiB) every skipped size is within 15 %; across all
    sizes >= 1 MiB the median is well within 15 %, but single sizes in NCCL's protocol
    and channel transitions (1-32 MiB) miss by up to ~31 %: the measured busbw there is
    not monotone in size, so no interpolation of neighbours can predict them.
    """
    big_band, mib_band = [], []
    for s in setup5:
        train = np.arange(len(s.bytes)) % 2 == 0
        err = heldout_errors(s)
        b = s.bytes[~train]
        big_band.append(err[b >= 64 * MIB])
        mib_band.append(err[b >= MIB])
        assert fit_series(s).quality.heldout_max_abs_rel_err == pytest.approx(np.max(np.abs(err)))
    big_band, mib_band = np.abs(np.concatenate(big_band)), np.abs(np.concatenate(mib_band))
    print(
        f"held-out >= 64 MiB: max {big_band.max():.1%}; >= 1 MiB: median {np.median(mib_band):.1%}, "
        f"max {mib_band.max():.1%}"
    )
    assert big_band.max() < 0.15
    assert np.median(mib_band) < 0.15
    assert mib_band.max() < 0.35  # the transition band, reported in docs/calibrate.md


def test_one_message_size_is_unidentifiable_not_noise():
    s = SizeSeries("allreduce", 32, 8, 4, np.array([2.0**30]), np.array([0.057]), 4, "test")
    c = fit_series(s)
    assert c.alpha_s.status == UNIDENTIFIABLE and c.busbw_gbps.status == UNIDENTIFIABLE
    assert c.alpha_s.stderr is None and c.busbw_gbps.stderr is None
    assert "cannot be separated" in c.busbw_gbps.note
    # the value kept is the measured busbw (a lower bound on the plateau), not a fitted number
    assert c.busbw_gbps.value == pytest.approx(2**30 * 2 * 31 / 32 / 0.057 / 1e9)


def test_two_sizes_solve_exactly_without_uncertainty():
    S = np.array([2.0**28, 2.0**30])
    f = 2 * 31 / 32
    T = 100e-6 + S * f / 36e9
    c = fit_series(SizeSeries("allreduce", 32, 8, 4, S, T, 4, "test"))
    assert c.alpha_s.value == pytest.approx(100e-6) and c.busbw_gbps.value == pytest.approx(36.0)
    assert c.alpha_s.stderr is None and "no uncertainty" in c.alpha_s.note


def test_segmented_curve_round_trips_through_json(tmp_path, setup5):
    curves = tuple(fit_series(s) for s in setup5)
    cal = Calibration(system="t", gpus_per_node=4, peak_tflops=None, collectives=curves)
    back = Calibration.load(cal.save(tmp_path / "t.calib.json"))
    sizes = np.logspace(2, 30, 57, base=2)
    for a, b in zip(cal.collectives, back.collectives):
        assert len(a.segments) == len(b.segments) > 1
        np.testing.assert_allclose(a.time_s(sizes), b.time_s(sizes))
