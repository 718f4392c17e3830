"""The numbers behind a report's prediction section, as the report is handed them.

The API layer computes them (:mod:`calib.report_data`); here they are plain typed
containers of tables (one row per configuration, units in the column names) that the
figure modules plot and the tests check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from calib.reports.spec import MapSpec, ScalingSpec, SearchSpec, ValidateSpec


@dataclass(frozen=True)
class Maps:
    """Exposed communication per iteration over TP x DP (PP = 1) and TP x PP (fixed GPUs)."""

    spec: MapSpec
    tp_dp: pd.DataFrame  # tp, dp, pp, gpus, valid, oom, iter_s, comm_exposed_s, comm_share
    tp_pp: pd.DataFrame


@dataclass(frozen=True)
class SearchOut:
    spec: SearchSpec
    top: pd.DataFrame
    n_strategies: int
    n_feasible: int
    seconds: float


@dataclass(frozen=True)
class ValidationOut:
    spec: ValidateSpec
    path: str
    format: str
    split: str
    rows: pd.DataFrame  # label, group, role, quantity, measured, predicted, err_pct, ...
    summary: dict


@dataclass(frozen=True)
class Predictions:
    machine: str  # e.g. "polaris (NVIDIA A100-SXM4-40GB, calibration polaris)"
    hbm_gb: float | None
    scaling: pd.DataFrame | None = None  # model, zero + analytic.predict columns
    scaling_spec: ScalingSpec | None = None
    maps: Maps | None = None
    search: SearchOut | None = None
    validations: tuple[ValidationOut, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)
