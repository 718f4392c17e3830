"""Collective bandwidth against message size on the current process group, the way
nccl-tests measures it, so a system without nccl-tests logs can still be calibrated.

Conventions (nccl-tests doc/PERFORMANCE.md): sizes from ``min_bytes`` to ``max_bytes``
multiplied by ``step_factor``; ``warmup`` untimed calls, then ``iters`` back-to-back calls
timed together and divided by ``iters``; the time is averaged over ranks; ``size`` is
the larger of the send and receive buffers; algbw = size / time; busbw = algbw *
``busbw_factor(collective, n)``; a separate checked call counts wrong elements.

torch exposes all-reduce, broadcast and reduce in place only and the others out of
place, so each collective is timed in the one mode torch offers: the in-place columns
(``*_ip``) for allreduce/broadcast/reduce, the out-of-place ones (``*_oop``) for
allgather/reducescatter/alltoall/sendrecv; the other mode's columns are NaN.  On gloo,
reduce-scatter is implemented with an all-reduce: its busbw is an all-reduce's in disguise.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from calib.ingest.capture.units import DTYPES

from calib.core.collective_names import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE,
    REDUCESCATTER,
    SENDRECV,
    busbw_factor,
)
from calib.core.errors import InputError

SUPPORTED = (ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, BROADCAST, REDUCE, SENDRECV)
DEFAULT_COLLECTIVES = (ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, BROADCAST)
IN_PLACE = {ALLREDUCE, BROADCAST, REDUCE}
_REDUCING = {ALLREDUCE, REDUCESCATTER, REDUCE}
_ROOTED = {BROADCAST, REDUCE}
_PER_RANK_CHUNKS = {ALLGATHER, REDUCESCATTER, ALLTOALL}


@dataclass(frozen=True)
class CollectiveBenchConfig:
    """nccl-tests' -b/-e/-f/-d/-w/-n/-c options, under their long names."""

    collectives: tuple[str, ...] = DEFAULT_COLLECTIVES
    min_bytes: int = 1 << 10
    max_bytes: int = 16 << 20
    step_factor: float = 2.0
    dtype: str = "float32"
    warmup: int = 5
    iters: int = 20
    check: bool = True

    def __post_init__(self) -> None:
        bad = [c for c in self.collectives if c not in SUPPORTED]
        if bad or not self.collectives:
            raise InputError(
                "collectives", f"unsupported {bad or 'empty list'} (supported: {', '.join(SUPPORTED)})"
            )
        if not 1 <= self.min_bytes <= self.max_bytes:
            raise InputError(
                "min_bytes", f"must be >= 1 and <= max_bytes ({self.min_bytes} > {self.max_bytes})"
            )
        if not 1.0 < self.step_factor < float("inf"):  # nan/inf would run one size and stop
            raise InputError("step_factor", f"must be a finite number > 1, got {self.step_factor}")
        if self.dtype not in DTYPES:
            raise InputError("dtype", f"unknown dtype '{self.dtype}' (one of {', '.join(DTYPES)})")
        if self.warmup < 0 or self.iters < 1:
            raise InputError("iters", "need warmup >= 0 and iters >= 1")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "collectives": list(self.collectives)}


def message_sizes(cfg: CollectiveBenchConfig) -> list[int]:
    """Sizes in bytes: min, min*f, min*f^2, ... up to max (nccl-tests -b -e -f)."""
    sizes, size = [], float(cfg.min_bytes)
    while size <= cfg.max_bytes * (1 + 1e-9):
        sizes.append(int(size))
        size *= cfg.step_factor
    return sorted(set(sizes))


def element_count(collective: str, nbytes: int, elem_bytes: int, n: int) -> int:
    """Elements of the larger buffer: a multiple of ``n`` where each rank owns a chunk."""
    count = max(nbytes // elem_bytes, 1)
    if collective in _PER_RANK_CHUNKS:
        count = max(count // n, 1) * n
    return count


def _ops(coll: str, count: int, rank: int, n: int, dtype: Any, device: Any, group: Any):
    """(timed op, checking op returning the number of wrong elements) for one size."""
    import torch
    import torch.distributed as dist

    # torch 2.13 renamed the tensor variants (*_single); older torch has only *_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    z = lambda c: torch.zeros(c, dtype=dtype, device=device)  # noqa: E731 - zeros: sums stay finite
    full = lambda c, v: torch.full((c,), float(v), dtype=dtype, device=device)  # noqa: E731
    chunk = count // n

    def wrong(out: Any, expected: Any) -> int:
        return int((~torch.isclose(out.double(), expected.double(), rtol=1e-2, atol=1e-3)).sum())

    def peer_rank(r: int) -> int:  # group rank -> global rank (sendrecv, roots)
        return dist.get_global_rank(group, r) if group is not None else r

    if coll == ALLREDUCE:
        buf = z(count)
        op = lambda: dist.all_reduce(buf, group=group)  # noqa: E731

        def check() -> int:
            x = full(count, rank + 1)
            dist.all_reduce(x, group=group)
            return wrong(x, full(count, n * (n + 1) / 2))
    elif coll == ALLGATHER:
        src, out = z(chunk), z(count)
        op = lambda: all_gather(out, src, group=group)  # noqa: E731

        def check() -> int:
            o = z(count)
            all_gather(o, full(chunk, rank + 1), group=group)
            exp = torch.arange(1, n + 1, dtype=torch.float64, device=device).repeat_interleave(chunk)
            return wrong(o, exp)
    elif coll == REDUCESCATTER:
        src, out = z(count), z(chunk)
        op = lambda: reduce_scatter(out, src, group=group)  # noqa: E731

        def check() -> int:
            o = z(chunk)
            reduce_scatter(o, full(count, rank + 1), group=group)
            return wrong(o, full(chunk, n * (n + 1) / 2))
    elif coll == ALLTOALL:
        src, out = z(count), z(count)
        op = lambda: dist.all_to_all_single(out, src, group=group)  # noqa: E731

        def check() -> int:
            # chunk j of rank r carries (r*n + j) % 61 + 1 and must land as chunk r on rank j
            j = torch.arange(n, dtype=torch.float64, device=device)
            x = ((rank * n + j) % 61 + 1).repeat_interleave(chunk).to(dtype)
            o = z(count)
            dist.all_to_all_single(o, x, group=group)
            exp = ((j * n + rank) % 61 + 1).repeat_interleave(chunk)
            return wrong(o, exp)
    elif coll == BROADCAST:
        buf = z(count)
        op = lambda: dist.broadcast(buf, src=peer_rank(0), group=group)  # noqa: E731

        def check() -> int:
            x = full(count, 1.0 if rank == 0 else 0.0)
            dist.broadcast(x, src=peer_rank(0), group=group)
            return wrong(x, full(count, 1.0))
    elif coll == REDUCE:
        buf = z(count)
        op = lambda: dist.reduce(buf, dst=peer_rank(0), group=group)  # noqa: E731

        def check() -> int:
            x = full(count, rank + 1)
            dist.reduce(x, dst=peer_rank(0), group=group)
            return wrong(x, full(count, n * (n + 1) / 2)) if rank == 0 else 0
    else:  # SENDRECV: a ring, each rank sends to rank+1 and receives from rank-1
        src, out = z(count), z(count)
        nxt, prv = peer_rank((rank + 1) % n), peer_rank((rank - 1) % n)

        def op() -> None:
            reqs = dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, src, nxt, group), dist.P2POp(dist.irecv, out, prv, group)]
            )
            for r in reqs:
                r.wait()

        def check() -> int:
            x, o = full(count, rank + 1), z(count)
            for r in dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, x, nxt, group), dist.P2POp(dist.irecv, o, prv, group)]
            ):
                r.wait()
            return wrong(o, full(count, (rank - 1) % n + 1))

    return op, check


def _sync(device: Any) -> Callable[[], None]:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def bench_device(backend: str) -> Any:
    """The tensor device a backend communicates from: this rank's GPU for NCCL, else CPU."""
    import torch

    if backend in ("nccl", "rccl") or (backend != "gloo" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def run_collective_bench(
    cfg: CollectiveBenchConfig,
    group: Any = None,
    *,
    file: str = "calib-bench",
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> pd.DataFrame:
    """Benchmark ``cfg`` on ``group`` (default: the world); every rank must call it.

    Returns the ``samples`` table (calib.core.schema.SAMPLES), identical on every rank.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise InputError(
            "process group", "none initialised: launch with torchrun, or spawn local ranks (nproc)"
        )
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    backend = str(dist.get_backend(group))
    device = bench_device(backend)
    dtype = getattr(torch, cfg.dtype)
    elem = DTYPES[cfg.dtype]
    sync = _sync(device)
    local_n = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    nccl_version = ""
    if device.type == "cuda":
        nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())

    rows: list[dict[str, Any]] = []
    for coll in cfg.collectives:
        for size in message_sizes(cfg):
            count = element_count(coll, size, elem, n)
            op, check = _ops(coll, count, rank, n, dtype, device, group)
            for _ in range(cfg.warmup):
                op()
            sync()
            dist.barrier(group)
            t0 = time.perf_counter()
            for _ in range(cfg.iters):
                op()
            sync()
            dt = (time.perf_counter() - t0) / cfg.iters
            bad = check() if cfg.check else -1
            rows.append(
                {"collective": coll, "bytes": count * elem, "count": count, "time_s": dt, "wrong": bad}
            )
            if progress is not None and rank == 0:
                progress(rows[-1])

    # nccl-tests -a 1: the reported time is the mean over ranks; #wrong is summed
    times = torch.tensor([r["time_s"] for r in rows], dtype=torch.float64, device=device)
    wrongs = torch.tensor([max(r["wrong"], 0) for r in rows], dtype=torch.float64, device=device)
    dist.all_reduce(times, group=group)
    dist.all_reduce(wrongs, group=group)
    df = pd.DataFrame(rows)
    df["time_s"] = times.cpu().numpy() / n
    df["wrong"] = np.where(cfg.check, wrongs.cpu().numpy().astype(np.int64), -1)
    return to_samples(
        df,
        n=n,
        nnodes=max(n // max(local_n, 1), 1),
        gpus_per_node=min(local_n, n),
        dtype=cfg.dtype,
        file=file,
        nccl_version=nccl_version,
    )


def to_samples(
    df: pd.DataFrame, *, n: int, nnodes: int, gpus_per_node: int, dtype: str, file: str, nccl_version: str
) -> pd.DataFrame:
    """Columns (collective, bytes, count, time_s, wrong) into the SAMPLES schema."""
    coll = df["collective"].to_numpy(dtype=object)
    time_us = df["time_s"].to_numpy(float) * 1e6
    algbw = df["bytes"].to_numpy(float) / (time_us * 1e-6) / 1e9
    busbw = algbw * busbw_factor(coll, n)
    ip = np.isin(coll, list(IN_PLACE))
    nan = np.full(len(df), np.nan)
    return pd.DataFrame(
        {
            "source": "calib-bench",
            "file": file,
            "setup": np.int32(-1),
            "collective": coll,
            "bytes": df["bytes"].to_numpy(np.int64),
            "count": df["count"].to_numpy(np.int64),
            "dtype": dtype,
            "redop": np.where(np.isin(coll, list(_REDUCING)), "sum", "none"),
            "root": np.where(np.isin(coll, list(_ROOTED)), 0, -1).astype(np.int32),
            "nranks": np.int32(n),
            "nnodes": np.int32(nnodes),
            "gpus_per_node": np.int32(gpus_per_node),
            "time_oop_us": np.where(ip, nan, time_us),
            "algbw_oop_gbps": np.where(ip, nan, algbw),
            "busbw_oop_gbps": np.where(ip, nan, busbw),
            "time_ip_us": np.where(ip, time_us, nan),
            "algbw_ip_gbps": np.where(ip, algbw, nan),
            "busbw_ip_gbps": np.where(ip, busbw, nan),
            "wrong": df["wrong"].to_numpy(np.int64),
            "nccl_version": nccl_version,
        }
    )


def _local_rank_main(
    rank: int, world_size: int, init_file: str, cfg_json: dict[str, Any], result: str, verbose: bool
) -> None:
    """One spawned rank of :func:`bench_collectives_local`; rank 0 saves the table."""
    from calib.ingest.capture.launch import init_local_rank

    threads = max(1, (os.cpu_count() or 1) // world_size)
    init_local_rank(rank, world_size, init_file, threads=threads)
    import torch.distributed as dist

    cfg = CollectiveBenchConfig(**{**cfg_json, "collectives": tuple(cfg_json["collectives"])})
    try:
        df = run_collective_bench(cfg, progress=print_row if verbose else None)
        if rank == 0:
            df.to_parquet(result)
    finally:
        dist.destroy_process_group()


def bench_collectives_local(cfg: CollectiveBenchConfig, nproc: int, *, verbose: bool = False) -> pd.DataFrame:
    """Spawn ``nproc`` local gloo ranks, benchmark, and return the samples table."""
    import tempfile
    from pathlib import Path

    from calib.ingest.capture.launch import spawn_local

    with tempfile.TemporaryDirectory(prefix="calib-bench-") as tmp:
        result = str(Path(tmp) / "samples.parquet")
        spawn_local(_local_rank_main, nproc, cfg.to_json(), result, verbose)
        df = pd.read_parquet(result)
    df["file"] = "calib-bench"
    return df


HEADER = (
    f"{'collective':>14s} {'size(B)':>12s} {'count':>10s} {'time(us)':>11s} {'algbw(GB/s)':>12s} "
    f"{'busbw(GB/s)':>12s} {'#wrong':>7s}"
)


def print_row(row: dict[str, Any]) -> None:
    """Progress line of one measured size (rank 0, before averaging over ranks)."""
    t = row["time_s"]
    print(
        f"{row['collective']:>14s} {row['bytes']:>12d} {row['count']:>10d} {t * 1e6:>11.1f} "
        f"{row['bytes'] / t / 1e9:>12.4f} {'':>12s} {row['wrong']:>7d}",
        flush=True,
    )


def format_samples(df: pd.DataFrame) -> str:
    """The final table (times averaged over ranks), nccl-tests style."""
    lines = [HEADER]
    ip = df["time_ip_us"].notna().to_numpy()
    t = np.where(ip, df["time_ip_us"], df["time_oop_us"])
    alg = np.where(ip, df["algbw_ip_gbps"], df["algbw_oop_gbps"])
    bus = np.where(ip, df["busbw_ip_gbps"], df["busbw_oop_gbps"])
    for c, b, n, ti, a, bb, w in zip(df["collective"], df["bytes"], df["count"], t, alg, bus, df["wrong"]):
        lines.append(f"{c:>14s} {b:>12d} {n:>10d} {ti:>11.1f} {a:>12.4f} {bb:>12.4f} {w:>7d}")
    return "\n".join(lines)
