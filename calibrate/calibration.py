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
* ``.collective_time_s`` across nodes uses the NCCL-structured model
  (:mod:`calibrate.ncclmodel`, network form ``"nccl"``) when the calibration has one
* ``.eff(collective, n_gpus)`` -- eff_{g->n}: large-message bus bandwidth at n GPUs
  over that at the calibration's base scale g (seed 004)
* ``.peak_tflops``, ``.gpus_per_node``, ``.dispatch`` (per-operator host costs)
* ``.compute_slots_per_node`` -- ranks a node runs at full speed (a :class:`Param`, or
  None: one per device); r ranks on a node slow each other by max(1, r / slots)

One owner per quantity: ``peak_tflops`` and ``gpus_per_node`` here describe the *calibrated*
system (the denominator the fitted efficiencies are fractions of, and the ranks per node of
its samples); :class:`calib.analytic.specs.HardwareSpec` owns the *target* machine's, and
``analytic.machine.transfer`` rescales the fitted factors when the two differ.

Schema versions: 1 kept compute slots in ``provenance["node"]["compute_slots_per_node"]``;
2 has the typed field (version 1 files are read and migrated).  Unknown keys anywhere in
the file are an error naming the key (:mod:`calib.core.strict`), never dropped.

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
from calib.calibrate.calibration_check import check_physical
from calib.calibrate.curves import (  # noqa: F401 - re-exported: the contract's public names
    CollectiveCurve,
    NetworkScaling,
    Segment,
    register_form,
    scaling_form,
)
from calib.calibrate.device_model import DeviceModel
from calib.calibrate.params import (  # noqa: F401 - re-exported
    DEFAULT,
    FITTED,
    FIXED,
    STATUSES,
    UNIDENTIFIABLE,
    FitQuality,
    Param,
    Saturating,
)
from numpy.typing import ArrayLike

from calib.core.atomic import write_text
from calib.core.collective_names import (
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
from calib.core.errors import InputError
from calib.core.strict import check_types, reject_unknown

NCCL_FORM = "nccl"  # calibrate.ncclmodel.FORM (not imported: the model imports this module's contract)
CALIBRATION_FORMAT = "calib.calibration"
CALIBRATION_SCHEMA_VERSION = 2


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
    #: the physical compute model of the traced device (GEMM roofline, attention, streamed
    #: bytes, optimizer, host, memory), fitted from GPU traces; None without them
    device_model: DeviceModel | None = None
    #: ranks one node runs at full speed (devices, or cores / threads per rank on a CPU
    #: host), fitted from runs with several ranks per node; None: one per device
    compute_slots_per_node: Param | None = None
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
        if not (n > 1).any():
            return np.zeros(nbytes.shape)  # no group: no collective, no curve needed
        curves = self.curves_for(collective)
        if not curves:
            raise InputError(self.system, f"calibration has no collective curves to time '{collective}'")
        coll = canonical(collective)
        net = self._network_for(coll)
        if net is not None and net.form == NCCL_FORM:
            # across nodes: NCCL's structure (calibrate.ncclmodel); inside a node: the curves
            intra_c = _intra_curve(curves)
            factor = busbw_factor(coll, n)
            factor = np.where(np.isnan(factor), 1.0, factor)
            lat, bw = intra_c.parts_s(nbytes)
            t_intra = lat + bw * factor / _curve_factor(intra_c)
            t_net = net.model_time_s(nbytes, np.maximum(n, gpn + 1.0))[0]
            t = np.where(n <= gpn, t_intra, t_net)
            return np.where(n <= 1, 0.0, t)
        factor = busbw_factor(coll, n)
        factor = np.where(np.isnan(factor), 1.0, factor)
        inter = sorted([c for c in curves if c.n_nodes > 1] or curves, key=lambda c: c.n_gpus)
        intra_c = _intra_curve(curves)
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
        gemm_y_max: float | None = None,
        gemm_y_max_note: str = "",
    ) -> Calibration:
        """A calibration from a hardware spec alone, every factor a stated default.

        Defaults: GEMM efficiency 0.75 of peak for large matmuls, or ``gemm_y_max`` when the
        spec knows the device's measured maximum achievable matmul (half of that at
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
                y_max=Param.default(
                    0.75 if gemm_y_max is None else float(gemm_y_max), "", gemm_y_max_note or note
                ),
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
        """Strict: unknown keys, here or in a nested object, are a ValueError naming them.

        A schema-version-1 dict (compute slots under ``provenance["node"]``) is migrated."""
        reject_unknown(d, cls, "calibration")
        d = _migrate(dict(d))

        def curve(key: str) -> Saturating | None:
            return Saturating.from_json(d[key]) if d.get(key) else None

        slots = d.get("compute_slots_per_node")
        cal = cls(
            **{
                **d,
                "collectives": tuple(CollectiveCurve.from_json(c) for c in d.get("collectives", ())),
                "network": {k: NetworkScaling.from_json(v) for k, v in _obj(d, "network").items()},
                "gemm_efficiency_curve": curve("gemm_efficiency_curve"),
                "k1_curve": curve("k1_curve"),
                "k2_curve": curve("k2_curve"),
                "dispatch": {k: Param.from_json(v) for k, v in _obj(d, "dispatch").items()},
                "device_model": DeviceModel.from_json(d.get("device_model")),
                "compute_slots_per_node": Param.from_json(slots) if slots is not None else None,
                "provenance": _obj(d, "provenance"),
                "notes": tuple(d.get("notes", ())),
                "schema_version": CALIBRATION_SCHEMA_VERSION,
            }
        )
        check_types(cal, "calibration")
        check_physical(cal)
        return cal

    def save(self, path: str | Path) -> Path:
        """Write atomically (temporary file + rename): never a half-written calibration."""
        return write_text(path, json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(path, "no such calibration file") from None
        except IsADirectoryError:
            raise InputError(path, "is a directory, not a calibration file (*.calib.json)") from None
        except (OSError, ValueError) as exc:
            raise InputError(path, f"unreadable calibration: {exc}") from None
        if not isinstance(raw, dict) or raw.get("format") != CALIBRATION_FORMAT:
            raise InputError(path, f"not a calib calibration (format is not '{CALIBRATION_FORMAT}')")
        version = raw.get("schema_version")
        if (
            not isinstance(version, int)
            or isinstance(version, bool)
            or not 1 <= version <= CALIBRATION_SCHEMA_VERSION
        ):
            raise InputError(
                path,
                f"calibration schema version {version!r} is not one this calib understands "
                f"(1..{CALIBRATION_SCHEMA_VERSION})",
            )
        try:
            return cls.from_json(raw)
        except KeyError as exc:
            raise InputError(path, f"malformed calibration: missing field {exc}") from None
        except (LookupError, TypeError, ValueError, AttributeError, ArithmeticError) as exc:
            raise InputError(path, f"malformed calibration: {exc}") from None


def _obj(d: Mapping[str, Any], key: str) -> dict:
    v = d.get(key) or {}
    if not isinstance(v, Mapping):
        raise ValueError(f"'{key}' must be an object, got {type(v).__name__}")
    return dict(v)


def _migrate(d: dict[str, Any]) -> dict[str, Any]:
    """Schema version 1 -> 2: compute slots from ``provenance["node"]`` into their field."""
    if d.get("schema_version", CALIBRATION_SCHEMA_VERSION) >= 2 or "compute_slots_per_node" in d:
        return d
    node = _obj(_obj(d, "provenance"), "node")
    raw = node.get("compute_slots_per_node")
    if isinstance(raw, Mapping) and "value" in raw:
        d["compute_slots_per_node"] = raw
    return d


def _intra_curve(curves: list[CollectiveCurve]) -> CollectiveCurve:
    """Inside a node: the largest single-node curve; without one the smallest inter-node
    curve (fewest hops across the NIC: the least pessimistic stand-in, as the fit notes)."""
    intra = [c for c in curves if c.n_nodes <= 1]
    return max(intra, key=lambda c: c.n_gpus) if intra else min(curves, key=lambda c: c.n_gpus)


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
