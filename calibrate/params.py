"""Fitted numbers with their uncertainty, fit quality, and the saturating curve form.

Part of the calibration contract (:mod:`calibrate.calibration` re-exports everything).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from calib.core.strict import reject_unknown

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
        reject_unknown(d, cls, "parameter")
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

    def summary(self, sep: str = " ") -> str:
        """One line for people: points, R², max and held-out max relative error."""
        parts = [f"n={self.n_points}"]
        if self.r2 is not None:
            parts.append(f"R²={self.r2:.4f}")
        if self.max_abs_rel_err is not None:
            parts.append(f"max|err|={self.max_abs_rel_err:.1%}")
        if self.heldout_max_abs_rel_err is not None:
            parts.append(f"held-out max|err|={self.heldout_max_abs_rel_err:.1%}")
        return sep.join(parts)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> FitQuality | None:
        if d is None:
            return None
        reject_unknown(d, cls, "fit quality")
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
        reject_unknown(d, cls, "curve")
        return cls(
            y_max=Param.from_json(d["y_max"]),
            x_half=Param.from_json(d["x_half"]),
            gamma=Param.from_json(d["gamma"]),
            x_unit=d.get("x_unit", "FLOP"),
            quality=FitQuality.from_json(d.get("quality")),
        )


def lstsq_stderr(jac: np.ndarray, resid: np.ndarray) -> np.ndarray:
    """Standard errors of a least-squares fit from its Jacobian and residuals (the
    covariance ``pinv(J'J) * RSS / dof``); NaN when the fit has no residual degree of
    freedom (as many data as parameters: the residuals are zero by construction, so they
    say nothing about the uncertainty; :func:`stderr_or_none` turns it into no error)."""
    dof = len(resid) - jac.shape[1]
    if dof < 1:
        return np.full(jac.shape[1], np.nan)
    cov = np.linalg.pinv(jac.T @ jac) * float(resid @ resid) / dof
    return np.sqrt(np.clip(np.diag(cov), 0.0, None))


def stderr_or_none(se: float) -> float | None:
    """A standard error for :class:`Param`: None where the fit could not give one."""
    return float(se) if np.isfinite(se) else None
