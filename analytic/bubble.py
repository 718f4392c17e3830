"""Pipeline schedules: iteration time and bubble of 1F1B, interleaved 1F1B, ZB-H1, DualPipe.

With p stages, m micro-batches, a stage's forward F, full backward B (input gradient
plus weight gradient W) per micro-batch, and t_stage = F + B:

* 1F1B (Narayanan et al. SC21 sec. 2.2.1): bubble (p - 1)(F + B); fraction (p - 1) / m.
* interleaved 1F1B, v virtual stages per GPU (SC21 sec. 2.2.2): (p - 1)(F + B) / v.
* ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv:2401.10241 sec. 3.1):
  the weight gradients W fill the cool-down; bubble (p - 1)(F + B_in - W) with B_in the
  input-gradient part, i.e. (p - 1)(F + B - 2W) with B the full backward -- the form of
  DeepSeek-V3's Table 2 (ZB1P).  Same activation memory as 1F1B.
* DualPipe (DeepSeek-V3 report, arXiv:2412.19437 sec. 3.2.1, Table 2): micro-batches
  enter from both ends; bubble (p/2 - 1)(F&B + B - 3W), F&B the time of an overlapped
  forward + backward chunk pair (their compute serialises: F + B; what overlaps is the
  communication, charged in :mod:`analytic.overlap`).  Twice the parameters per GPU and
  p + 1 micro-batches of activations.  Needs p even and m >= 2p (DeepSeek's reference
  implementation asserts ``num_chunks >= num_ranks * 2``).

    t_pipeline = m (t_stage + t_head) + bubble       (t_head: LM head on the last stage)
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

ONE_F_ONE_B, ZB_H1, DUALPIPE = 0, 1, 2
SCHEDULES = ("1f1b", "zb-h1", "dualpipe")


def schedule_code(name: str) -> int:
    from calib.core.errors import InputError

    try:
        return SCHEDULES.index(name.strip().lower())
    except ValueError:
        raise InputError("schedule", f"unknown pipeline schedule '{name}' ({', '.join(SCHEDULES)})") from None


def bubble_fraction(p: ArrayLike, m: ArrayLike, v: ArrayLike = 1) -> np.ndarray:
    """(p - 1) / m for 1F1B, (p - 1) / (m v) interleaved."""
    p, m, v = (np.asarray(x, dtype=float) for x in (p, m, v))
    return (p - 1.0) / (m * v)


def bubble_s(F, B, W, p, v=1, schedule=ONE_F_ONE_B) -> np.ndarray:
    """Bubble seconds of one iteration (formulas above); F, B, W per micro-batch and stage."""
    F, B, W, p, v = (np.asarray(x, dtype=float) for x in (F, B, W, p, v))
    sch = np.asarray(schedule)
    one = (p - 1.0) * (F + B) / v
    zb = (p - 1.0) * (F + B - 2.0 * W)
    dual = np.maximum(p / 2.0 - 1.0, 0.0) * ((F + B) + B - 3.0 * W)
    return np.maximum(np.select([sch == ZB_H1, sch == DUALPIPE], [zb, dual], one), 0.0)


def pipeline_time_s(
    stage_s: ArrayLike, head_s: ArrayLike, p: ArrayLike, m: ArrayLike, v: ArrayLike = 1,
    schedule: ArrayLike = ONE_F_ONE_B, fwd_share: ArrayLike = 1.0 / 3.0, wgrad_share: ArrayLike = 1.0 / 3.0,
    bubble_stage_s: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(time of the pipelined micro-batches, the bubble part of it), seconds.

    ``fwd_share`` / ``wgrad_share``: F / t_stage and W / t_stage (1/3 each without
    recompute: forward, input gradient and weight gradient cost one forward each).
    ``bubble_stage_s``: v x the slowest virtual stage, when interleaved virtual stages are
    uneven (analytic.uneven); default ``stage_s``.
    """
    stage_s, head_s, p, m = (np.asarray(x, dtype=float) for x in (stage_s, head_s, p, m))
    bs = stage_s if bubble_stage_s is None else np.asarray(bubble_stage_s, dtype=float)
    F = bs * np.asarray(fwd_share, dtype=float)
    W = bs * np.asarray(wgrad_share, dtype=float)
    bubble = bubble_s(F, bs - F, W, p, v, schedule)
    return m * (stage_s + head_s) + bubble, bubble


def in_flight_scale(p: ArrayLike, schedule: ArrayLike = ONE_F_ONE_B) -> np.ndarray:
    """Activation memory over 1F1B's p micro-batches: (p + 1) / p for DualPipe, else 1."""
    p = np.asarray(p, dtype=float)
    return np.where(np.asarray(schedule) == DUALPIPE, (p + 1.0) / p, 1.0)


def param_copies(schedule: ArrayLike = ONE_F_ONE_B) -> np.ndarray:
    """Copies of the stage's parameters a GPU holds: 2 for DualPipe (both directions), else 1."""
    return np.where(np.asarray(schedule) == DUALPIPE, 2.0, 1.0)
