"""Stage 1: profiler traces and nccl-tests logs into per-rank tables (a *run*).

Nothing here imports a later stage (calibrate, analytic, reports) or the ``calib`` CLI.
"""

from calib.core.errors import InputError

__all__ = ["InputError"]
