"""Profile N steps of a user's own training loop with calibration-ready settings.

::

    from calib.capture import capture

    with capture("traces/gpt-1b-z3", system="polaris", model=dict(d=2048, l=24, a=16, s=2048, V=50304, b=4),
                 framework="deepspeed", zero_stage=3) as cap:
        for batch in loader:
            train_step(batch)
            cap.step()            # once per optimizer step, on every rank
            if cap.done:
                break

What "calibration-ready" means, and why each setting is there:

* a wait/warmup/active schedule, so the trace holds ``ProfilerStep#N`` windows of whole,
  steady-state iterations (the unit every bucket of seed 004 is measured in);
* ``record_shapes=True``: GEMM FLOPs and gloo message sizes come from ``Input Dims``;
  NCCL collectives add their ``Collective name``/``In msg nelems``/``Group size`` args
  on their own (``record_param_comms``);
* CPU and, when CUDA is available, CUDA activities; no stacks or memory (overhead);
* one file per rank, ``rank<R>.pt.trace.json.gz``, written through a temporary name;
* the system tag, rank, world size and model shape inside each trace (a top-level
  ``"calib"`` object) and in ``run_config.json`` (see :mod:`ingest.capture.runconfig`).

torch is imported when a capture starts, never at ``import ingest``.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from calib.ingest.capture.runconfig import (
    TRACE_META_FORMAT,
    TRACE_META_KEY,
    trace_name,
    write_run_config,
)

from calib.core.atomic import replacing_file
from calib.core.errors import InputError


@dataclass(frozen=True)
class CaptureSettings:
    """The profiler window and options (defaults are the calibration-ready ones).

    ``wait`` steps run unprofiled (let the first, slow iterations pass), ``warmup`` are
    profiled and discarded (profiler start-up cost), ``active`` are recorded.
    """

    wait: int = 1
    warmup: int = 1
    active: int = 3
    record_shapes: bool = True
    with_stack: bool = False
    with_modules: bool = False
    profile_memory: bool = False
    cuda: bool | None = None  # None: profile CUDA when torch.cuda.is_available()
    power: bool | None = None  # None: sample GPU power and clocks (NVML) when pynvml and a GPU are there

    def __post_init__(self) -> None:
        if self.wait < 0 or self.warmup < 0 or self.active < 1:
            raise InputError("capture settings", "wait and warmup must be >= 0 and active >= 1")

    @property
    def window_steps(self) -> int:
        return self.wait + self.warmup + self.active


def _dist_rank_world() -> tuple[int, int, str | None]:
    """(rank, world size, backend) of the default process group, else of the launcher's
    environment (torchrun, Slurm), else a single process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("PMI_RANK", "PMI_SIZE")):
        if r in os.environ and w in os.environ:
            return int(os.environ[r]), int(os.environ[w]), None
    return 0, 1, None


def versions() -> dict[str, str | None]:
    """Versions of what produced a trace (python, torch, deepspeed when imported, calib)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("torch", "deepspeed", "calib"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def host_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        load = [round(x, 2) for x in os.getloadavg()]  # a busy machine stretches every timing
    except OSError:
        load = None
    return {"hostname": socket.gethostname(), "cpu": cpu, "cpu_count": os.cpu_count(), "loadavg": load}


class Capture:
    """A running capture; use it through :func:`capture` (a context manager).

    Call :meth:`step` once per training step on every rank.  :attr:`done` turns True
    once the active window is recorded; further steps are only timed.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        system: str | None = None,
        settings: CaptureSettings | None = None,
        name: str | None = None,
        model: Mapping[str, Any] | None = None,
        framework: str | None = None,
        zero_stage: int | None = None,
        sharding_strategy: str | None = None,
        parallel: Mapping[str, int] | None = None,
        extra: Mapping[str, Any] | None = None,
        gather_step_times: bool = True,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.settings = settings or CaptureSettings()
        self.system = system
        self.name = name or self.out_dir.name
        self.model = dict(model or {})
        self.framework = {"name": framework, "zero_stage": zero_stage, "sharding_strategy": sharding_strategy}
        self.parallel = dict(parallel or {})
        self.extra = dict(extra or {})
        self.gather_step_times = gather_step_times
        self.step_times_s: list[float] = []
        self.trace_path: Path | None = None
        self._prof: Any = None
        self._t_last = 0.0
        self._rank, self._world, self._backend = 0, 1, None
        self._activities_names: list[str] = []
        self._power: Any = None
        self.power_info: dict[str, Any] = {}

    # -- metadata -------------------------------------------------------------------------
    def _trace_meta(self) -> dict[str, Any]:
        return {
            "format": TRACE_META_FORMAT,
            "system": self.system,
            "run": self.name,
            "rank": self._rank,
            "world_size": self._world,
            "model": self.model,
            "framework": self.framework,
            "parallel": self.parallel,
            "profiler": self._profiler_json(),
        }

    def _profiler_json(self) -> dict[str, Any]:
        s = self.settings
        first = s.wait + s.warmup
        return {
            "wait": s.wait,
            "warmup": s.warmup,
            "active": s.active,
            "record_shapes": s.record_shapes,
            "with_stack": s.with_stack,
            "activities": self._activities_names,
            "profiled_steps": list(range(first, first + s.active)),
        }

    def _phase(self, i: int) -> str:
        s = self.settings
        if i < s.wait:
            return "wait"
        if i < s.wait + s.warmup:
            return "warmup"
        return "active" if i < s.window_steps else "after"

    # -- lifecycle --------------------------------------------------------------------------
    def __enter__(self) -> Capture:
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(self.out_dir, f"cannot create the capture directory: {exc}") from None
        self._rank, self._world, self._backend = _dist_rank_world()
        cuda = torch.cuda.is_available() if self.settings.cuda is None else self.settings.cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self._activities_names = ["cpu"] + (["cuda"] if cuda else [])
        s = self.settings
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=s.wait, warmup=s.warmup, active=s.active, repeat=1),
            on_trace_ready=self._on_trace_ready,
            record_shapes=s.record_shapes,
            with_stack=s.with_stack,
            with_modules=s.with_modules,
            profile_memory=s.profile_memory,
        )
        self._prof.preset_metadata_json(TRACE_META_KEY, json.dumps(self._trace_meta(), default=str))
        self._prof.start()
        from calib.ingest.capture.power import start_sampling

        self._power, self.power_info = start_sampling(self.out_dir, self._rank, self.settings.power)
        self._t_last = time.perf_counter()
        return self

    def _on_trace_ready(self, prof: Any) -> None:
        # the process group may have been created after the capture started
        self._rank, self._world, self._backend = _dist_rank_world()
        final = self.out_dir / trace_name(self._rank)
        with replacing_file(final, suffix=".json.gz") as tmp:  # ends in .gz: torch gzips it
            prof.export_chrome_trace(str(tmp))
        self.trace_path = final

    def step(self) -> None:
        """Mark the end of one training step (call it after ``optimizer.step()``)."""
        now = time.perf_counter()
        self.step_times_s.append(now - self._t_last)
        if self._prof is not None:
            if len(self.step_times_s) <= self.settings.wait + self.settings.warmup:
                # the process group may appear after capture() starts: refresh the rank
                self._rank, self._world, self._backend = _dist_rank_world()
                self._prof.preset_metadata_json(TRACE_META_KEY, json.dumps(self._trace_meta(), default=str))
            self._prof.step()
            if self.done:
                self._prof.stop()
                self._prof = None
        self._t_last = time.perf_counter()

    @property
    def done(self) -> bool:
        """True once the active window has been recorded and written."""
        return len(self.step_times_s) >= self.settings.window_steps

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._prof is not None:
            self._prof.stop()  # exports a partial window, if one was being recorded
            self._prof = None
        if self._power is not None:
            self.power_info = self._power.stop()
            self._power = None
        if exc_type is not None:
            return
        complete = self.done
        if not complete:
            warnings.warn(
                f"calib.capture: the loop ran {len(self.step_times_s)} steps, fewer than the "
                f"{self.settings.window_steps} the window needs; the trace is partial or missing",
                stacklevel=2,
            )
        times = {str(self._rank): self.step_times_s}
        if self.gather_step_times and self._world > 1:
            times = self._gather_times() or times
        if self._rank == 0:
            write_run_config(self.out_dir, self.run_config(times, complete))

    def _gather_times(self) -> dict[str, list[float]] | None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (dist.get_rank(), self.step_times_s))
        return {str(r): t for r, t in gathered}

    def run_config(self, step_times: Mapping[str, list[float]], complete: bool = True) -> dict[str, Any]:
        """The ``run_config.json`` document of this capture."""
        n = max((len(t) for t in step_times.values()), default=0)
        doc: dict[str, Any] = {
            "name": self.name,
            "system": self.system,
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "world_size": self._world,
            "backend": self._backend,
            "framework": self.framework,
            "parallel": self.parallel,
            "model": self.model,
            "profiler": self._profiler_json(),
            "complete": complete,
            "files": {str(r): trace_name(r) for r in range(self._world)},
            "step_times_s": dict(step_times),
            "step_phases": [self._phase(i) for i in range(n)],
            **_peak_memory(),
            "power": dict(self.power_info),
            "versions": versions(),
            "host": host_info(),
            "argv": list(sys.argv),
        }
        doc.update(self.extra)
        return doc


def _peak_memory() -> dict[str, Any]:
    """This rank's peak allocated device memory over the whole loop (what a memory
    prediction is checked against), when torch runs on a CUDA device."""
    try:
        import torch

        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        return {"peak_mem_bytes": int(torch.cuda.max_memory_allocated())}
    except Exception:  # noqa: BLE001 - a measurement we cannot take is left out, never fatal
        return {}


def capture(out_dir: str | Path, **kwargs: Any) -> Capture:
    """Profile a training loop into ``out_dir`` with calibration-ready settings.

    Keyword arguments are those of :class:`Capture`: ``system`` (the tag calib stores the
    run under), ``settings`` (:class:`CaptureSettings`), ``name``, ``model`` (d, l, a, s,
    V, b), ``framework``, ``zero_stage``, ``sharding_strategy``, ``parallel`` (dp, tp, pp),
    ``extra`` (more keys for run_config.json), ``gather_step_times``.
    """
    return Capture(out_dir, **kwargs)
