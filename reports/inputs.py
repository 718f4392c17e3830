"""What a report is about: runs, a system's calibration and the data it was fitted on.

The API layer (:func:`calib.resolve.gather`) reads them from the store or from files;
the report only renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from calib.calibrate.calibration import Calibration

from calib.core.rundir import Run


@dataclass(frozen=True)
class Inputs:
    runs: tuple[Run, ...]
    system: str | None = None
    calibration: Calibration | None = None
    calibration_path: Path | None = None
    store: Path | None = None
    series: tuple = ()  # calibrate.collectives.SizeSeries the fit used (measured points)
    notes: tuple[str, ...] = field(default_factory=tuple)
