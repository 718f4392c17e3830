"""Train a :class:`TinyGPT` under DDP, FSDP1, FSDP2 or DeepSpeed ZeRO on CPU ranks and
capture it with :mod:`ingest.capture.profile` -- the fixture generator's engine.

Every rank starts from the same weights (same seed) and trains on its own fixed batch,
as data parallelism does.  ``forward``/``backward``/``optimizer`` record_function
ranges mark the phases, as Lightning, DeepSpeed and Megatron traces do.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from calib.ingest.capture.runspec import GPTShape, ProfileWindow, RunSpec


def spec_to_json(spec: RunSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["model"] = asdict(spec.model)
    d["window"] = asdict(spec.window)
    return d


def spec_from_json(d: dict[str, Any]) -> RunSpec:
    return RunSpec(**{**d, "model": GPTShape(**d["model"]), "window": ProfileWindow(**d["window"])})


def bucket_elems(shape: GPTShape) -> int:
    """Gradient/parameter bucket of one transformer layer (12d^2 + 13d elements).

    Framework defaults (DDP 25 MB, DeepSpeed 5e8 elements) would put a tiny model in one
    bucket; real large-model runs fill many buckets per step, each about a layer or less.
    Scaling the buckets to one layer keeps that pattern: several overlapping collectives
    per step, the first issued while backward is still running.
    """
    return 12 * shape.d * shape.d + 13 * shape.d


def deepspeed_config(spec: RunSpec) -> dict[str, Any]:
    """DeepSpeed ZeRO, fp32 on CPU, buckets of one layer; for ZeRO-3 no persistent
    parameters and no reuse across forward and backward (a tiny model would otherwise
    keep every parameter gathered, unlike a large one)."""
    bucket = bucket_elems(spec.model)
    zero: dict[str, Any] = {
        "stage": spec.zero_stage,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
    }
    if spec.zero_stage == 3:
        zero.update(
            stage3_param_persistence_threshold=0,
            stage3_prefetch_bucket_size=bucket,
            stage3_max_live_parameters=2 * bucket,
            stage3_max_reuse_distance=0,
        )
    return {
        "train_micro_batch_size_per_gpu": spec.model.b,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def _wrap(spec: RunSpec, model: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(model to call, optimizer-like with .step(), framework extras for run_config)."""
    import torch

    extras: dict[str, Any] = {}
    if spec.framework == "deepspeed":
        import importlib

        import deepspeed

        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")  # not the torch attribute

        # DeepSpeed JIT-builds a shared-memory all-reduce op on CPU (about 40 s on first
        # use); it serves inference_all_reduce only, never training collectives.
        ds_torch_comm.build_shm_op = lambda: None
        extras["notes"] = ["deepspeed's CPU shared-memory inference all-reduce op was not built"]
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        deepspeed.utils.logger.setLevel(logging.WARNING)
        cfg = deepspeed_config(spec)
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=opt, config=cfg, dist_init_required=False
        )
        extras["deepspeed_config"] = cfg
        return engine, engine, extras
    if spec.framework == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        bucket_mb = bucket_elems(spec.model) * 4 / 2**20
        model = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        extras["ddp"] = {"bucket_cap_mb": round(bucket_mb, 4)}
    elif spec.framework == "fsdp":
        from calib.ingest.capture.model import Block
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FullyShardedDataParallel(
            model,
            sharding_strategy=ShardingStrategy[str(spec.sharding)],
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            device_id=torch.device("cpu"),  # FSDP1 refuses CPU unless told explicitly
        )
        extras["fsdp"] = {"auto_wrap": "Block", "use_orig_params": False}
    elif spec.framework == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (spec.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        extras["fsdp2"] = {"fully_shard": ["blocks.*", "root"], "reshard_after_forward": True}
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    return model, opt, extras


def train_rank(
    rank: int,
    world_size: int,
    init_file: str,
    spec_json: dict[str, Any],
    out_dir: str,
    system: str | None,
    command: str,
) -> None:
    """One rank of a generated run (spawned by :func:`generate_run`)."""
    if spec_json["framework"] == "deepspeed":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from calib.ingest.capture.launch import init_local_rank

    spec = spec_from_json(spec_json)
    init_local_rank(rank, world_size, init_file, threads=spec.threads_per_rank)
    import torch
    import torch.distributed as dist
    from calib.ingest.capture.model import TinyGPT, batch
    from calib.ingest.capture.profile import CaptureSettings, capture, host_info
    from torch.profiler import record_function

    torch.manual_seed(spec.seed)
    model, opt, extras = _wrap(spec, TinyGPT(spec.model))
    x, y = batch(spec.model, spec.seed + 1 + rank)
    ds = spec.framework == "deepspeed"
    w = spec.window
    settings = CaptureSettings(wait=w.wait, warmup=w.warmup, active=w.active, cuda=False)
    extra = {
        "generator": {"command": command, "spec": spec_json},
        "dtype": "float32",
        "optimizer": "AdamW",
        "host": {**host_info(), "threads_per_rank": spec.threads_per_rank},
        **extras,
    }
    with capture(
        out_dir,
        system=system,
        settings=settings,
        name=spec.name,
        model=spec.model.to_json(),
        parallel={"dp": world_size, "tp": 1, "pp": 1},
        extra=extra,
        **_framework_kwargs(spec),
    ) as cap:
        for _ in range(w.steps):
            with record_function("forward"):
                loss = model(x, y)
            with record_function("backward"):
                model.backward(loss) if ds else loss.backward()
            with record_function("optimizer"):
                opt.step()
                if not ds:
                    opt.zero_grad(set_to_none=True)
            cap.step()
    dist.barrier()
    dist.destroy_process_group()


def _framework_kwargs(spec: RunSpec) -> dict[str, Any]:
    fw = spec.framework_json()
    return {
        "framework": fw["name"],
        "zero_stage": fw["zero_stage"],
        "sharding_strategy": fw["sharding_strategy"],
    }


def generate_run(
    spec: RunSpec, out_dir: str | Path, *, system: str | None = "cpu-gloo", command: str | None = None
) -> dict[str, Any]:
    """Run ``spec`` on ``spec.world_size`` local gloo ranks, writing its traces and
    ``run_config.json`` into ``out_dir``; return the run_config document."""
    from calib.ingest.capture.launch import spawn_local
    from calib.ingest.capture.runconfig import read_run_config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.pt.trace.json*"):
        old.unlink()
    command = command or shlex.join([Path(sys.executable).name, *sys.argv])
    t0 = time.perf_counter()
    spawn_local(train_rank, spec.world_size, spec_to_json(spec), str(out), system, command)
    cfg = read_run_config(out)
    if cfg is None:
        raise RuntimeError(f"{out}: the run finished without writing run_config.json")
    cfg.setdefault("generator", {})["wall_s"] = round(time.perf_counter() - t0, 3)
    from calib.ingest.capture.runconfig import write_run_config

    write_run_config(out, {k: v for k, v in cfg.items() if k not in ("format", "version")})
    return json.loads(json.dumps(cfg))
