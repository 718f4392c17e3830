"""Work levels: runs whose work per operator differs by less than a ratio are one level.

Shared by the compute-factor fits (:mod:`calibrate.compute`) and the compute-slot fit
(:mod:`calibrate.slots`).
"""

from __future__ import annotations

import numpy as np

LEVEL_RATIO = 1.5  # x values closer than this are one work level


def work_levels(x: np.ndarray) -> np.ndarray:
    """Distinct work levels: sorted x values more than :data:`LEVEL_RATIO` apart.

    Runs of one model under different frameworks differ by a few percent in mean FLOPs
    per matmul; that is one level, not a curve.
    """
    xs = np.sort(np.asarray(x, dtype=float))
    if not len(xs):
        return xs
    starts = np.concatenate([[True], xs[1:] / xs[:-1] > LEVEL_RATIO])
    # a level is the geometric mean of its members
    ids = np.cumsum(starts) - 1
    return np.exp(np.bincount(ids, np.log(xs)) / np.bincount(ids))
