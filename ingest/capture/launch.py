"""Spawn N local ranks with a real gloo process group (the ``--nproc`` convenience).

Ranks rendezvous through a file store in a private temporary directory, so no TCP port
has to be found free (and no race with another job on the machine).  A failure in any
rank is re-raised in the parent with that rank's message.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def init_local_rank(rank: int, world_size: int, init_file: str, threads: int | None = None) -> None:
    """Inside a spawned rank: set the launcher environment, threads, and join the gloo group."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
    )
    import torch
    import torch.distributed as dist

    if threads:
        torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)


def _entry(rank: int, fn: Callable[..., Any], world_size: int, init_file: str, args: tuple[Any, ...]) -> None:
    fn(rank, world_size, init_file, *args)


#: imported once by the fork server, so each rank starts in a fraction of a second
#: instead of paying ``import torch`` (seconds on a busy 2-core machine) per rank and run
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "torch.profiler", "calib.ingest.capture.train"]


def _start_method() -> str:
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    return "forkserver"


def spawn_local(fn: Callable[..., Any], nprocs: int, *args: Any, start_method: str | None = None) -> None:
    """Run ``fn(rank, world_size, init_file, *args)`` in ``nprocs`` fresh processes.

    ``fn`` must be importable (a module-level function); it calls :func:`init_local_rank`.
    Processes come from a fork server that has torch imported (spawn where there is none,
    or when ``start_method`` says so).
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="calib-spawn-") as tmp:
        init_file = str(Path(tmp) / "store")
        try:
            mp.start_processes(
                _entry,
                args=(fn, nprocs, init_file, args),
                nprocs=nprocs,
                join=True,
                start_method=start_method or _start_method(),
            )
        except mp.ProcessRaisedException as exc:
            msg = str(exc).strip().splitlines()
            last = next((ln for ln in reversed(msg) if ln.strip()), "failed")
            raise RuntimeError(f"a spawned rank failed: {last}") from exc
        except mp.ProcessExitedException as exc:
            raise RuntimeError(f"a spawned rank died: {exc}") from exc
