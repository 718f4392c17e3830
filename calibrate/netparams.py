"""Least squares with standard errors and the Param constructors the network fits share
(:mod:`calibrate.netfit`, :mod:`calibrate.treefit`)."""

from __future__ import annotations

import numpy as np
from calib.calibrate.calibration import FIXED, Param
from scipy.optimize import least_squares

from calib.core.errors import InputError


def lsq(resid, x0, lower, upper, where: str, what: str, n_pts: int):
    """Bounded soft-L1 least squares: (x, standard errors sigma^2 (J^T J)^-1, nan without
    residual degrees of freedom, residuals); a fit that does not converge is an InputError."""
    sol = least_squares(
        resid,
        np.asarray(x0, float),
        bounds=(lower, upper),
        x_scale=np.abs(x0) + 1e-12,
        loss="soft_l1",
        f_scale=0.1,
    )
    if not sol.success or not np.all(np.isfinite(sol.x)):
        raise InputError(where, f"{what}: fit did not converge on {n_pts} points ({sol.message})")
    r = resid(sol.x)
    dof = len(r) - len(sol.x)
    se = np.full(len(sol.x), np.nan)
    if dof > 0:
        cov = np.linalg.pinv(sol.jac.T @ sol.jac) * float(r @ r) / dof
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
    return sol.x, se, r


def param(v: float, se: float, unit: str, status: str, note: str) -> Param:
    return Param(float(v), stderr=float(se) if np.isfinite(se) else None, unit=unit, status=status, note=note)


def fixed(v: float, note: str, unit: str = "") -> Param:
    return Param(float(v), unit=unit, status=FIXED, note=note)
