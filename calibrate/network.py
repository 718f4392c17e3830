"""Fit eff_{g->n} with the physical model of :mod:`calibrate.netmodel`.

At each measured inter-node scale n the large-message regime of a collective (the
contiguous tail of sizes whose bus bandwidth is at least :data:`TAIL_FRACTION` of that
scale's best) is fitted, all scales at once, by

    t(n, S) = lat_c + lambda * k_c * (n - g_c) + (S * factor_c(g_c) / busbw_c) * V_c(n) / V_c(g_c)

with bounded least squares on relative residuals and the covariance of the Jacobian.
The per-step latency lambda belongs to the network path, not to the collective, so the
ring collectives (all-reduce, all-gather, reduce-scatter) share one lambda; all-to-all
(n-1 concurrent peers, not a ring) has its own.  Each collective's bandwidth is shared
by all its scales -- the NICs carry the same bytes per node whatever n -- which the
per-scale residuals test.  lambda is the only shape parameter.  When no collective of a
group has two inter-node scales, lambda is unidentifiable and set to its upper bound
from the small-message latency (alpha >= lambda * steps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
from calib.calibrate import netmodel
from calib.calibrate.calibration import (
    FITTED,
    FIXED,
    UNIDENTIFIABLE,
    CollectiveCurve,
    FitQuality,
    NetworkScaling,
    Param,
)
from calib.calibrate.collectives import SizeSeries
from scipy.optimize import least_squares

from calib.core.collective_names import ALLGATHER, ALLREDUCE, ALLTOALL, REDUCESCATTER, busbw_factor
from calib.core.errors import InputError

TAIL_FRACTION = 0.75
RING = (ALLREDUCE, ALLGATHER, REDUCESCATTER)


@dataclass(frozen=True)
class _Block:
    """One collective's large-message points over its inter-node scales."""

    collective: str
    pairs: tuple[tuple[CollectiveCurve, SizeSeries], ...]
    n: np.ndarray
    S: np.ndarray
    T: np.ndarray
    g: int
    gpn: int
    k: float
    vol: np.ndarray  # V(n) / V(g) per point
    f_g: float
    s_ref: float


def _tail(series: SizeSeries) -> np.ndarray:
    """Mask of the contiguous large-size tail with busbw >= TAIL_FRACTION x the scale's best."""
    busbw = series.bytes / series.time_s
    ok = busbw >= TAIL_FRACTION * busbw.max()
    start = len(ok) - int(np.argmin(ok[::-1])) if not ok.all() else 0
    start = min(start, max(len(ok) - 3, 0))
    mask = np.zeros(len(ok), bool)
    mask[start:] = True
    return mask


def _block(collective: str, pairs: Sequence[tuple[CollectiveCurve, SizeSeries]]) -> _Block:
    pairs = tuple(sorted(pairs, key=lambda p: p[0].n_gpus))
    g, gpn = pairs[0][0].n_gpus, pairs[0][0].gpus_per_node
    ns, Ss, Ts = [], [], []
    for curve, series in pairs:
        m = _tail(series)
        ns.append(np.full(int(m.sum()), float(curve.n_gpus)))
        Ss.append(series.bytes[m])
        Ts.append(series.time_s[m])
    n = np.concatenate(ns)
    return _Block(
        collective=collective,
        pairs=pairs,
        n=n,
        S=np.concatenate(Ss),
        T=np.concatenate(Ts),
        g=g,
        gpn=gpn,
        k=netmodel.steps_per_rank(collective),
        vol=netmodel.nic_volume(collective, n, gpn) / netmodel.nic_volume(collective, g, gpn),
        f_g=float(busbw_factor(collective, g)),
        s_ref=float(min(s.bytes.max() for _, s in pairs)),
    )


def fit_networks(
    pairs: Mapping[str, Sequence[tuple[CollectiveCurve, SizeSeries]]], *, where: str
) -> dict[str, NetworkScaling]:
    """eff_{g->n} per collective from its fitted (curve, series) pairs; inter-node scales only."""
    inter = {c: [p for p in ps if p[0].n_nodes > 1] for c, ps in sorted(pairs.items())}
    inter = {c: ps for c, ps in inter.items() if ps}
    ring = [c for c in inter if c in RING]
    groups = ([ring] if ring else []) + [[c] for c in inter if c not in RING]
    out: dict[str, NetworkScaling] = {}
    for group in groups:
        out.update(_fit_group([_block(c, inter[c]) for c in group], where=where))
    return out


def _fit_group(blocks: list[_Block], *, where: str) -> dict[str, NetworkScaling]:
    multi = any(len(b.pairs) > 1 for b in blocks)

    def unpack(x: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        lam = x[0] if multi else 0.0
        rest = x[1:] if multi else x
        return lam, rest[0::2], rest[1::2]

    def resid(x: np.ndarray) -> np.ndarray:
        lam, lat, inv = unpack(x)
        return np.concatenate(
            [
                (lat[i] + lam * b.k * (b.n - b.g) + b.S * b.f_g * inv[i] * 1e-9 * b.vol) / b.T - 1.0
                for i, b in enumerate(blocks)
            ]
        )

    x0, lower, scale = [], [], []
    if multi:
        x0, lower, scale = [1e-6], [0.0], [1e-6]
    for b in blocks:
        base = b.pairs[0][0]
        inv0 = 1.0 / max(base.busbw_gbps.value, 1e-3)
        x0 += [1e-4, inv0]
        lower += [0.0, 1e-9]
        scale += [1e-4, inv0]
    sol = least_squares(resid, np.array(x0), bounds=(lower, np.inf), x_scale=scale, method="trf")
    n_pts = int(sum(len(b.T) for b in blocks))
    names = ", ".join(b.collective for b in blocks)
    if not sol.success or not np.all(np.isfinite(sol.x)):
        raise InputError(
            where,
            f"eff_{{g->n}} ({names}): per-step latency fit did not converge on {n_pts} points "
            f"({sol.message})",
        )
    r = sol.fun
    dof = len(r) - len(sol.x)
    cov = np.linalg.pinv(sol.jac.T @ sol.jac) * float(r @ r) / dof if dof > 0 else None
    se = np.sqrt(np.clip(np.diag(cov), 0, None)) if cov is not None else np.full(len(sol.x), np.nan)
    lam, lat, inv = unpack(sol.x)
    se_lam = se[0] if multi else np.nan
    se_rest = se[1:] if multi else se
    lam_param = _lambda_param(blocks, multi, lam, se_lam)
    out = {}
    offset = 0
    for i, b in enumerate(blocks):
        rb = r[offset : offset + len(b.T)]
        offset += len(b.T)
        out[b.collective] = _scaling(
            b, lam_param, lat[i], se_rest[2 * i], inv[i], se_rest[2 * i + 1], rb, lam
        )
    return out


def _lambda_param(blocks: list[_Block], multi: bool, lam: float, se: float) -> Param:
    names = "+".join(b.collective for b in blocks)
    if multi:
        scales = sorted({int(c.n_gpus) for b in blocks for c, _ in b.pairs})
        if lam <= 1e-15:
            return Param(
                0.0,
                unit="s",
                status=FITTED,
                note=f"{names}: at bound 0, no latency growth resolved between {scales} GPUs",
            )
        return Param(
            float(lam),
            stderr=float(se) if np.isfinite(se) else None,
            unit="s",
            status=FITTED,
            note=f"per-step latency shared by {names}, fitted across {scales} GPUs",
        )
    bounds = [b.pairs[0][0].alpha_s.value / (b.k * max(b.g - 1, 1)) for b in blocks]
    b = blocks[int(np.argmin(bounds))]
    return Param(
        float(min(bounds)),
        unit="s",
        status=UNIDENTIFIABLE,
        note=f"one inter-node scale ({b.g} GPUs): per-step latency not identifiable; value is the upper bound "
        f"alpha_small/(k(g-1)) from the {b.collective} small-message latency "
        f"{b.pairs[0][0].alpha_s.value * 1e6:.1f} us; measure a second scale to fit it",
    )


def _scaling(
    b: _Block, lam: Param, lat: float, se_lat: float, inv: float, se_inv: float, r: np.ndarray, lam_fit: float
) -> NetworkScaling:
    bw_time = b.s_ref * b.f_g * inv * 1e-9
    params = {
        "g_gpus": Param(float(b.g), status=FIXED, note="base scale: smallest measured inter-node job"),
        "gpus_per_node": Param(float(b.gpn), status=FIXED, note="from the nccl-tests rank lines"),
        "steps_per_rank": Param(b.k, status=FIXED, note="ring steps per rank: 2(n-1) all-reduce, n-1 others"),
        "nic_volume": Param(
            1.0 if b.collective == ALLTOALL else 0.0,
            status=FIXED,
            note="all-to-all: every byte for another node crosses the NIC"
            if b.collective == ALLTOALL
            else "NIC bytes per node follow the ring bus factor",
        ),
        "tree_eff": Param(
            netmodel.NCCL_TREE_EFF if b.collective == ALLREDUCE else 0.0,
            status=FIXED,
            note="NCCL tuner's tree/ring bandwidth ratio (not identifiable at few nodes, where the ring "
            "wins); the tree takes over when the ring's latency costs more"
            if b.collective == ALLREDUCE
            else "no tree algorithm for this collective",
        ),
        "lambda_s": lam,
        "lat_ref_s": Param(
            float(lat),
            stderr=_finite(se_lat),
            unit="s",
            status=FITTED,
            note=f"latency of the large-message regime at {b.g} GPUs",
        ),
        "bw_time_ref_s": Param(
            float(bw_time),
            stderr=_finite(b.s_ref * b.f_g * se_inv * 1e-9),
            unit="s",
            status=FITTED,
            note=f"bandwidth time of {b.s_ref:.0f} B at {b.g} GPUs "
            f"(busbw {1.0 / inv:.2f} GB/s shared by all scales)",
        ),
        "s_ref_bytes": Param(b.s_ref, unit="B", status=FIXED, note="reference large message of eff_{g->n}"),
    }
    pred_t = b.T * (1.0 + r)
    y, yhat = np.log(b.T), np.log(pred_t)
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    per_scale = "; ".join(
        f"{int(n)} GPUs max |err| {np.max(np.abs(r[b.n == n])):.3f}" for n in np.unique(b.n)
    )
    q = FitQuality(
        n_points=int(len(r)),
        r2=1.0 - float(np.sum((y - yhat) ** 2)) / ss_tot if ss_tot > 0 else None,
        rmse=float(np.sqrt(np.mean(r**2))),
        max_abs_rel_err=float(np.max(np.abs(r))),
        residuals=tuple(float(x) for x in -r / (1.0 + r)),  # busbw pred/meas - 1
        note=f"joint fit of the large-message regime (busbw >= {TAIL_FRACTION:.0%} of each scale's best); {per_scale}",
    )
    return NetworkScaling(
        collective=b.collective,
        form=netmodel.FORM,
        g_gpus=b.g,
        params=params,
        quality=q,
        measured=_measured_eff(b),
    )


def _measured_eff(b: _Block) -> tuple[tuple[int, float], ...]:
    out, base = [], None
    for curve, series in b.pairs:
        i = np.flatnonzero(series.bytes == b.s_ref)
        if not len(i):
            continue
        busbw = b.s_ref * float(busbw_factor(b.collective, curve.n_gpus)) / series.time_s[i[0]]
        base = busbw if base is None else base
        out.append((int(curve.n_gpus), float(busbw / base)))
    return tuple(out)


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def predict_busbw_gbps(
    ns: NetworkScaling, n_gpus: np.ndarray, *, lambda_s: float | None = None, ring_only: bool = False
) -> np.ndarray:
    """Model large-message busbw (GB/s) at ``n_gpus`` for the reference size, optionally varied."""
    p = {k: v.value for k, v in ns.params.items()}
    if lambda_s is not None:
        p["lambda_s"] = max(lambda_s, 0.0)
    if ring_only:
        p["tree_eff"] = 0.0
    g = p["g_gpus"]
    n = np.maximum(np.asarray(n_gpus, dtype=float), g)
    t = netmodel.scaled_time_s(p["lat_ref_s"], p["bw_time_ref_s"], n, g, p)
    return p["s_ref_bytes"] * busbw_factor(ns.collective, n) / t / 1e9


def with_lambda(ns: NetworkScaling, lam: float) -> NetworkScaling:
    return replace(ns, params={**ns.params, "lambda_s": replace(ns.params["lambda_s"], value=lam)})
