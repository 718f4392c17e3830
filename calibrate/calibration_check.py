"""Reading a calibration file: what must hold beyond the types (calib.core.strict).

A file that states a zero bandwidth, a negative latency or a form whose parameters are
missing is refused when it is read, with one line naming the file, instead of failing
(or printing nonsense) inside a prediction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from calib.core.errors import InputError


def check_physical(cal: Any) -> None:
    """ValueError unless counts are >= 1, bandwidths > 0, latencies >= 0, and every fitted
    form evaluates to finite, non-negative numbers at a few sizes and scales."""
    if cal.gpus_per_node < 1 or (cal.peak_tflops is not None and cal.peak_tflops <= 0):
        raise ValueError("gpus_per_node must be >= 1 and peak_tflops > 0")
    for i, c in enumerate(cal.collectives):
        for j, s in enumerate((c, *c.segments)):
            where = f"collectives[{i}]" + (f".segments[{j - 1}]" if j else "")
            if not (s.busbw_gbps.value > 0 and s.alpha_s.value >= 0):
                raise ValueError(f"{where}: busbw_gbps must be > 0 and alpha_s >= 0")
        if min(c.n_gpus, c.n_nodes, c.gpus_per_node) < 1:
            raise ValueError(f"collectives[{i}]: n_gpus, n_nodes and gpus_per_node must be >= 1")
    if any(ns.g_gpus < 1 for ns in cal.network.values()):
        raise ValueError("network: g_gpus must be >= 1")
    gpn = float(cal.gpus_per_node)
    n = np.array([2.0, gpn, 2 * gpn, 64 * gpn])
    with np.errstate(all="ignore"):
        try:
            values = [
                cal.collective_time_s(coll, np.array([[1e3], [1e6], [1e9]]), n)
                for coll in sorted({c.collective for c in cal.collectives} | set(cal.network))
            ]
            values += [
                getattr(cal, k)(np.array([1e6, 1e9, 1e12]))
                for k in ("gemm_efficiency", "k1", "k2")
                if getattr(cal, f"{k}_curve") is not None
            ]
        except (ArithmeticError, LookupError, TypeError, ValueError, InputError) as exc:
            raise ValueError(
                f"the calibration's forms cannot be evaluated ({type(exc).__name__}: {exc})"
            ) from None
    if not all(np.all(np.isfinite(v) & (v >= 0)) for v in values):
        raise ValueError("the calibration's forms give negative or non-finite times or efficiencies")
