"""Matmul FLOP/s against size and dtype: the GEMM-efficiency data of a system.

Each shape is timed like the collectives: ``warmup`` untimed calls, then ``iters`` calls
back to back between two device synchronisations, divided by ``iters``; that is repeated
``repeats`` times and the median kept (one slow repeat, e.g. a context switch on a busy
host, does not move it).  FLOPs = 2 m n k batch, TFLOP/s = FLOPs / time / 1e12.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from calib.ingest.capture.units import DTYPES

from calib.core.errors import InputError


@dataclass(frozen=True)
class GemmShape:
    """C[batch, m, n] = A[batch, m, k] @ B[k, n] (a plain mm when batch is 1)."""

    m: int
    n: int
    k: int
    batch: int = 1
    label: str = ""

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch


@dataclass(frozen=True)
class GemmBenchConfig:
    shapes: tuple[GemmShape, ...]
    dtypes: tuple[str, ...] = ("float32",)
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N
    warmup: int = 3
    iters: int = 10
    repeats: int = 3

    def __post_init__(self) -> None:
        if not self.shapes:
            raise InputError("sizes", "no GEMM shapes to run")
        bad = [d for d in self.dtypes if d not in DTYPES or d.startswith("int")]
        if bad or not self.dtypes:
            raise InputError(
                "dtype", f"unsupported {bad or 'empty list'} (float32, float16, bfloat16, float64)"
            )
        if self.repeats < 1:
            raise InputError("repeats", f"must be >= 1, got {self.repeats}")
        if self.warmup < 0 or self.iters < 1:
            raise InputError("iters", "need warmup >= 0, iters >= 1 and repeats >= 1")


def square_shapes(sizes: Sequence[int], batch: int = 1) -> tuple[GemmShape, ...]:
    return tuple(GemmShape(s, s, s, batch, f"square {s}") for s in sizes)


def transformer_shapes(d: int, s: int, b: int = 1, a: int = 1, t: int = 1) -> tuple[GemmShape, ...]:
    """The forward GEMMs of one GPT layer (Megatron layout, tensor-parallel degree ``t``):
    QKV, attention scores and context (batched over b*a/t heads), projection, MLP up/down."""
    if d % a or a % t or d % t:
        raise InputError("model", f"d={d}, a={a}, t={t}: need d % a == 0 and a % t == 0")
    bs, h = b * s, d // a
    return (
        GemmShape(bs, 3 * d // t, d, 1, "qkv"),
        GemmShape(s, s, h, b * a // t, "attn scores"),
        GemmShape(s, h, s, b * a // t, "attn context"),
        GemmShape(bs, d, d // t, 1, "proj"),
        GemmShape(bs, 4 * d // t, d, 1, "mlp up"),
        GemmShape(bs, d, 4 * d // t, 1, "mlp down"),
    )


def resolve_device(device: str) -> Any:
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise InputError("device", f"'{device}' is not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError("device", "CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise InputError("device", f"'{device}': only cpu and cuda are supported")
    return dev


def device_name(dev: Any) -> str:
    import torch

    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    from calib.ingest.capture.profile import host_info

    return str(host_info()["cpu"])


def run_gemm_bench(
    cfg: GemmBenchConfig, progress: Callable[[dict[str, Any]], None] | None = None
) -> pd.DataFrame:
    """Time every (shape, dtype) of ``cfg``; returns the ``gemm_samples`` table."""
    import torch

    dev = resolve_device(cfg.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    name = device_name(dev)
    rows: list[dict[str, Any]] = []
    for dtype_name in cfg.dtypes:
        dtype = getattr(torch, dtype_name)
        for sh in cfg.shapes:
            lead = (sh.batch,) if sh.batch > 1 else ()
            a = torch.randn(*lead, sh.m, sh.k, device=dev).to(dtype)
            b = torch.randn(*lead, sh.k, sh.n, device=dev).to(dtype)
            c = torch.empty(*lead, sh.m, sh.n, device=dev, dtype=dtype)
            op = functools.partial(torch.bmm if sh.batch > 1 else torch.mm, a, b, out=c)
            for _ in range(cfg.warmup):
                op()
            times = []
            for _ in range(cfg.repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(cfg.iters):
                    op()
                sync()
                times.append((time.perf_counter() - t0) / cfg.iters)
            t = float(np.median(times))
            rows.append(
                {
                    "source": "calib-bench",
                    "device": name,
                    "dtype": dtype_name,
                    "m": sh.m,
                    "n": sh.n,
                    "k": sh.k,
                    "batch": sh.batch,
                    "flops": sh.flops,
                    "time_s": t,
                    "tflops": sh.flops / t / 1e12,
                }
            )
            if progress is not None:
                progress({**rows[-1], "label": sh.label, "spread": (max(times) - min(times)) / t})
            del a, b, c
    return pd.DataFrame(rows)


HEADER = (
    f"{'dtype':>9s} {'label':>13s} {'m':>7s} {'n':>7s} {'k':>7s} {'batch':>6s} {'time(us)':>11s} "
    f"{'TFLOP/s':>9s} {'spread':>7s}"
)


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['dtype']:>9s} {row['label']:>13s} {row['m']:>7d} {row['n']:>7d} {row['k']:>7d} "
        f"{row['batch']:>6d} {row['time_s'] * 1e6:>11.1f} {row['tflops']:>9.4f} {row['spread']:>6.0%}",
        flush=True,
    )
