"""Pipeline schedule: iteration time and bubble of 1F1B and interleaved 1F1B.

With p stages, m micro-batches and v virtual stages per GPU (Narayanan et al. SC21), the
slowest stage runs its m micro-batches back to back and waits (p - 1) / v stage-times
for the pipeline to fill and drain:

    t_pipeline = m * (t_stage + t_head) + (p - 1) / v * t_stage
    bubble fraction = (p - 1) / (v m)   of the useful time m * t_stage

(t_head: the LM head on the last stage, which makes it the slowest.)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def bubble_fraction(p: ArrayLike, m: ArrayLike, v: ArrayLike = 1) -> np.ndarray:
    """(p - 1) / m for 1F1B, (p - 1) / (m v) interleaved."""
    p, m, v = (np.asarray(x, dtype=float) for x in (p, m, v))
    return (p - 1.0) / (m * v)


def pipeline_time_s(
    stage_s: ArrayLike, head_s: ArrayLike, p: ArrayLike, m: ArrayLike, v: ArrayLike = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(time of the pipelined micro-batches, the bubble part of it), seconds."""
    stage_s, head_s, p, m, v = (np.asarray(x, dtype=float) for x in (stage_s, head_s, p, m, v))
    bubble = (p - 1.0) / v * stage_s
    return m * (stage_s + head_s) + bubble, bubble
