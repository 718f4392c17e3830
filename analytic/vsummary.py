"""Held-out summaries beyond the table-wide median: per group tag, and where held-out rows
extrapolate beyond the calibration rows (used by :mod:`analytic.validate`)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def by_group(held: pd.DataFrame) -> dict:
    """Held-out errors per group tag (rows of one stack, section or model), where the held-out
    rows span two groups or more: a table-wide median can hide one group's error."""
    groups = held["group"].astype(str) if "group" in held else pd.Series(dtype=str)
    if groups.nunique() < 2:
        return {}
    e = held["err_pct"].astype(float)
    stats = e.groupby(groups, sort=False).agg(
        n="size", median_abs_pct=lambda x: float(np.median(np.abs(x))), median_signed_pct="median"
    )
    return {"by_group": {str(g): {k: (int(v) if k == "n" else float(v)) for k, v in r.items()}
                         for g, r in stats.iterrows()}}  # fmt: skip


def _num(x: float) -> str:
    return f"{x:,.0f}" if x < 1e6 else f"{x:.3g}"


#: (column or derived quantity, its name) a held-out row may lie beyond the calibration rows in
_EXTENT = (("gpus", "GPU count"), ("seq_len", "sequence length"), ("size", "model size (layers x d^2)"))
EXTRAPOLATION_FACTOR = 1.5  # beyond the calibrated range by more than this: said (a stated threshold)


def extrapolation_notes(df: pd.DataFrame, cal_rows: np.ndarray) -> list[str]:
    """Where held-out rows lie beyond the calibration rows' range of GPU count, sequence length
    or model size by more than EXTRAPOLATION_FACTOR: their errors measure an extrapolation,
    which the fit's interval (parameter errors and calibration scatter) does not hold."""
    cal = np.asarray(cal_rows, dtype=bool)
    vals = {"gpus": df["gpus"], "seq_len": df["seq_len"], "size": df["n_layers"] * df["d_model"] ** 2}
    out = []
    for key, name in _EXTENT:
        v = vals[key].to_numpy(dtype=float)
        lo, hi = v[cal].min(), v[cal].max()
        beyond = ~cal & ((v > EXTRAPOLATION_FACTOR * hi) | (v < lo / EXTRAPOLATION_FACTOR))
        if beyond.any():
            out.append(
                f"{int(beyond.sum())} of {int((~cal).sum())} held-out rows lie beyond the calibration rows' "
                f"{name} ({_num(lo)}-{_num(hi)}) by more than {EXTRAPOLATION_FACTOR:g}x: their errors measure "
                "an extrapolation, which the interval does not hold"
            )
    return out
