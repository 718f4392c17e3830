"""``calib bench``: collective and GEMM microbenchmarks, stored like nccl-tests samples."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import click

from calib.commands.options import on_wait, replace_option, run_exists
from calib.core.errors import InputError

_STORE_HELP = "Store directory (default: $CALIB_STORE or ./calib-store)."


@click.group("bench")
def bench() -> None:
    """Microbenchmarks that calibrate a system without nccl-tests logs.

    \b
    Results go to the store as a run of kind "bench" (<store>/<system>/runs/<name>/),
    next to ingested traces and nccl-tests samples, where `calib fit` finds them:
      calib bench collectives --nproc 2 --system laptop           # N local gloo ranks
      torchrun --nproc-per-node 8 -m calib.cli bench collectives --system dgx-h100
      calib bench gemm --system laptop --sizes 256,512,1024
    """


@dataclass(frozen=True)
class _Dest:
    """Where the results go: the store, and whether an existing run of the name is replaced."""

    store: Path
    replace: bool = False


def _store(store: str | None, replace: bool = False) -> _Dest:
    from calib.core.store import default_store

    return _Dest(Path(store) if store else default_store(), replace)


def _target(dest: _Dest, system: str | None, name: str) -> Path:
    """Refuse a taken name before the benchmark runs (as ``calib ingest`` does)."""
    from calib.core.rundir import RunExists
    from calib.core.store import check_name, check_new_run

    if system is not None:
        check_name("system", system)
    try:
        return check_new_run(dest.store, system, name, replace=dest.replace)
    except RunExists as exc:
        raise run_exists(exc.target) from None


def _save(dest: _Dest, system: str | None, name: str, table: str, df, **meta) -> Path:  # noqa: ANN001
    from calib.commands.bench_record import write_bench_run
    from calib.core.rundir import RunExists

    try:
        return write_bench_run(
            dest.store, system, name, table, df, replace=dest.replace, on_wait=on_wait, **meta
        )
    except RunExists as exc:
        raise run_exists(exc.target) from None


@bench.command("collectives")
@click.option(
    "--nproc",
    type=int,
    default=None,
    help="Spawn this many local ranks with a gloo process group (without torchrun).",
)
@click.option(
    "--collectives",
    default="allreduce,allgather,reducescatter,alltoall,broadcast",
    show_default=True,
    help="Comma list from allreduce, allgather, reducescatter, alltoall, broadcast, reduce, sendrecv.",
)
@click.option(
    "-b", "--min-bytes", default="1K", show_default=True, help="Smallest message, bytes (K/M/G = 1024^n)."
)
@click.option("-e", "--max-bytes", default="16M", show_default=True, help="Largest message, bytes.")
@click.option(
    "-f", "--step-factor", type=float, default=2.0, show_default=True, help="Size multiplier per step."
)
@click.option(
    "-d", "--dtype", default="float32", show_default=True, help="Element type (float32, bfloat16, ...)."
)
@click.option("-w", "--warmup", type=int, default=5, show_default=True, help="Untimed calls per size.")
@click.option("-n", "--iters", type=int, default=20, show_default=True, help="Timed calls per size.")
@click.option("--check/--no-check", default=True, show_default=True, help="Count wrong elements (#wrong).")
@click.option(
    "--backend",
    default="auto",
    show_default=True,
    help="Under torchrun: nccl, gloo, or auto (nccl when CUDA is available).",
)
@click.option("--system", default=None, help="System the samples belong to (default: unassigned).")
@click.option("--name", default=None, help="Run name (default: coll-<backend>-n<N>-<host>-<time>).")
@click.option("--store", default=None, help=_STORE_HELP)
@replace_option
def collectives(
    nproc: int | None,
    collectives: str,
    min_bytes: str,
    max_bytes: str,
    step_factor: float,
    dtype: str,
    warmup: int,
    iters: int,
    check: bool,
    backend: str,
    system: str | None,
    name: str | None,
    store: str | None,
    replace: bool,
) -> None:
    """Collective bus bandwidth against message size (nccl-tests conventions).

    \b
    Runs on the current process group: launch under torchrun (NCCL on GPUs, gloo on
    CPU), or give --nproc N to spawn N local gloo ranks.  For each collective and size
    (-b to -e, times -f): -w warm-up calls, then -n calls timed together; time is the
    mean over ranks, algbw = size / time (GB/s = 1e9 B/s), busbw = algbw x the
    nccl-tests factor (2(n-1)/n all-reduce, (n-1)/n all-gather, reduce-scatter,
    all-to-all, 1 broadcast/reduce/sendrecv).  torch's all-reduce, broadcast and reduce
    are in place (stored in the *_ip columns), the others out of place (*_oop).
    """
    from calib.core.collective_names import canonical
    from calib.ingest.capture.bench_collectives import CollectiveBenchConfig
    from calib.ingest.capture.units import parse_bytes, parse_dtype, parse_list

    names = tuple(
        canonical(c) if canonical(c) != "unknown" else c for c in parse_list(collectives, "--collectives")
    )
    cfg = CollectiveBenchConfig(
        collectives=names,
        min_bytes=parse_bytes(min_bytes, "--min-bytes"),
        max_bytes=parse_bytes(max_bytes, "--max-bytes"),
        step_factor=step_factor,
        dtype=parse_dtype(dtype, "--dtype"),
        warmup=warmup,
        iters=iters,
        check=check,
    )
    if backend not in ("auto", "nccl", "gloo"):
        raise InputError("--backend", f"'{backend}' is not nccl, gloo or auto")
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    store_dir = _store(store, replace)
    if nproc is not None:
        if under_launcher:
            raise InputError(
                "--nproc", "already running under a launcher (RANK/WORLD_SIZE set); drop --nproc"
            )
        if not 1 <= nproc <= 256:
            raise InputError("--nproc", f"must be between 1 and 256, got {nproc}")
        _run_local(cfg, nproc, system, name, store_dir)
    elif under_launcher:
        _run_launched(cfg, backend, system, name, store_dir)
    else:
        raise InputError(
            "--nproc",
            "no process group: launch with torchrun (e.g. torchrun --nproc-per-node 8 "
            "-m calib.cli bench collectives ...) or pass --nproc N for N local gloo ranks",
        )


def _notes(cfg, backend: str, n: int) -> list[str]:  # noqa: ANN001
    notes = [
        f"calib bench collectives: {backend}, {n} ranks, dtype {cfg.dtype}, warmup {cfg.warmup}, "
        f"iters {cfg.iters}, sizes {cfg.min_bytes}..{cfg.max_bytes} x{cfg.step_factor:g}",
        "allreduce/broadcast/reduce are in place in torch: their times are in the *_ip columns, *_oop NaN",
    ]
    if backend == "gloo":
        notes.append("gloo implements reduce_scatter with an all-reduce")
    if n == 1:
        notes.append("one rank: bus bandwidth is 0 for all-reduce/all-gather/reduce-scatter by definition")
    return notes


def _finish(df, cfg, backend: str, n: int, system: str | None, name: str, store: _Dest, devices) -> None:  # noqa: ANN001
    from calib.core.schema import conform
    from calib.ingest.capture.bench_collectives import format_samples

    conform("samples", df)  # schema check before anything is written
    click.echo(format_samples(df))
    path = _save(
        store,
        system,
        name,
        "samples",
        df,
        world_size=n,
        backend=backend,
        devices=devices,
        notes=_notes(cfg, backend, n),
    )
    click.echo(f"wrote {len(df)} samples to {path}")


def _run_local(cfg, nproc: int, system: str | None, name: str | None, store: _Dest) -> None:  # noqa: ANN001
    from calib.commands.bench_record import default_name
    from calib.ingest.capture.bench_collectives import HEADER, bench_collectives_local
    from calib.ingest.capture.profile import host_info

    name = name or default_name(f"coll-gloo-n{nproc}")
    _target(store, system, name)
    click.echo(f"# {nproc} local gloo ranks; progress below is rank 0's own time")
    click.echo(HEADER)
    try:
        df = bench_collectives_local(cfg, nproc, verbose=True)
    except RuntimeError as exc:
        raise InputError("--nproc", f"the benchmark ranks failed: {exc}") from None
    click.echo("# mean over ranks:")
    _finish(df, cfg, "gloo", nproc, system, name, store, (str(host_info()["cpu"]),))


def _run_launched(cfg, backend: str, system: str | None, name: str | None, store: _Dest) -> None:  # noqa: ANN001
    import torch
    import torch.distributed as dist

    from calib.commands.bench_record import default_name
    from calib.ingest.capture.bench_collectives import HEADER, bench_device, print_row, run_collective_bench

    created = not dist.is_initialized()
    if created:
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    try:
        backend = str(dist.get_backend())
        n, rank = dist.get_world_size(), dist.get_rank()
        name = name or default_name(f"coll-{backend}-n{n}")
        if rank == 0:
            _target(store, system, name)
            click.echo(HEADER)
        df = run_collective_bench(cfg, progress=print_row)
        if rank == 0:
            dev = bench_device(backend)
            devices = (torch.cuda.get_device_name(dev),) if dev.type == "cuda" else ("cpu",)
            click.echo("# mean over ranks:")
            _finish(df, cfg, backend, n, system, name, store, devices)
    finally:
        if created:
            dist.destroy_process_group()


@bench.command("gemm")
@click.option(
    "--sizes",
    default=None,
    help="Square sizes m=n=k, comma list (default 128..1024 on CPU, 1024..8192 on GPU).",
)
@click.option("--shape", "shapes", multiple=True, help="A GEMM MxNxK (repeatable); replaces --sizes.")
@click.option(
    "--model",
    default=None,
    help="The GEMMs of one GPT layer: d=,s=,b=,a=[,t=] (hidden, sequence, micro-batch, heads, TP degree).",
)
@click.option(
    "--batch",
    type=int,
    default=1,
    show_default=True,
    help="Batch of independent GEMMs (bmm) for --sizes/--shape.",
)
@click.option(
    "--dtype", default=None, help="Comma list (default float32 on CPU, bfloat16,float16,float32 on GPU)."
)
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--threads", type=int, default=None, help="CPU threads for torch (default: torch's).")
@click.option("-w", "--warmup", type=int, default=3, show_default=True, help="Untimed calls per shape.")
@click.option("-n", "--iters", type=int, default=10, show_default=True, help="Calls per timed repeat.")
@click.option(
    "-r", "--repeats", type=int, default=3, show_default=True, help="Timed repeats; the median is kept."
)
@click.option("--system", default=None, help="System the samples belong to (default: unassigned).")
@click.option("--name", default=None, help="Run name (default: gemm-<device>-<host>-<time>).")
@click.option("--store", default=None, help=_STORE_HELP)
@replace_option
def gemm(
    sizes: str | None,
    shapes: tuple[str, ...],
    model: str | None,
    batch: int,
    dtype: str | None,
    device: str,
    threads: int | None,
    warmup: int,
    iters: int,
    repeats: int,
    system: str | None,
    name: str | None,
    store: str | None,
    replace: bool,
) -> None:
    """Matmul throughput against shape and dtype: TFLOP/s = 2*m*n*k*batch / time / 1e12.

    Each shape: -w warm-up calls, then -r repeats of -n back-to-back calls between two
    device synchronisations; time is the median repeat's mean call (seconds).  The
    'spread' column is (slowest - fastest repeat) / median: large on a busy host.
    """
    from calib.commands.bench_record import default_name
    from calib.core.schema import conform
    from calib.ingest.capture.bench_gemm import (
        HEADER,
        GemmBenchConfig,
        GemmShape,
        device_name,
        print_row,
        resolve_device,
        run_gemm_bench,
        square_shapes,
        transformer_shapes,
    )
    from calib.ingest.capture.units import (
        parse_dtype,
        parse_kv_ints,
        parse_list,
        parse_positive_ints,
        parse_shape,
    )

    if batch < 1:
        raise InputError("--batch", f"must be >= 1, got {batch}")
    if threads is not None and threads < 1:
        raise InputError("--threads", f"must be >= 1, got {threads}")
    dev = resolve_device(device)
    gpu = dev.type == "cuda"
    if model:
        kv = parse_kv_ints(model, "--model", ("d", "s", "b", "a", "t"))
        if "d" not in kv or "s" not in kv:
            raise InputError("--model", "needs at least d= and s=")
        shape_list = transformer_shapes(kv["d"], kv["s"], kv.get("b", 1), kv.get("a", 1), kv.get("t", 1))
    elif shapes:
        shape_list = tuple(GemmShape(*parse_shape(s, "--shape"), batch) for s in shapes)
    else:
        default = "1024,2048,4096,8192" if gpu else "128,256,512,1024"
        shape_list = square_shapes(parse_positive_ints(sizes or default, "--sizes"), batch)
    dtypes = tuple(
        parse_dtype(d, "--dtype")
        for d in parse_list(dtype or ("bfloat16,float16,float32" if gpu else "float32"), "--dtype")
    )
    cfg = GemmBenchConfig(
        shapes=shape_list, dtypes=dtypes, device=str(dev), warmup=warmup, iters=iters, repeats=repeats
    )
    store_dir = _store(store, replace)
    name = name or default_name(f"gemm-{dev.type}")
    _target(store_dir, system, name)
    import torch

    if threads:
        torch.set_num_threads(threads)
    click.echo(HEADER)
    df = run_gemm_bench(cfg, progress=print_row)
    conform("gemm_samples", df)
    notes = [
        f"calib bench gemm: warmup {warmup}, iters {iters}, repeats {repeats} (median)",
        f"torch {torch.__version__}" + ("" if gpu else f", {torch.get_num_threads()} CPU threads"),
    ]
    path = _save(
        store_dir,
        system,
        name,
        "gemm_samples",
        df,
        world_size=1,
        backend=None,
        devices=(device_name(dev),),
        notes=notes,
    )
    click.echo(f"wrote {len(df)} GEMM samples to {path}")
