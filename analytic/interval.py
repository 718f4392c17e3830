"""90 % prediction intervals of iteration times from a fitted device model (a validation
fit's: :mod:`analytic.fit_interval`).

The interval has two parts, both from the calibration's own data: the fitted terms'
standard errors, propagated by re-evaluating the strategies with each term moved up by
one standard error (finite differences), and the leave-one-run-out errors of the traced
runs, which hold everything the terms' errors miss (the model's own structure).  They
combine as a Student-t prediction interval
(:func:`calib.calibrate.device_model.interval_half_width`).  Communication and the
transfer to another device add errors the traced runs cannot show; the notes say so.

One part of a transfer's error is bounded by physics, and the interval holds it: a
memory-bound kernel runs at the lower of its HBM limit and the rate its SMs issue its
instructions, so on another device its bandwidth moves by somewhere between the compute
ratio and the HBM ratio (:func:`sm_bound_transfer`).  Kernel benches on an H100 and an
H200 (same SMs and clocks, 1.43x the HBM bandwidth; fixtures/traces/h100b, h200b) put
nine element-wise kinds and the fused AdamW step at 0.99-1.44x.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from calib.calibrate.device_check import band, loo_rel_errors
from calib.calibrate.device_fit import host_free, overhead_is_lower_bound
from calib.calibrate.device_model import interval_half_width, perturbations

LEVEL = 0.90


def sm_bound_transfer(system, dm):
    """``dm`` moved to ``system``'s device as :attr:`System.device_model` moves it, except that
    the memory-bound bandwidths move with the compute ratio (kernels bound by their SMs'
    instruction issue, not the HBM), or None when the two ratios agree.  The compute ratio
    stands for the SMs' issue rate (stated: within one architecture both are SMs x clock)."""
    moved = system.device_model
    fs = moved.gemm.rate_tflops.value / dm.gemm.rate_tflops.value
    bs = moved.stream_tbps.value / dm.stream_tbps.value
    if abs(fs / bs - 1.0) < 1e-6:
        return None
    alt = dm.on(moved.peak_tflops, dm.hbm_tbps * fs, flops_ratio=fs)
    return replace(alt, device=system.hw.device)  # already on the target: not moved again


def iter_interval(model, system, st, iter_s) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """(lower, upper, notes) of each strategy's iteration time, or None without a device model
    or a validation fit (analytic.fit_interval)."""
    from calib.analytic.fit_interval import validation_interval
    from calib.analytic.timemodel import comm_times, evaluate

    dm = system.cal.device_model
    if dm is None or not dm.families:
        return validation_interval(model, system, st, iter_s)
    # the device model's terms do not touch the network: one set of collective times serves
    # every re-evaluation below (most of evaluate's cost for a few strategies)
    comm = comm_times(model, system, st)

    def iter_with(other_dm) -> np.ndarray:
        """The strategies' iteration seconds with ``other_dm`` in place of the device model."""
        other = replace(system, cal=replace(system.cal, device_model=other_dm))
        return np.asarray(evaluate(model, other, st, comm=comm, lean=True)["iter_s"], dtype=float)

    it = np.asarray(iter_s, dtype=float)
    var = np.zeros_like(it)
    for p in perturbations(dm):
        var = var + (iter_with(p) / it - 1.0) ** 2
    loo = loo_rel_errors(dm, dm.compiled)
    half = interval_half_width(np.sqrt(var), loo, LEVEL)
    moved = system.device_model is not dm  # the traced host's per-operator cost, carried over
    # a host-bound step may be as fast as its device time on another host: the host's cost
    # per operator is the traced host's, and two hosts of the same H100 machine issued the
    # same run 25 % apart (fixtures/traces/h100b); device-bound steps are unchanged
    floor = iter_with(host_free(dm))
    notes = [
        f"{LEVEL:.0%} interval (iter_s_lo..iter_s_hi): the device model's fitted terms' standard errors"
        f" and its leave-one-run-out errors on {len(loo)} traced run(s) (Student t)"
    ]
    if len(loo) < 2:
        notes.append("fewer than 2 leave-one-run-out errors: the interval holds the parameters' errors only")
    if moved:
        notes.append(
            f"transferred from {dm.device} to {system.hw.device}: the interval does not hold the compute"
            " transfer's error"
        )
    if np.any(floor < it * (1.0 - 1e-9)):
        why = (
            "the host's cost per operator is the traced machine's (this machine's host is unmeasured)" if moved
            else "no host-bound traced run fixed the profiler overhead" if overhead_is_lower_bound(dm)
            else "the host's cost per operator is the traced host's (another host of the same GPU model issued"
            " a host-bound run 25 % faster)"
        )  # fmt: skip
        notes.append(
            f"{why}: host-bound steps may be as fast as their device time (the interval's lower end)"
        )
    lo, hi = band(it, half, floor)
    if np.any(half >= 1.0):
        notes.append(
            f"the interval's half-width reaches {100.0 * float(np.max(half)):.0f} % of the step (few traced runs"
            " or terms one run cannot identify): unbounded below, shown from 0; more traced runs narrow it"
        )
    alt = sm_bound_transfer(system, dm) if moved else None
    if alt is not None:  # the memory-bound kernels' other physical limit
        it_alt = iter_with(alt)
        lo, hi = np.minimum(lo, np.maximum(it_alt * (1.0 - half), 0.0)), np.maximum(hi, it_alt * (1.0 + half))
        notes.append(
            "memory-bound kernels move between the compute ratio and the HBM ratio (each runs at the lower of"
            " its HBM and its SM issue limits): the interval holds both ends"
        )
    return lo, hi, notes
