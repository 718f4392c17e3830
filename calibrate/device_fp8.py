"""FP8 training as the traces show it: the GEMMs' speed-up and the casts' traffic.

An FP8 linear layer costs two things a BF16 one does not: its GEMMs run on the FP8 tensor
cores (:func:`fit_fp8_gemm`: their traced time over the BF16 roofline), and its operands
must be scaled and cast -- per-tensor amax, scale, cast, and a transposed copy for the
backward -- in memory-bound kernels whose traffic depends on the implementation (fused
into neighbours by Transformer Engine or torch.compile, one eager kernel each otherwise).
:func:`fit_fp8_casts` measures that traffic from eager FP8 runs: the run's device-busy time
beyond what the dense model predicts for it with FP8 GEMMs and no casts, at the fitted
memory-bound bandwidth, per operand element of its FP8 GEMMs.  On two real H200 runs of
eager per-tensor current scaling (fixtures/traces/h200): 19.5 and 20.4 bytes per operand
element, against the ~3 of one fused read-and-write per cast.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from calib.calibrate import device_step as D
from calib.calibrate.params import FITTED, Param

if TYPE_CHECKING:  # device_facts imports the device model, which this module's callers build
    from calib.calibrate.device_facts import RunFacts
    from calib.calibrate.device_model import DeviceModel, GemmModel

#: the variant tag of an FP8 run whose casts ran as eager kernels (device_facts.variant)
EAGER_FP8 = "fp8"


def fit_fp8_gemm(runs: Sequence[RunFacts], gemm: GemmModel) -> Param | None:
    """How much faster the traced FP8 GEMMs (``aten::_scaled_mm``) ran than the BF16
    roofline predicts for their shapes: the time-weighted ratio, with the standard error
    of the per-shape log ratios.  None when no run traced FP8 GEMMs."""
    pts = [f.gemms[f.gemms["fp8"].astype(bool)].assign(source=f.name) for f in runs if len(f.gemms)]
    pts = [p for p in pts if len(p)]
    if not pts:
        return None
    p = pd.concat(pts, ignore_index=True)
    bf16 = gemm.time_s(p["m"], p["n"], p["k"], p["batch"]) * p["count"].to_numpy(float)
    meas = p["dur_s"].to_numpy(float) * p["count"].to_numpy(float)
    ratio = float(bf16.sum() / meas.sum())
    logs = np.log(bf16 / meas)
    se = ratio * float(np.std(logs, ddof=1) / np.sqrt(len(logs))) if len(logs) > 1 else None
    runs_txt = ", ".join(sorted(set(p["source"])))
    return Param(
        ratio, se, "", FITTED, f"{len(p)} traced FP8 GEMM shapes ({runs_txt}) over the BF16 roofline"
    )


def operand_elems(f: RunFacts) -> float:
    """Operand elements (m k + k n, times batch) of a run's FP8 GEMMs per step."""
    g = f.gemms[f.gemms["fp8"].astype(bool)]
    return float((g["count"] * g["batch"] * (g["m"] * g["k"] + g["k"] * g["n"])).sum())


def cast_bytes_per_elem(dm: DeviceModel, f: RunFacts) -> float:
    """One eager FP8 run's memory-bound traffic beyond the dense model, per operand element."""
    speedup = dm.fp8_gemm_speedup.value if dm.fp8_gemm_speedup is not None else 1.0
    p = D.single_gpu(dm, f.d, f.L, f.a, f.kv, f.ffn, f.s, f.V, f.b, f.mlp, tied=f.tied, params=f.params,
                     weights=f.weights, gemm_scale=speedup)  # fmt: skip
    extra_s = f.busy_s - float(p["gpu_s"])
    return extra_s * dm.stream_tbps.value * 1e12 / operand_elems(f)


def fit_fp8_casts(runs: Sequence[RunFacts], dm: DeviceModel) -> Param | None:
    """Bytes of cast traffic per FP8 GEMM operand element, from the eager FP8 runs (mean,
    standard error over runs).  None when no eager FP8 run was traced: predictions then
    take Transformer Engine's fused casts (analytic.precision, a stated assumption).
    Runs whose casts torch.compile fused are not used: the dense model is eager, so their
    residual mixes the casts with compile's other fusions."""
    fp8 = [f for f in runs if f.variant == EAGER_FP8 and operand_elems(f) > 0 and f.busy_s > 0]
    if not fp8:
        return None
    from calib.calibrate.device_fit import _mean_param

    m = _mean_param([cast_bytes_per_elem(dm, f) for f in fp8], "B/elem")  # mean, standard error
    names = ", ".join(f.name for f in fp8)
    note = (
        f"{len(fp8)} eager FP8 runs ({names})"
        if m.stderr is not None
        else f"one eager FP8 run ({names}): its spread unknown"
    )
    if m.value < 0:  # the dense model alone already over-predicts these runs: no traffic to add
        note += f"; {m.value:.3g} B/elem measured, held at 0"
    return Param(max(m.value, 0.0), m.stderr, "B/elem", FITTED, note)
