"""Run the per-rank ingest (:func:`ingest.orchestrate.ingest_rank`) on many traces at once.

``ingest_rank`` is pure (file in, tables out), so how it is driven is a choice of
executor, and every executor gives the same run:

- ``serial``: a loop, in this process.
- ``local``: a process pool on this machine (``--jobs N``).  Workers are forked from a
  forkserver that has the ingest modules imported, so each starts in milliseconds and
  none inherits the parent's threads.
- ``dask``: Dask distributed (``--executor dask``): a ``LocalCluster`` of N worker
  processes, or the cluster at ``--scheduler ADDRESS`` (e.g. one started with
  dask-jobqueue on Polaris).  Workers must see the trace paths (a shared filesystem)
  and have calib installed.  Dask is imported only here, only when asked for.

The memory budget (``--max-memory``) is split between concurrent workers; each worker
streams the traces that would not fit its share (``ingest.stream``).  Bad input in any
rank stops the run with that rank's one-line error; the other ranks are cancelled.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path

from calib.ingest.budget import MemoryBudget, default_budget
from calib.ingest.rules import DEFAULT_RULES, Rules

from calib.core.errors import InputError

EXECUTORS = ("local", "dask")
#: Dask pauses a worker at 80 % of its memory limit: keep a task's budget below that
DASK_MEMORY_SHARE = 0.75

Progress = Callable[[Iterable], Iterable]


@dataclass(frozen=True)
class RankJob:
    """One trace to ingest, with everything the worker needs (picklable)."""

    path: Path
    rank_hint: int
    rules: Rules = DEFAULT_RULES
    memory_budget_bytes: int | None = None


@dataclass(frozen=True)
class ExecutorSpec:
    """How to run the rank jobs: ``--executor``, ``--jobs``, ``--scheduler``, ``--max-memory``."""

    kind: str = "local"  # "local" (serial when jobs == 1) or "dask"
    jobs: int = 1
    scheduler: str | None = None
    memory: MemoryBudget | None = None  # None: no streaming decision (in memory always)
    memory_from_user: bool = False

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise InputError("executor", f"unknown executor '{self.kind}' (known: {', '.join(EXECUTORS)})")
        if self.jobs < 1:
            raise InputError("jobs", f"must be at least 1, got {self.jobs}")
        if self.scheduler and self.kind != "dask":
            raise InputError("scheduler", "only applies to the dask executor")


@dataclass
class _Outcome:
    """A worker's answer: a result, or bad input as (where, problem) -- an InputError
    does not survive pickling as itself, so it travels as its two fields."""

    index: int
    result: object | None = None
    error: tuple[str | None, str] | None = None


def parse_jobs(text: str | int | None) -> int:
    """``--jobs``: a positive integer, or ``auto`` for every core this process may use."""
    if text is None:
        return 1
    if str(text).strip().lower() == "auto":
        return cpu_count()
    try:
        n = int(text)
    except ValueError:
        raise InputError("jobs", f"expected a positive integer or 'auto', got '{text}'") from None
    if n < 1:
        raise InputError("jobs", f"must be at least 1, got {n}")
    return n


def cpu_count() -> int:
    """Cores this process may run on (respects taskset/cgroup cpusets, unlike os.cpu_count)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def run_job(index: int, job: RankJob) -> _Outcome:
    """The worker side: ingest one rank.  Module-level so every executor can ship it."""
    from calib.ingest.orchestrate import ingest_rank

    try:
        result = ingest_rank(job.path, job.rank_hint, job.rules, memory_budget_bytes=job.memory_budget_bytes)
    except InputError as exc:
        return _Outcome(index, error=(exc.where, exc.problem))
    return _Outcome(index, result=result)


def run_jobs(jobs: Sequence[RankJob], spec: ExecutorSpec, progress: Progress | None = None) -> list:
    """Ingest every job with the executor of ``spec``; results in the order of ``jobs``."""
    if not jobs:
        return []
    if spec.kind == "dask":
        return _run_dask(jobs, spec, progress)
    workers = min(spec.jobs, len(jobs))
    jobs = _with_budget(jobs, spec.memory.per_worker(workers) if spec.memory else None)
    if workers == 1:
        outcomes = (run_job(i, j) for i, j in enumerate(jobs))
        return _collect(_Sized(outcomes, len(jobs)), len(jobs), progress)
    return _run_pool(jobs, workers, progress)


def _with_budget(jobs: Sequence[RankJob], per_task: int | None) -> list[RankJob]:
    return [replace(j, memory_budget_bytes=per_task) if per_task is not None else j for j in jobs]


def _collect(outcomes: Iterable[_Outcome], n: int, progress: Progress | None) -> list:
    results: list = [None] * n
    for out in progress(outcomes) if progress else outcomes:
        if out.error is not None:
            raise InputError(*out.error)
        results[out.index] = out.result
    return results


class _Sized:
    """An iterator with a length, so progress bars know their total."""

    def __init__(self, it: Iterator, n: int) -> None:
        self._it, self._n = it, n

    def __iter__(self) -> Iterator:
        return self._it

    def __len__(self) -> int:
        return self._n


def _mp_context() -> multiprocessing.context.BaseContext:
    """A forkserver with ingest preloaded; plain fork when the caller's main module is
    not a file (``python -``, ``python -c``), which a forkserver child would re-import."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file is not None and not Path(main_file).is_file():
        return multiprocessing.get_context("fork")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["calib.ingest.orchestrate", "calib.ingest.stream"])
    return ctx


def _run_pool(jobs: Sequence[RankJob], workers: int, progress: Progress | None) -> list:
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context())
    futures = [pool.submit(run_job, i, j) for i, j in enumerate(jobs)]

    def done_in_order_of_completion() -> Iterator[_Outcome]:
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                try:
                    yield f.result()
                except BrokenProcessPool:
                    # a worker was killed (the kernel's OOM killer, a signal): say so in one line
                    raise InputError(
                        "jobs",
                        f"a worker process died while ingesting {jobs[futures.index(f)].path} "
                        "(killed, or out of memory: give fewer jobs or a smaller memory budget)",
                    ) from None

    try:
        return _collect(_Sized(done_in_order_of_completion(), len(jobs)), len(jobs), progress)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_dask(jobs: Sequence[RankJob], spec: ExecutorSpec, progress: Progress | None) -> list:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
        from distributed.scheduler import KilledWorker
    except ImportError:
        raise InputError(
            "executor", "dask is not installed; install it with: pip install 'calib[dask]'"
        ) from None
    cluster = None
    if spec.scheduler:
        try:
            client = Client(spec.scheduler)  # waits distributed.comm.timeouts.connect (30 s)
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError("scheduler", f"cannot connect to {spec.scheduler}: {exc}") from None
        per_task = _remote_budget(client, spec)
    else:
        budget = spec.memory or default_budget()
        per_worker = budget.per_worker(min(spec.jobs, len(jobs)))
        cluster = LocalCluster(
            n_workers=min(spec.jobs, len(jobs)),
            threads_per_worker=1,
            processes=True,
            memory_limit=per_worker,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        client = Client(cluster)
        per_task = int(per_worker * DASK_MEMORY_SHARE)
    try:
        jobs = _with_budget(jobs, per_task)
        futures = [client.submit(run_job, i, j, pure=False) for i, j in enumerate(jobs)]
        index = {f.key: i for i, f in enumerate(futures)}

        def outcomes() -> Iterator[_Outcome]:
            for f in as_completed(futures):
                try:
                    yield f.result()
                except KilledWorker:
                    raise InputError(
                        "executor",
                        f"Dask workers kept dying while ingesting {jobs[index[f.key]].path} "
                        "(out of memory?); give the workers more memory or a smaller memory budget",
                    ) from None

        try:
            return _collect(_Sized(outcomes(), len(jobs)), len(jobs), progress)
        finally:
            client.cancel(futures)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _remote_budget(client, spec: ExecutorSpec) -> int | None:
    """Per-task budget on a remote cluster: each worker's memory limit per thread.

    ``--max-memory`` given explicitly caps it (it then means: per Dask worker).
    """
    limits = []
    for w in client.scheduler_info(n_workers=-1).get("workers", {}).values():
        limit, threads = w.get("memory_limit") or 0, max(w.get("nthreads") or 1, 1)
        if limit > 0:
            limits.append(limit * DASK_MEMORY_SHARE / threads)
    per_task = int(min(limits)) if limits else None
    if spec.memory is not None and spec.memory_from_user:
        per_task = min(per_task or spec.memory.total_bytes, spec.memory.total_bytes)
    return per_task


__all__ = ["EXECUTORS", "ExecutorSpec", "RankJob", "cpu_count", "parse_jobs", "run_job", "run_jobs"]
