"""Collective time curves and the network-scaling forms eff_{g->n}.

Part of the calibration contract (:mod:`calibrate.calibration` re-exports everything).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from calib.calibrate import netmodel
from calib.calibrate.params import FitQuality, Param
from numpy.typing import ArrayLike

from calib.core.collective_names import busbw_factor
from calib.core.errors import InputError
from calib.core.strict import reject_unknown


@dataclass(frozen=True)
class Segment:
    """One message-size regime of a collective: time = alpha + bytes * factor / busbw.

    NCCL switches protocol (LL, LL128, Simple), algorithm (ring, tree) and channel count
    with the message size, so a measured curve is piecewise alpha-beta.  ``min_bytes`` and
    ``max_bytes`` are the smallest and largest measured sizes the segment was fitted on.
    """

    min_bytes: float
    max_bytes: float
    alpha_s: Param
    busbw_gbps: Param

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Segment:
        reject_unknown(d, cls, "segment")
        return cls(
            min_bytes=float(d["min_bytes"]),
            max_bytes=float(d["max_bytes"]),
            alpha_s=Param.from_json(d["alpha_s"]),
            busbw_gbps=Param.from_json(d["busbw_gbps"]),
        )


@dataclass(frozen=True)
class CollectiveCurve:
    """time(bytes) = alpha + bytes * busbw_factor(n) / busbw, at one measured scale.

    ``busbw_gbps`` is the large-message bus bandwidth (the plateau of the busbw curve)
    and ``alpha_s`` the small-message latency; algbw(bytes) = bytes / time(bytes).

    When ``segments`` is non-empty (a fitted curve) the time is piecewise: each size
    uses the segment whose measured range holds it; between two segments' ranges (where
    NCCL switches protocol or algorithm) log time is interpolated linearly in log size;
    sizes beyond the ends extrapolate the first or last segment.  ``alpha_s`` is then
    the first segment's latency and ``busbw_gbps`` the last segment's bandwidth.
    """

    collective: str
    n_gpus: int
    n_nodes: int
    gpus_per_node: int
    alpha_s: Param
    busbw_gbps: Param
    quality: FitQuality | None = None
    source: str = ""  # e.g. "nccl-tests setup=5", "trace", "calib-bench", "spec"
    segments: tuple[Segment, ...] = ()

    @property
    def span(self) -> str:
        return "intra" if self.n_nodes <= 1 else "inter"

    def parts_s(self, nbytes: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """(latency, bandwidth time) of the regime that times ``nbytes``, in seconds."""
        nbytes = np.asarray(nbytes, dtype=float)
        f = busbw_factor(self.collective, self.n_gpus)
        f = np.where(np.isnan(f), 1.0, f)
        if not self.segments:
            return (
                np.broadcast_to(self.alpha_s.value, nbytes.shape).astype(float),
                nbytes * f / (self.busbw_gbps.value * 1e9),
            )
        alphas = np.array([s.alpha_s.value for s in self.segments])
        invbw = np.array([1.0 / (s.busbw_gbps.value * 1e9) for s in self.segments])
        lo = np.array([s.min_bytes for s in self.segments])
        hi = np.array([s.max_bytes for s in self.segments])
        # index of the last segment starting at or below nbytes (0 below the first)
        i = np.clip(np.searchsorted(lo, nbytes, side="right") - 1, 0, len(lo) - 1)
        j = np.minimum(i + 1, len(lo) - 1)
        lat, bw = alphas[i], nbytes * f * invbw[i]
        # between two regimes' measured ranges: NCCL switches somewhere in the gap, so
        # interpolate log(time) linearly in log(size) from one regime's edge to the next
        gap = (nbytes > hi[i]) & (j > i)
        if gap.any():
            t_lo = alphas[i] + hi[i] * f * invbw[i]
            t_hi = alphas[j] + lo[j] * f * invbw[j]
            with np.errstate(divide="ignore", invalid="ignore"):
                w = np.log(nbytes / hi[i]) / np.log(lo[j] / hi[i])
            t_gap = np.exp((1 - w) * np.log(t_lo) + w * np.log(t_hi))
            share = np.where(gap, np.clip(lat / (lat + bw), 0.0, 1.0), 0.0)
            lat = np.where(gap, t_gap * share, lat)
            bw = np.where(gap, t_gap * (1 - share), bw)
        return lat, bw

    def time_s(self, nbytes: ArrayLike) -> np.ndarray:
        lat, bw = self.parts_s(nbytes)
        return lat + bw

    def algbw_gbps(self, nbytes: ArrayLike) -> np.ndarray:
        nbytes = np.asarray(nbytes, dtype=float)
        return nbytes / self.time_s(nbytes) / 1e9

    def busbw_curve_gbps(self, nbytes: ArrayLike) -> np.ndarray:
        return self.algbw_gbps(nbytes) * busbw_factor(self.collective, self.n_gpus)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CollectiveCurve:
        reject_unknown(d, cls, "collective curve")
        return cls(
            **{
                **d,
                "alpha_s": Param.from_json(d["alpha_s"]),
                "busbw_gbps": Param.from_json(d["busbw_gbps"]),
                "quality": FitQuality.from_json(d.get("quality")),
                "segments": tuple(Segment.from_json(x) for x in d.get("segments", ())),
            }
        )


@dataclass(frozen=True)
class NetworkScaling:
    """eff_{g->n}: large-message busbw at n GPUs over that at g GPUs, for n >= g.

    ``form`` names the function of n (see :func:`scaling_form`); ``params`` its fitted
    parameters.  Forms must stay in (0, 1] for n >= g and decrease monotonically, so
    that extrapolation beyond the measured scales stays physical.
    """

    collective: str
    form: str
    g_gpus: int
    params: Mapping[str, Param]
    quality: FitQuality | None = None
    measured: tuple[tuple[int, float], ...] = ()  # (n_gpus, eff) points the fit used
    segments: tuple[Segment, ...] = ()  # form "nccl": the ring step time against chunk size
    #: form "nccl": a ring's pipeline fill and drain against chunk size (calibrate.ringfill)
    fill_segments: tuple[Segment, ...] = ()

    def model_time_s(
        self, nbytes: ArrayLike, n_gpus: ArrayLike, *, shift: float = 0.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Form "nccl" only: (seconds, algorithm) across nodes (:func:`calibrate.ncclmodel.time_s`)."""
        from calib.calibrate import ncclmodel

        gpn = self.params["gpus_per_node"].value
        return ncclmodel.time_s(
            self.collective, self.params, self.segments, nbytes, n_gpus, gpn, shift=shift,
            fill=self.fill_segments,
        )  # fmt: skip

    def eff(self, n_gpus: ArrayLike) -> np.ndarray:
        n = np.maximum(np.asarray(n_gpus, dtype=float), self.g_gpus)
        if self.form == "nccl":
            s = self.params["s_ref_bytes"].value
            t = self.model_time_s(s, n)[0]
            t_g = self.model_time_s(s, float(self.g_gpus))[0]
            f = busbw_factor(self.collective, n) / busbw_factor(self.collective, float(self.g_gpus))
            return np.minimum(1.0, np.where(np.isfinite(f), f, 1.0) * t_g / t)
        p = {k: v.value for k, v in self.params.items()}
        p["g_gpus"] = float(self.g_gpus)  # the attribute is the base scale (readers may move it)
        return scaling_form(self.form)(n / self.g_gpus, p)

    def scale_time_s(
        self, lat_s: ArrayLike, bw_s: ArrayLike, n_gpus: ArrayLike, base_gpus: int
    ) -> np.ndarray | None:
        """Time at ``n_gpus`` of a collective measured at ``base_gpus`` as latency + bandwidth parts.

        Only the physical form (:mod:`calibrate.netmodel`) can move latency and bandwidth
        separately; other forms return None and the caller scales with eff alone.
        """
        if self.form != netmodel.FORM:
            return None
        p = {k: v.value for k, v in self.params.items()}
        n = np.maximum(np.asarray(n_gpus, dtype=float), base_gpus)
        return netmodel.scaled_time_s(lat_s, bw_s, n, float(base_gpus), p)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NetworkScaling:
        reject_unknown(d, cls, "network scaling")
        return cls(
            collective=d["collective"],
            form=d["form"],
            g_gpus=int(d["g_gpus"]),
            params={k: Param.from_json(v) for k, v in _mapping(d["params"], "network.params").items()},
            quality=FitQuality.from_json(d.get("quality")),
            measured=tuple(tuple(m) for m in d.get("measured", ())),
            segments=tuple(Segment.from_json(x) for x in d.get("segments", ())),
            fill_segments=tuple(Segment.from_json(x) for x in d.get("fill_segments", ())),
        )


def _mapping(v: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{what} must be an object, got {type(v).__name__}")
    return v


def _form_log(r: np.ndarray, p: Mapping[str, float]) -> np.ndarray:
    # eff = 1 / (1 + c * log2(r)): each doubling of the job adds a constant relative cost
    # (one more level of the network hierarchy / ring latency); c >= 0.
    return 1.0 / (1.0 + p["c"] * np.log2(r))


def _form_constant(r: np.ndarray, p: Mapping[str, float]) -> np.ndarray:
    return np.ones_like(r)


_FORMS = {"log": _form_log, "constant": _form_constant, netmodel.FORM: netmodel.form_ring_tree}


def scaling_form(name: str):
    """The eff_{g->n} form ``name``; calibrate may register more via :func:`register_form`."""
    try:
        return _FORMS[name]
    except KeyError:
        raise InputError(
            None, f"unknown network scaling form '{name}' (known: {', '.join(_FORMS)})"
        ) from None


def register_form(name: str, fn) -> None:
    _FORMS[name] = fn


# Collectives without their own curve borrow one with the same traffic pattern.
