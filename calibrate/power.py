"""Static and dynamic GPU power from NVML samples (``calib capture`` power files).

Model (the energy model's, :mod:`analytic.energy`): board power = static + dynamic * a,
with activity a = utilisation * s * V(s)^2 at SM-clock scale s -- dynamic power ~ f V^2
while the SM pipelines are busy (seed 003).  The caller supplies a per sample; the fit is
ordinary least squares with standard errors from the residual variance.  Samples that do
not vary the activity cannot separate static from dynamic power (unidentifiable).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from calib.core.errors import InputError

POWER_FORMAT = "calib power samples v1"
REQUIRED = ("power_w", "sm_clock_mhz", "gpu_util_pct")


def read_power_samples(path: str | Path) -> tuple[pd.DataFrame, dict[str, str]]:
    """The samples table and the header comment's ``key=value`` fields."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InputError(p, "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(p, f"unreadable: {exc}") from None
    first = text.splitlines()[0] if text else ""
    if not first.startswith("# " + POWER_FORMAT):
        raise InputError(p, f"not a power samples file (first line must start with '# {POWER_FORMAT}')")
    meta = dict(kv.strip().split("=", 1) for kv in first[2:].split(";")[1:] if "=" in kv)
    try:
        df = pd.read_csv(p, comment="#")
    except (ValueError, pd.errors.ParserError) as exc:
        raise InputError(p, f"malformed CSV: {str(exc).splitlines()[0]}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise InputError(p, f"missing column(s) {', '.join(missing)}")
    for c in REQUIRED:
        v = pd.to_numeric(df[c], errors="coerce")
        top = 100.0 if c.endswith("_pct") else np.inf  # utilisation is a percentage
        bad = ~(np.isfinite(v) & (v >= 0) & (v <= top))
        if bad.any():
            rng = "0..100" if c.endswith("_pct") else "finite and >= 0"
            raise InputError(p, f"column {c}: value {df[c].iloc[int(np.argmax(bad.to_numpy()))]} in row "
                                f"{int(np.argmax(bad.to_numpy())) + 1} is not {rng}")  # fmt: skip
        df[c] = v.astype(float)
    if len(df) < 3:
        raise InputError(p, f"{len(df)} samples: the fit needs at least 3")
    return df, meta


def fit_static_dynamic(power_w: np.ndarray, activity: np.ndarray, source: str) -> dict:
    """OLS of power on activity: static (intercept) and dynamic (slope, watts at full activity)."""
    y, x = np.asarray(power_w, dtype=float), np.asarray(activity, dtype=float)
    if np.ptp(x) <= 1e-9 * max(1.0, np.abs(x).max()):
        raise InputError(source, "the samples do not vary utilisation or clock: static and dynamic power are "
                                 "unidentifiable")  # fmt: skip
    A = np.column_stack([np.ones_like(x), x])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ coef
    dof = max(len(y) - 2, 1)
    cov = np.linalg.inv(A.T @ A) * float(resid @ resid) / dof
    ss_tot = float(((y - y.mean()) ** 2).sum())
    return {
        "static_w": {"value": float(coef[0]), "stderr": float(np.sqrt(cov[0, 0])), "status": "fitted"},
        "dynamic_w": {"value": float(coef[1]), "stderr": float(np.sqrt(cov[1, 1])), "status": "fitted"},
        "r2": 1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else float("nan"),
        "residual_rms_w": float(np.sqrt(np.mean(resid**2))),
        "n_samples": int(len(y)),
        "source": source,
    }
