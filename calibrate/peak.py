"""The measured matmul peak of a system: ``calib bench gemm`` samples (``gemm_samples``).

Without a datasheet peak (``--peak-tflops``), GEMM efficiencies are fractions of the best
sustained throughput the benchmark measured, in the dtype the traces train in.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from calib.core.rundir import Run

#: trace dtype names (Kineto ``Input type``) -> torch dtype names of ``gemm_samples``
TRACE_DTYPES = {
    "float": "float32",
    "double": "float64",
    "c10::Half": "float16",
    "c10::BFloat16": "bfloat16",
    "half": "float16",
    "bfloat16": "bfloat16",
}


@dataclass(frozen=True)
class MeasuredPeak:
    """The best sustained matmul throughput of a system's GEMM benchmark.

    Not a datasheet peak: the highest TFLOP/s any benchmarked shape sustained (each
    sample is the median of repeated back-to-back calls), in the dtype the traces train
    in when the benchmark ran it.  GEMM efficiencies are then fractions of this number.
    """

    tflops: float
    dtype: str
    shape: str
    device: str
    samples: int
    note: str


def bench_gemm_samples(runs: tuple[Run, ...]) -> pd.DataFrame:
    """Every ``gemm_samples`` row of ``runs`` (bench runs of ``calib bench gemm``), with its run."""
    frames = [r.table("gemm_samples").assign(run=r.meta.name) for r in runs if r.has("gemm_samples")]
    if not frames:
        return pd.DataFrame(
            columns=["run", "device", "dtype", "m", "n", "k", "batch", "flops", "time_s", "tflops"]
        )
    g = pd.concat(frames, ignore_index=True)
    return g[(g["time_s"] > 0) & (g["flops"] > 0) & np.isfinite(g["tflops"])].reset_index(drop=True)


def traced_gemm_dtype(trace_runs: tuple[Run, ...]) -> str | None:
    """The dtype (torch name) carrying most matmul FLOPs in the traces' ``gemms`` tables."""
    frames = [r.table("gemms")[["dtype", "flops"]] for r in trace_runs if r.has("gemms")]
    if not frames:
        return None
    g = pd.concat(frames, ignore_index=True)
    if g.empty:
        return None
    top = str(g.groupby("dtype")["flops"].sum().idxmax())
    return TRACE_DTYPES.get(top, top)


def measured_peak(samples: pd.DataFrame, dtype: str | None) -> MeasuredPeak | None:
    """The best sustained TFLOP/s of ``samples`` in ``dtype`` (else the fastest dtype benchmarked)."""
    if samples.empty:
        return None
    dtypes = sorted(samples["dtype"].astype(str).unique())
    note = ""
    if dtype in dtypes:
        use = dtype
    else:
        use = str(samples.groupby("dtype")["tflops"].max().idxmax())
        note = (
            f"the traces train in {dtype}, which the GEMM benchmark did not run; "
            if dtype
            else "no traced matmul dtype to match; "
        ) + f"peak taken from {use} (benchmarked: {', '.join(dtypes)})"
    s = samples[samples["dtype"].astype(str) == use]
    best = s.loc[s["tflops"].idxmax()]
    shape = f"{int(best['m'])}x{int(best['n'])}x{int(best['k'])}" + (
        f" x{int(best['batch'])}" if int(best["batch"]) > 1 else ""
    )
    return MeasuredPeak(
        tflops=float(best["tflops"]),
        dtype=use,
        shape=shape,
        device=str(best["device"]),
        samples=int(len(s)),
        note=note,
    )


def bench_efficiency(samples: pd.DataFrame, peak_tflops: float, dtype: str) -> pd.DataFrame:
    """GEMM efficiency points of the benchmark: x_flops (per call), eff = TFLOP/s / peak, shapes.

    Repeated runs of one shape are one point (median TFLOP/s), like a work level of the traces.
    """
    s = samples[samples["dtype"].astype(str) == dtype]
    if s.empty:
        return pd.DataFrame(columns=["x_flops", "eff", "shapes"])
    agg = s.groupby(["m", "n", "k", "batch"]).agg(x_flops=("flops", "first"), tflops=("tflops", "median"))
    out = pd.DataFrame({"x_flops": agg["x_flops"], "eff": agg["tflops"] / peak_tflops, "shapes": 1})
    return out.sort_values("x_flops", kind="stable").reset_index(drop=True)
