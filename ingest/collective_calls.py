"""One row per collective call: what moved, over which group, how fast.

GPU traces: NCCL/RCCL kernels.  Sizes come from the kernel's own args (PyTorch >= 2.1:
``Collective name``, ``In msg nelems``, ``Group size``, ``dtype``, ``Process Group *``),
else from the enclosing ``record_param_comms`` host op, else they are unknown (-1) and
algbw/busbw are NaN -- never guessed.  CPU traces: the ``gloo:*`` work items with their
``Input Dims``/``Input type``.  Sizes follow nccl-tests' "size": the larger of the send
and receive buffers.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec
import numpy as np
import pandas as pd
from calib.ingest.events import Events
from calib.ingest.timeline import Timeline

from calib.core.collective_names import (
    ALLGATHER,
    ALLTOALL,
    REDUCESCATTER,
    SENDRECV,
    UNKNOWN,
    busbw_factor,
    canonical,
)
from calib.core.schema import empty_table

_KERNEL_RE = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
#: DeepEP's kernels (ingest.rules.COMM_PATTERNS) move MoE tokens between ranks: all-to-all
_DEEPEP_RE = re.compile(r"\bdeep_ep::")
#: Transformer Engine's userbuffers kernels: ..._ag / _allgather (all-gather), ..._rs
#: (reduce-scatter), kuserbuffers_push/pull (the ring's point-to-point steps)
_UB_RE = re.compile(r"userbuffers_\w*?(?:_(ag|rs|allgather)(?:\b|_|<)|(push|pull)(?:send|recv))")
_UB_COLL = {"ag": ALLGATHER, "allgather": ALLGATHER, "rs": REDUCESCATTER, "push": SENDRECV, "pull": SENDRECV}
_KERNEL_DTYPE_RE = re.compile(r"_(?:Sum|Prod|Max|Min|Avg|PreMulSum|SumPostDiv)_([A-Za-z0-9_]+?)(?:\(|$)")
# NCCL <= 2.8 kernel names: ncclAllReduceRingLLKernel_sum_f32(ncclColl)
_OLD_KERNEL_RE = re.compile(
    r"(?:nccl|rccl)(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|AllToAll)"
    r"(?:Ring|Tree|CollNet\w*|Nvls\w*)?(?:LL128|LL|Simple)?Kernel(?:_(?:sum|prod|max|min|avg|copy)_([a-z]+\d+))?"
)
_OLD_DTYPES = {
    "f16": "half",
    "bf16": "bfloat16",
    "f32": "float",
    "f64": "double",
    "i8": "int8",
    "u8": "uint8",
    "i32": "int32",
    "u32": "int32",
    "i64": "int64",
    "u64": "uint64_t",
}

_ITEMSIZE = {
    "float": 4,
    "float32": 4,
    "float64": 8,
    "double": 8,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "c10::half": 2,
    "c10::bfloat16": 2,
    "int8_t": 1,
    "int8": 1,
    "uint8_t": 1,
    "uint8": 1,
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "byte": 1,
    "bool": 1,
    "int": 4,
    "int32": 4,
    "int32_t": 4,
    "long int": 8,
    "long": 8,
    "int64": 8,
    "int64_t": 8,
    "uint64_t": 8,
    "short": 2,
    "int16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
}


def itemsize(dtype: Any) -> int:
    """Bytes per element of a trace dtype string (-1 when unknown)."""
    return _ITEMSIZE.get(str(dtype).strip().lower(), -1) if dtype else -1


_PG_ROLES = (
    (re.compile(r"TENSOR_MODEL_PARALLEL|TENSOR_AND|(^|[^a-z])tp([^a-z]|$)", re.I), "tp"),
    (re.compile(r"PIPELINE_MODEL_PARALLEL|PIPELINE|EMBEDDING|(^|[^a-z])pp([^a-z]|$)", re.I), "pp"),
    (re.compile(r"EXPERT|(^|[^a-z])ep([^a-z]|$)", re.I), "ep"),
    (re.compile(r"CONTEXT_PARALLEL|(^|[^a-z])cp([^a-z]|$)", re.I), "cp"),
    (re.compile(r"DATA_PARALLEL|(^|[^a-z])dp([^a-z]|$)|shard|replicate", re.I), "dp"),
    (re.compile(r"^default_pg$"), "default"),
)


def _ub_collective(name: str) -> str | None:
    """The collective of a userbuffers kernel (None: not one; unknown: one of its others)."""
    if "userbuffers_" not in name:
        return None
    m = _UB_RE.search(name)
    return UNKNOWN if m is None else _UB_COLL[next(g for g in m.groups() if g)]


def pg_role(desc: Any) -> str:
    """Role of a process group from its description (Megatron names its groups)."""
    if not desc or not isinstance(desc, str):
        return "unknown"
    for rx, role in _PG_ROLES:
        if rx.search(desc):
            return role
    return "unknown"


def compute(ev: Events, tl: Timeline, rank: int, dist_info: dict[str, Any]) -> pd.DataFrame:
    if len(tl.comm) == 0:
        return empty_table("collectives")
    idx = tl.comm
    names = ev.name_of(idx)
    n = len(idx)
    pg_sizes = _pg_sizes(dist_info)
    if tl.device == "gpu":
        # what the kernel name tells, once per distinct name
        codes, inv = np.unique(ev.name[idx], return_inverse=True)
        inv = inv.reshape(-1)
        u_names = ev.names[codes]
        parsed = [_KERNEL_RE.search(nm) or _OLD_KERNEL_RE.search(nm) for nm in u_names]
        deepep = np.array([_DEEPEP_RE.search(nm) is not None for nm in u_names], dtype=bool)
        ub = [_ub_collective(nm) for nm in u_names]
        u_coll = [
            ALLTOALL if de else u if u else canonical(m.group(1)) if m else canonical(nm)
            for m, nm, de, u in zip(parsed, u_names, deepep, ub, strict=True)
        ]
        dts = [_KERNEL_DTYPE_RE.search(nm) for nm in u_names]
        u_dtype = [
            m.group(1)
            if m
            else (_OLD_DTYPES.get(p.group(2)) if p and p.re is _OLD_KERNEL_RE and p.group(2) else None)
            for m, p in zip(dts, parsed, strict=True)
        ]
        inv_list = inv.tolist()
        name_dtype = [u_dtype[i] for i in inv_list]
        arg_coll, in_n, out_n, gsize, arg_dtype, pg_name, pg_desc, seq, stream = ev.args_table(
            idx,
            (
                "coll_name",
                "in_nelems",
                "out_nelems",
                "group_size",
                "dtype",
                "pg_name",
                "pg_desc",
                "seq",
                "stream",
            ),
        )
        coll = np.array(
            [
                canonical(a) if isinstance(a, str) else u_coll[c]
                for a, c in zip(arg_coll, inv_list, strict=True)
            ],
            dtype=object,
        )
        in_n, out_n, gsize, seq, stream = map(_ints, (in_n, out_n, gsize, seq, stream))
        dtype = [a or b for a, b in zip(arg_dtype, name_dtype, strict=True)]
        _fill_from_host_ops(ev, tl, in_n, out_n, gsize, dtype, pg_name, pg_desc)
        nelems = np.maximum(in_n, out_n)
        rccl = np.char.find(np.array(u_names, dtype=str), "rccl") >= 0
        is_ub = np.array([u is not None for u in ub], dtype=bool)
        backend = np.select([deepep, is_ub, rccl], ["deepep", "userbuffers", "rccl"], "nccl")[inv]
    else:
        coll = np.array([canonical(nm.split(":", 1)[-1]) for nm in names], dtype=object)
        dims = _decode_many(ev.arg(idx, "input_dims"))
        types = _decode_many(ev.arg(idx, "input_type"))
        in_n = np.array([_numel(d) for d in dims], dtype=np.int64)
        dtype = [t[0] if isinstance(t, list) and t and isinstance(t[0], str) else None for t in types]
        sizes = set(pg_sizes.values())
        gsize = np.full(n, sizes.pop() if len(sizes) == 1 else -1, dtype=np.int64)
        pg_name = [None] * n
        pg_desc = [None] * n
        seq = np.full(n, -1, dtype=np.int64)
        # gloo's all_gather records its per-rank input; nccl-tests' size is the output
        nelems = np.where((coll == ALLGATHER) & (gsize > 0) & (in_n >= 0), in_n * gsize, in_n)
        stream = np.array(
            [ev.threads[t][1] if isinstance(ev.threads[t][1], int) else -1 for t in ev.thread[idx]],
            dtype=np.int64,
        )
        backend = np.full(n, "gloo", dtype=object)
    item = np.array(_per_str(itemsize, dtype), dtype=np.int64)
    nbytes = np.where((nelems >= 0) & (item > 0), nelems * item, -1)
    for i, name in enumerate(pg_name):
        if gsize[i] < 0 and name is not None and str(name) in pg_sizes:
            gsize[i] = pg_sizes[str(name)]
    dur_s = (ev.end[idx] - ev.start[idx]) * 1e-9
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where((nbytes >= 0) & (dur_s > 0), nbytes / dur_s / 1e9, np.nan)
        busbw = algbw * busbw_factor(coll, np.where(gsize > 0, gsize, np.nan))
    wid = np.searchsorted(tl.win_start, ev.start[idx], side="right") - 1
    ok = (wid >= 0) & (ev.start[idx] < tl.win_end[np.maximum(wid, 0)])
    iteration = np.where(ok, tl.iteration[np.maximum(wid, 0)], -1)
    return pd.DataFrame(
        {
            "rank": np.int32(rank),
            "iteration": iteration.astype(np.int64),
            "collective": coll.astype(object),
            "backend": np.asarray(backend, dtype=object),
            "pg_name": [None if v is None else str(v) for v in pg_name],
            "pg_desc": [None if v is None else str(v) for v in pg_desc],
            "pg_role": _per_str(pg_role, pg_desc),
            "dtype": [None if d is None else str(d) for d in dtype],
            "nelems": nelems.astype(np.int64),
            "bytes": nbytes.astype(np.int64),
            "group_size": gsize.astype(np.int32),
            "seq": seq.astype(np.int64),
            "start_s": ev.start[idx] * 1e-9,
            "dur_s": dur_s,
            "algbw_gbps": algbw,
            "busbw_gbps": busbw,
            "stream": stream.astype(np.int64),
        }
    )


def _per_str(fn, values: list[Any]) -> list[Any]:
    """``[fn(v) for v in values]``, calling ``fn`` once per distinct string (others each time)."""
    memo: dict[str, Any] = {}
    out = []
    for v in values:
        if type(v) is str:
            r = memo.get(v)
            if r is None:
                r = memo[v] = fn(v)
            out.append(r)
        else:
            out.append(fn(v))
    return out


def _ints(values: list[Any]) -> np.ndarray:
    return np.array(
        [v if isinstance(v, int) and not isinstance(v, bool) else -1 for v in values], dtype=np.int64
    )


def pg_groups(dist_info: dict[str, Any]) -> list[dict[str, Any]]:
    """The process-group entries of a trace's distributedInfo: a list (torch >= 2.1) or a
    mapping name -> group; entries that are not objects, or any other shape, carry nothing."""
    groups = dist_info.get("pg_config") if isinstance(dist_info, dict) else None
    groups = list(groups.values()) if isinstance(groups, dict) else groups if isinstance(groups, list) else []
    return [g for g in groups if isinstance(g, dict)]


def _pg_sizes(dist_info: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pg in pg_groups(dist_info):
        if (
            isinstance(pg, dict)
            and isinstance(pg.get("pg_size"), int)
            and not isinstance(pg["pg_size"], bool)
        ):
            out[str(pg.get("pg_name"))] = pg["pg_size"]
    if not out and isinstance(dist_info.get("world_size"), int):
        out["0"] = dist_info["world_size"]
    return out


def _fill_from_host_ops(ev: Events, tl: Timeline, in_n, out_n, gsize, dtype, pg_name, pg_desc) -> None:
    """Sizes missing on the kernel: take them from the enclosing record_param_comms op."""
    need = np.flatnonzero((in_n < 0) & (tl.comm_launch_op >= 0))
    if len(need) == 0:
        return
    ops = tl.ops
    # only record_param_comms-style ops carry sizes: look at their args, not every op's
    carrier = np.flatnonzero(np.isin(ev.names, ["record_param_comms"])[ev.name[ops]])
    has_size = np.zeros(len(ops), dtype=bool)
    has_size[carrier] = _ints(ev.arg(ops[carrier], "in_nelems")) >= 0
    if not has_size.any():
        return
    rt_thread = ev.thread[ops[tl.comm_launch_op[need]]]
    launch = tl.comm_launch[need]
    host = tl.op_nest.innermost(rt_thread, launch, mask=has_size)
    for j, h in zip(need, host, strict=True):
        if h < 0:
            continue
        a = ev.args[int(ops[h])]
        in_n[j] = a.in_nelems if isinstance(a.in_nelems, int) else -1
        out_n[j] = a.out_nelems if isinstance(a.out_nelems, int) else -1
        if gsize[j] < 0 and isinstance(a.group_size, int):
            gsize[j] = a.group_size
        dtype[j] = dtype[j] or a.dtype
        pg_name[j] = pg_name[j] if pg_name[j] is not None else a.pg_name
        pg_desc[j] = pg_desc[j] if pg_desc[j] is not None else a.pg_desc


def _decode_many(raws: list[msgspec.Raw]) -> list[Any]:
    """Decode many small raw JSON values in one call (empty -> None)."""
    if not raws:
        return []
    parts = [bytes(r) if len(r) else b"null" for r in raws]
    try:
        return msgspec.json.decode(b"[" + b",".join(parts) + b"]")
    except (msgspec.DecodeError, UnicodeDecodeError):
        out = []
        for p in parts:
            try:
                out.append(msgspec.json.decode(p))
            except (msgspec.DecodeError, UnicodeDecodeError):
                out.append(None)
        return out


def _numel(dims: Any) -> int:
    """Elements of a tensor (list of ints) or a tensor list (list of lists); -1 unknown."""
    if not isinstance(dims, list):
        return -1
    if dims and all(isinstance(d, list) for d in dims):
        total = 0
        for d in dims:
            n = _numel(d)
            if n < 0:
                return -1
            total += n
        return total
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
        return -1
    return int(np.prod(dims, dtype=np.int64)) if dims else 1
