"""The capture layout: what makes a directory of traces self-describing.

A captured run is one directory::

    <run>/rank0.pt.trace.json.gz     one Kineto trace per rank, named by rank
    <run>/rank1.pt.trace.json.gz
    <run>/run_config.json            this sidecar (written by rank 0)

and each trace also carries a top-level ``"calib"`` object (system tag, rank, world
size, run name), so a single trace file copied elsewhere still says where it came from.

``run_config.json`` keys (format ``calib.run_config``, version 1); everything but
``format``, ``version`` and ``world_size`` may be absent or null:

    name, system, created (ISO 8601 UTC), world_size, backend,
    framework {name, zero_stage, sharding_strategy}   names as calib.core.schema.Framework
    parallel  {dp, tp, pp}
    model     {d, l, a, s, V, b, attention, params, flops_per_step; kv, ffn; for MoE: E, topk,
              effn (expert width), shared (shared experts) or shffn (one shared MLP's width),
              dense (leading dense layers)}
    dtype, optimizer,
    profiler  {wait, warmup, active, record_shapes, with_stack, activities, profiled_steps}
    files     {"<rank>": "<file name>"}
    step_times_s {"<rank>": [host seconds of each step, every step of the loop]},
    step_phases  [wait|warmup|active|after for each step],
    peak_mem_bytes  rank 0's torch.cuda.max_memory_allocated() over the loop (GPU runs),
    versions  {python, torch, deepspeed, calib}, host {hostname, cpu, cpu_count,
    threads_per_rank}, generator {command, spec}, notes [...]

Torch-free: ingest reads it with :func:`read_run_config`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from calib.core.atomic import write_text
from calib.core.errors import InputError

RUN_CONFIG_NAME = "run_config.json"
RUN_CONFIG_FORMAT = "calib.run_config"
RUN_CONFIG_VERSION = 1
#: top-level key of the metadata object calib adds to each trace
TRACE_META_KEY = "calib"
TRACE_META_FORMAT = "calib.capture"
TRACE_SUFFIX = ".pt.trace.json.gz"
_RANK_FILE = re.compile(r"^rank(\d+)\.pt\.trace\.json(\.gz)?$")


#: the MoE shape a capture states (model / shape_full): routed experts E, experts per token
#: topk, expert MLP width effn, shared experts (of width effn) or one shared MLP of total width
#: shffn, leading dense layers dense (calibrate.device_moe reads them)
MOE_SHAPE_KEYS = ("E", "topk", "effn", "shared", "shffn", "dense")
#: multi-head latent attention's shape (DeepSeek-V2/V3): query and key-value compression
#: ranks qr and kvr, the rotary and the plain part of a query/key head (rope, nope) and the
#: value head width vh (calibrate.device_mla reads them; 0 or absent: not MLA)
MLA_SHAPE_KEYS = ("qr", "kvr", "rope", "nope", "vh")
#: the shape keys that may be 0 (absent structure) beside the sizes d, l, a, s, V, b, kv, ffn
OPTIONAL_SHAPE_KEYS = (*MOE_SHAPE_KEYS, *MLA_SHAPE_KEYS)


def check_shape(shape: dict, where) -> None:
    """A sidecar's model shape is sizes: d, l, a, s, V, b, kv, ffn positive; the MoE and MLA
    keys non-negative (0: a dense model, experts as wide as ffn, none shared, no dense layers,
    no latent attention);
    no more experts per token than experts; fewer dense layers than layers."""
    for k, v in shape.items():
        low = 0 if k in OPTIONAL_SHAPE_KEYS else 1
        if v < low:
            raise InputError(
                where, f"model {k} must be a {('positive', 'non-negative')[low == 0]} integer, got {v}"
            )
    if shape.get("E", 0) and shape.get("topk", 0) > shape["E"]:
        raise InputError(where, f"model topk={shape['topk']} experts per token but only E={shape['E']}")
    if shape.get("dense", 0) and shape["dense"] >= shape.get("l", shape["dense"] + 1):
        raise InputError(
            where, f"model dense={shape['dense']} leading dense layers of l={shape['l']}: none would route"
        )


def trace_name(rank: int) -> str:
    """File name of rank ``rank``'s trace in a captured run."""
    return f"rank{int(rank)}{TRACE_SUFFIX}"


def rank_of_name(name: str) -> int | None:
    """The rank in a ``rank<R>.pt.trace.json[.gz]`` name, else None."""
    m = _RANK_FILE.match(name)
    return int(m.group(1)) if m else None


def write_run_config(run_dir: str | Path, config: Mapping[str, Any]) -> Path:
    """Write ``run_config.json`` into ``run_dir`` (atomically), stamping format and version."""
    if not isinstance(config.get("world_size"), int) or config["world_size"] < 1:
        raise ValueError("run_config needs an integer world_size >= 1")
    doc = {"format": RUN_CONFIG_FORMAT, "version": RUN_CONFIG_VERSION, **config}
    return write_text(Path(run_dir) / RUN_CONFIG_NAME, json.dumps(doc, indent=2, default=str) + "\n")


def read_run_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The sidecar of ``run_dir`` as a dict, None when there is none.

    A sidecar that is present but unreadable, of another format or of a newer version is
    an :class:`InputError` naming the file.
    """
    path = Path(run_dir) / RUN_CONFIG_NAME
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(path, f"unreadable run_config.json: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != RUN_CONFIG_FORMAT:
        raise InputError(path, f"not a calib run_config (format is not '{RUN_CONFIG_FORMAT}')")
    version = doc.get("version")
    if not isinstance(version, int) or version > RUN_CONFIG_VERSION:
        raise InputError(path, f"run_config version {version!r} is newer than this calib understands")
    ws = doc.get("world_size")
    if not isinstance(ws, int) or ws < 1:
        raise InputError(path, f"world_size must be a positive integer, got {ws!r}")
    return doc
