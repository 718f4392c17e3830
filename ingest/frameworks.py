"""Detect the training framework and sharding from a trace's signatures.

Evidence, strongest first: framework-specific op/annotation names (DeepSpeed ZeRO-3's
``LinearFunctionForZeroStage3``, FSDP's ``FullyShardedDataParallel.*``/``FSDP::*``,
DDP's reducer), process-group descriptions (Megatron names its TP/PP/DP groups), and
the phase in which each collective is issued (forward, backward, optimizer step).  What
the trace cannot tell -- ZeRO-1 and ZeRO-2 issue the same collectives -- is left
unknown for the user to state with ``--framework``/``--zero-stage``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
from calib.ingest.events import ANNOTATION, OP, Events
from calib.ingest.intervals import inside_any

from calib.core.collective_names import ALLGATHER, ALLREDUCE, REDUCE, REDUCESCATTER, canonical
from calib.core.schema import Framework, ProcessGroup

_SIGNATURES = (
    (
        "deepspeed-zero3",
        re.compile(
            r"LinearFunctionForZeroStage3|PreBackwardFunctionForModule|"
            r"PostBackwardFunctionModule|ZeROOrderedDict|zero3_"
        ),
    ),
    (
        "deepspeed",
        re.compile(
            r"deepspeed|DeepSpeed|_post_forward_module_hook|_pre_forward_module_hook|"
            r"PreBackwardFunction|PostBackwardFunction"
        ),
    ),
    ("fsdp2", re.compile(r"^FSDP::")),
    ("fsdp", re.compile(r"^FullyShardedDataParallel\.")),
    ("ddp", re.compile(r"^DistributedDataParallel\.|torch::distributed::reducer|ddp\.reducer")),
    ("megatron", re.compile(r"megatron", re.I)),
)
_API_COMM = re.compile(r"^c10d::|^nccl:|^gloo:")
_BACKWARD = re.compile(r"^autograd::engine::evaluate_function|^backward$|## backward ##")
_OPTIMIZER = re.compile(r"^Optimizer\.step#|^optimizer$")


def process_groups(dist_info: dict[str, Any]) -> tuple[ProcessGroup, ...]:
    from calib.ingest.collective_calls import pg_groups, pg_role

    out = []
    for pg in pg_groups(dist_info):
        ranks = pg.get("ranks") if isinstance(pg.get("ranks"), list) else []
        out.append(
            ProcessGroup(
                name=str(pg.get("pg_name")),
                desc=str(pg.get("pg_desc")),
                role=pg_role(pg.get("pg_desc")),
                size=int(pg["pg_size"]) if isinstance(pg.get("pg_size"), int) else -1,
                ranks=tuple(r for r in ranks if isinstance(r, int)),
            )
        )
    return tuple(out)


def phases_of_comm(ev: Events) -> Counter:
    """(canonical collective, phase) counts of host-side collective calls."""
    names = ev.names
    host = np.flatnonzero(np.isin(ev.kind, (OP, ANNOTATION)))
    host_name = ev.name[host]
    api = host[np.array([_API_COMM.search(n) is not None for n in names], dtype=bool)[host_name]]
    bwd = host[np.array([_BACKWARD.search(n) is not None for n in names], dtype=bool)[host_name]]
    opt = host[np.array([_OPTIMIZER.search(n) is not None for n in names], dtype=bool)[host_name]]
    t = ev.start[api]
    in_bwd = inside_any(t, ev.start[bwd], ev.end[bwd])
    in_opt = inside_any(t, ev.start[opt], ev.end[opt])
    phase = np.where(in_opt, "optimizer", np.where(in_bwd, "backward", "forward"))
    codes, inv = np.unique(ev.name[api], return_inverse=True)  # canonical() once per name
    per_code = [canonical(n.split("::")[-1].split(":")[-1]) for n in names[codes]]
    colls = [per_code[i] for i in inv.reshape(-1).tolist()]
    return Counter(zip(colls, phase.tolist(), strict=True))


def detect(ev: Events, dist_info: dict[str, Any], groups: tuple[ProcessGroup, ...]) -> Framework:
    names = [n for n in ev.names if isinstance(n, str)]
    evidence: list[str] = []
    found: dict[str, str] = {}
    for label, rx in _SIGNATURES:
        hit = next((n for n in names if rx.search(n)), None)
        if hit is not None:
            found[label] = hit
    roles = {g.role for g in groups}
    comm = phases_of_comm(ev)

    def has(coll: str, phase: str) -> bool:
        return comm.get((coll, phase), 0) > 0

    ag_fwd, ag_bwd = has(ALLGATHER, "forward"), has(ALLGATHER, "backward")
    ag_opt = has(ALLGATHER, "optimizer")
    rs_bwd = has(REDUCESCATTER, "backward") or has(REDUCE, "backward")
    ar_bwd = has(ALLREDUCE, "backward")
    pattern = ", ".join(f"{c}@{p}×{k}" for (c, p), k in sorted(comm.items()))
    if pattern:
        evidence.append(f"collectives by phase: {pattern}")

    if roles & {"tp", "pp"} or "megatron" in found:
        evidence.append(
            "Megatron process groups: " + ", ".join(sorted(g.desc for g in groups if g.role != "unknown"))
        )
        return Framework(name="megatron", zero_stage=None, detected_from=tuple(evidence))
    if "deepspeed-zero3" in found:
        evidence.insert(0, f"DeepSpeed ZeRO-3 op '{found['deepspeed-zero3']}'")
        return Framework(name="deepspeed", zero_stage=3, detected_from=tuple(evidence))
    if "fsdp2" in found or "fsdp" in found:
        label = "fsdp2" if "fsdp2" in found else "fsdp"
        evidence.insert(0, f"{label.upper()} annotation '{found[label]}'")
        if ag_fwd and ag_bwd:
            strategy, stage = "FULL_SHARD", 3
        elif ag_fwd and rs_bwd:
            strategy, stage = "SHARD_GRAD_OP", 2
        elif ar_bwd and not ag_fwd:
            strategy, stage = "NO_SHARD", 0
        else:
            strategy, stage = None, None
        if len({g.size for g in groups if g.size > 0}) > 1 and strategy:
            strategy = "HYBRID_" + strategy if strategy != "NO_SHARD" else strategy
        return Framework(
            name=label, zero_stage=stage, sharding_strategy=strategy, detected_from=tuple(evidence)
        )
    if "deepspeed" in found:
        evidence.insert(0, f"DeepSpeed op '{found['deepspeed']}'")
        return Framework(
            name="deepspeed",
            zero_stage=None,
            detected_from=(
                *evidence,
                "ZeRO stage 1 or 2: not distinguishable from the trace; state it at ingest (zero_stage)",
            ),
        )
    if "ddp" in found:
        evidence.insert(0, f"DDP op '{found['ddp']}'")
        return Framework(name="ddp", zero_stage=0, detected_from=tuple(evidence))
    if ag_opt and (ar_bwd or rs_bwd) and not ag_fwd:
        evidence.append(
            "gradient reduction in backward and parameter all-gather after the optimizer step: "
            "ZeRO-1/2 (DeepSpeed or ZeroRedundancyOptimizer); state the stage at ingest (zero_stage)"
        )
        return Framework(name="zero", zero_stage=None, detected_from=tuple(evidence))
    if ag_fwd and ag_bwd and rs_bwd:
        evidence.append("all-gather in forward and backward, reduce-scatter in backward: ZeRO-3 pattern")
        return Framework(name="zero", zero_stage=3, detected_from=tuple(evidence))
    world = dist_info.get("world_size")
    if not comm and (not isinstance(world, int) or world <= 1):
        return Framework(name="pytorch", zero_stage=None, detected_from=("no collectives: single process",))
    return Framework(name="unknown", detected_from=tuple(evidence))


def parallel_layout(groups: tuple[ProcessGroup, ...], world_size: int | None) -> dict[str, int]:
    """TP/PP/DP sizes from Megatron-style group roles, when the trace has them."""
    sizes: dict[str, int] = {}
    for role in ("tp", "pp", "dp", "cp", "ep"):
        found = [g.size for g in groups if g.role == role and g.size > 0]
        if found:
            sizes[role] = max(found)
    if world_size and "dp" not in sizes and ("tp" in sizes or "pp" in sizes):
        rest = world_size // max(sizes.get("tp", 1) * sizes.get("pp", 1) * sizes.get("cp", 1), 1)
        if rest >= 1:
            sizes["dp"] = rest
    return sizes
