"""The calibration: the contract between calibrate (writes it) and analytic (reads it).

A :class:`Calibration` is plain data (JSON, versioned) in the scikit-learn spirit:
every fitted quantity is a :class:`Param` with its uncertainty and status, every fit
carries its :class:`FitQuality`, and the object can evaluate itself (curves, collective
times) so that analytic never re-implements the fitted forms.

Contract for readers (analytic, reports) -- these names and signatures are stable:

* ``Calibration.load(path)`` / ``.save(path)`` / ``.to_json()`` / ``.from_json(d)``
* ``Calibration.defaults(...)`` -- a calibration from a hardware spec alone, every
  parameter marked ``status="default"`` with the reason in ``note``
* ``.gemm_efficiency(flops_per_gemm)`` -- achieved / peak matmul FLOP/s
* ``.k1(flops_per_gemm)`` -- kernel-execution share of compute time (seed 004 k1)
* ``.k2(flops_per_gemm)`` -- transformer-kernel share of kernel time (seed 004 k2)
* ``.collective_time_s(collective, nbytes, n_gpus, gpus_per_node=None)`` -- seconds,
  vectorised over ``nbytes`` and ``n_gpus``; ``nbytes`` in nccl-tests "size" convention
* ``.eff(collective, n_gpus)`` -- eff_{g->n}: large-message bus bandwidth at n GPUs
  over that at the calibration's base scale g (seed 004)
* ``.peak_tflops``, ``.gpus_per_node``, ``.dispatch`` (per-operator host costs)

"Work per operator" (the x of k1, k2 and GEMM efficiency) is the mean FLOPs of one
matmul operator: small matmuls leave the device waiting on the host (dispatch-bound),
large ones keep it busy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from calibrate import netmodel
from ingest.collective_names import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE,
    REDUCESCATTER,
    SENDRECV,
    busbw_factor,
    canonical,
)
from ingest.errors import InputError

CALIBRATION_FORMAT = "calib.calibration"
CALIBRATION_SCHEMA_VERSION = 1

FITTED, DEFAULT, UNIDENTIFIABLE, FIXED = "fitted", "default", "unidentifiable", "fixed"
STATUSES = (FITTED, DEFAULT, UNIDENTIFIABLE, FIXED)


@dataclass(frozen=True)
class Param:
    """One number with its uncertainty and where it came from.

    ``status``: ``fitted`` (from data, ``stderr`` from the fit covariance), ``default``
    (no data; ``note`` says which default and why), ``unidentifiable`` (data present but
    cannot determine it, e.g. one message size; ``value`` is the fallback default),
    ``fixed`` (held constant by the model form).
    """

    value: float
    stderr: float | None = None
    unit: str = ""
    status: str = FITTED
    note: str = ""
    ci95: tuple[float, float] | None = None

    @classmethod
    def default(cls, value: float, unit: str, note: str) -> Param:
        return cls(value=float(value), unit=unit, status=DEFAULT, note=note)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Param:
        ci = d.get("ci95")
        return cls(**{**d, "ci95": tuple(ci) if ci is not None else None})


@dataclass(frozen=True)
class FitQuality:
    """How well a fit describes its data."""

    n_points: int
    r2: float | None = None
    rmse: float | None = None  # in the unit of the fitted quantity
    max_abs_rel_err: float | None = None
    heldout_max_abs_rel_err: float | None = None  # fit on half the points, error on the rest
    residuals: tuple[float, ...] = ()  # relative residuals (pred/meas - 1) in point order
    note: str = ""

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> FitQuality | None:
        if d is None:
            return None
        return cls(**{**d, "residuals": tuple(d.get("residuals", ()))})


@dataclass(frozen=True)
class Saturating:
    """y(x) = y_max / (1 + (x_half / x) ** gamma): rises with x and saturates at y_max.

    The form of a dispatch-limited quantity: with a fixed host cost per operator c and
    device time per operator proportional to x, the device-busy share is
    1 / (1 + c' / x) -- gamma = 1.  ``gamma`` is fitted when the data support it.
    """

    y_max: Param
    x_half: Param
    gamma: Param
    x_unit: str = "FLOP"
    quality: FitQuality | None = None

    def __call__(self, x: ArrayLike) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            ratio = np.where(x > 0, self.x_half.value / np.where(x > 0, x, 1.0), np.inf)
            return self.y_max.value / (1.0 + ratio**self.gamma.value)

    @classmethod
    def constant(cls, value: float, unit: str, note: str, x_unit: str = "FLOP") -> Saturating:
        return cls(
            y_max=Param.default(value, unit, note),
            x_half=Param(0.0, unit=x_unit, status=FIXED, note="constant form"),
            gamma=Param(1.0, status=FIXED, note="constant form"),
            x_unit=x_unit,
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Saturating:
        return cls(
            y_max=Param.from_json(d["y_max"]),
            x_half=Param.from_json(d["x_half"]),
            gamma=Param.from_json(d["gamma"]),
            x_unit=d.get("x_unit", "FLOP"),
            quality=FitQuality.from_json(d.get("quality")),
        )


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

    def eff(self, n_gpus: ArrayLike) -> np.ndarray:
        n = np.maximum(np.asarray(n_gpus, dtype=float), self.g_gpus)
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
        return cls(
            collective=d["collective"],
            form=d["form"],
            g_gpus=int(d["g_gpus"]),
            params={k: Param.from_json(v) for k, v in d["params"].items()},
            quality=FitQuality.from_json(d.get("quality")),
            measured=tuple(tuple(m) for m in d.get("measured", ())),
        )


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
_FALLBACK = {
    REDUCESCATTER: (ALLGATHER, ALLREDUCE),
    ALLGATHER: (REDUCESCATTER, ALLREDUCE),
    ALLTOALL: (ALLGATHER, ALLREDUCE),
    REDUCE: (BROADCAST, ALLREDUCE),
    BROADCAST: (REDUCE, ALLREDUCE),
    SENDRECV: (ALLGATHER, ALLREDUCE),
    ALLREDUCE: (REDUCESCATTER, ALLGATHER),
}


@dataclass(frozen=True)
class Calibration:
    """A system's fitted factors.  See the module docstring for the reader contract."""

    system: str
    gpus_per_node: int
    peak_tflops: float | None  # dense peak used as the GEMM-efficiency denominator
    device: str | None = None
    collectives: tuple[CollectiveCurve, ...] = ()
    network: Mapping[str, NetworkScaling] = field(default_factory=dict)  # per collective
    gemm_efficiency_curve: Saturating | None = None
    k1_curve: Saturating | None = None
    k2_curve: Saturating | None = None
    dispatch: Mapping[str, Param] = field(default_factory=dict)  # intra_op_s_per_op, inter_op_s_per_op
    provenance: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    created: str = ""
    calib_version: str = ""
    schema_version: int = CALIBRATION_SCHEMA_VERSION
    format: str = CALIBRATION_FORMAT

    # ---- evaluation -------------------------------------------------------------
    def gemm_efficiency(self, flops_per_gemm: ArrayLike) -> np.ndarray:
        return self._curve("gemm_efficiency_curve")(flops_per_gemm)

    def k1(self, flops_per_gemm: ArrayLike) -> np.ndarray:
        return self._curve("k1_curve")(flops_per_gemm)

    def k2(self, flops_per_gemm: ArrayLike) -> np.ndarray:
        return self._curve("k2_curve")(flops_per_gemm)

    def _curve(self, name: str) -> Saturating:
        curve = getattr(self, name)
        if curve is None:
            raise InputError(self.system, f"calibration has no {name.removesuffix('_curve')}")
        return curve

    def curves_for(self, collective: str) -> list[CollectiveCurve]:
        """Curves of ``collective``, or of the closest stand-in (same traffic pattern)."""
        coll = canonical(collective)
        for candidate in (coll, *_FALLBACK.get(coll, ())):
            found = [c for c in self.collectives if c.collective == candidate]
            if found:
                return found
        return list(self.collectives)

    def eff(self, collective: str, n_gpus: ArrayLike) -> np.ndarray:
        coll = canonical(collective)
        for candidate in (coll, *_FALLBACK.get(coll, ())):
            if candidate in self.network:
                return self.network[candidate].eff(n_gpus)
        if self.network:
            return next(iter(self.network.values())).eff(n_gpus)
        return np.ones_like(np.asarray(n_gpus, dtype=float))

    def collective_time_s(
        self,
        collective: str,
        nbytes: ArrayLike,
        n_gpus: ArrayLike,
        gpus_per_node: int | None = None,
    ) -> np.ndarray:
        """Predicted time of one collective of ``nbytes`` over ``n_gpus`` GPUs.

        Inside a node the closest intra-node curve is used; across nodes the base
        inter-node curve (scale g) with its busbw scaled by eff_{g->n}.  Group sizes of
        1 cost nothing.  Vectorised: ``nbytes`` and ``n_gpus`` broadcast together.
        """
        gpn = int(gpus_per_node or self.gpus_per_node)
        nbytes = np.asarray(nbytes, dtype=float)
        n = np.asarray(n_gpus, dtype=float)
        nbytes, n = np.broadcast_arrays(nbytes, n)
        curves = self.curves_for(collective)
        if not curves:
            raise InputError(self.system, f"calibration has no collective curves to time '{collective}'")
        coll = canonical(collective)
        factor = busbw_factor(coll, n)
        factor = np.where(np.isnan(factor), 1.0, factor)
        intra = [c for c in curves if c.n_nodes <= 1] or curves
        inter = sorted([c for c in curves if c.n_nodes > 1] or curves, key=lambda c: c.n_gpus)
        intra_c = max(intra, key=lambda c: c.n_gpus)
        lat, bw = intra_c.parts_s(nbytes)
        t_intra = lat + bw * factor / _curve_factor(intra_c)
        # across nodes: the closest measured scale at or below n (the smallest above it
        # otherwise), moved to n by the network model
        t_inter = np.zeros_like(nbytes)
        for i, base in enumerate(inter):
            upper = inter[i + 1].n_gpus if i + 1 < len(inter) else np.inf
            sel = (n < upper) if i == 0 else ((n >= base.n_gpus) & (n < upper))
            if not sel.any():
                continue
            lat, bw = base.parts_s(nbytes[sel])
            t_inter[sel] = self._scale(coll, lat, bw, n[sel], base, factor[sel])
        t = np.where(n <= gpn, t_intra, t_inter)
        return np.where(n <= 1, 0.0, t)

    def _scale(
        self,
        coll: str,
        lat: np.ndarray,
        bw: np.ndarray,
        n: np.ndarray,
        base: CollectiveCurve,
        factor: np.ndarray,
    ) -> np.ndarray:
        net = self._network_for(coll)
        if net is not None:
            t = net.scale_time_s(lat, bw, n, base.n_gpus)
            if t is not None:
                return np.where(n == base.n_gpus, lat + bw, t)
        # a form without a latency/bandwidth split: latency grows with the ring steps,
        # bandwidth falls with eff_{g->n}
        eff = self.eff(coll, n) / self.eff(coll, base.n_gpus)
        alpha = lat * np.maximum(1.0, (n - 1.0) / max(base.n_gpus - 1.0, 1.0))
        return alpha + bw * factor / _curve_factor(base) / eff

    def _network_for(self, coll: str) -> NetworkScaling | None:
        for candidate in (coll, *_FALLBACK.get(coll, ())):
            if candidate in self.network:
                return self.network[candidate]
        return next(iter(self.network.values()), None)

    # ---- construction and I/O ---------------------------------------------------
    @classmethod
    def defaults(
        cls,
        system: str,
        *,
        gpus_per_node: int,
        peak_tflops: float | None,
        intra_busbw_gbps: float,
        inter_busbw_gbps: float,
        device: str | None = None,
        source: str = "hardware spec",
    ) -> Calibration:
        """A calibration from a hardware spec alone, every factor a stated default.

        Defaults: GEMM efficiency 0.75 of peak for large matmuls (half of that at
        2 GFLOP per matmul), k1 0.95 saturating (half at 50 MFLOP per matmul, seed 004:
        small models are ~95 % dispatch), k2 0.8 (seed 004: 1 - 26.5 % non-transformer
        kernels on their example), collective latency 20 us intra / 50 us inter node,
        busbw from the spec's link bandwidths, eff_{g->n} = 1 / (1 + 0.02 log2(n/g)).
        """
        note = f"default from {source}: no measurements"
        return cls(
            system=system,
            gpus_per_node=gpus_per_node,
            peak_tflops=peak_tflops,
            device=device,
            collectives=tuple(
                CollectiveCurve(
                    collective=coll,
                    n_gpus=n,
                    n_nodes=nodes,
                    gpus_per_node=gpus_per_node,
                    alpha_s=Param.default(alpha, "s", note),
                    busbw_gbps=Param.default(bw, "GB/s", note),
                    source="spec",
                )
                for coll in (ALLREDUCE, ALLGATHER, REDUCESCATTER)
                for n, nodes, alpha, bw in (
                    (gpus_per_node, 1, 20e-6, intra_busbw_gbps),
                    (2 * gpus_per_node, 2, 50e-6, inter_busbw_gbps),
                )
            ),
            network={
                coll: NetworkScaling(
                    collective=coll,
                    form="log",
                    g_gpus=2 * gpus_per_node,
                    params={"c": Param.default(0.02, "", note)},
                )
                for coll in (ALLREDUCE, ALLGATHER, REDUCESCATTER)
            },
            gemm_efficiency_curve=Saturating(
                y_max=Param.default(0.75, "", note),
                x_half=Param.default(2e9, "FLOP", note),
                gamma=Param(1.0, status=FIXED, note="dispatch-limited form"),
            ),
            k1_curve=Saturating(
                y_max=Param.default(0.95, "", note),
                x_half=Param.default(5e7, "FLOP", note),
                gamma=Param(1.0, status=FIXED, note="dispatch-limited form"),
            ),
            k2_curve=Saturating.constant(0.8, "", note),
            dispatch={
                "intra_op_s_per_op": Param.default(10e-6, "s", note),
                "inter_op_s_per_op": Param.default(5e-6, "s", note),
            },
            provenance={"source": source},
            created=_now(),
        )

    def with_notes(self, *notes: str) -> Calibration:
        return replace(self, notes=(*self.notes, *notes))

    def to_json(self) -> dict[str, Any]:
        return _clean(asdict(self))

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Calibration:
        d = dict(d)

        def curve(key: str) -> Saturating | None:
            return Saturating.from_json(d[key]) if d.get(key) else None

        known = set(cls.__dataclass_fields__)
        return cls(
            **{
                **{k: v for k, v in d.items() if k in known},
                "collectives": tuple(CollectiveCurve.from_json(c) for c in d.get("collectives", ())),
                "network": {k: NetworkScaling.from_json(v) for k, v in d.get("network", {}).items()},
                "gemm_efficiency_curve": curve("gemm_efficiency_curve"),
                "k1_curve": curve("k1_curve"),
                "k2_curve": curve("k2_curve"),
                "dispatch": {k: Param.from_json(v) for k, v in d.get("dispatch", {}).items()},
                "notes": tuple(d.get("notes", ())),
            }
        )

    def save(self, path: str | Path) -> Path:
        """Write atomically (temporary file + rename): never a half-written calibration."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        text = json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"
        try:
            tmp.write_text(text)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(path, "no such calibration file") from None
        except (OSError, ValueError) as exc:
            raise InputError(path, f"unreadable calibration: {exc}") from None
        if not isinstance(raw, dict) or raw.get("format") != CALIBRATION_FORMAT:
            raise InputError(path, f"not a calib calibration (format is not '{CALIBRATION_FORMAT}')")
        version = raw.get("schema_version")
        if not isinstance(version, int) or version > CALIBRATION_SCHEMA_VERSION:
            raise InputError(
                path, f"calibration schema version {version} is newer than this calib understands"
            )
        try:
            return cls.from_json(raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(path, f"malformed calibration: {exc}") from None


def _curve_factor(curve: CollectiveCurve) -> float:
    f = float(busbw_factor(curve.collective, curve.n_gpus))
    return 1.0 if math.isnan(f) or f == 0 else f


def _now() -> str:
    return datetime.now(UTC).replace(microsecond=0).isoformat()


def _clean(obj: Any) -> Any:
    """JSON-safe copy: tuples to lists, non-finite floats to None."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    return obj
