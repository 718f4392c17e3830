"""The typed, versioned contract between ingest and the later stages.

A *run* is a directory with ``run.json`` (:class:`RunMeta`) and Parquet tables whose
columns are fixed here.  Later stages read runs only through these names; a change of
meaning bumps :data:`SCHEMA_VERSION` and readers refuse runs from a newer version.

Units are in the column names: ``_s`` seconds, ``_bytes`` bytes, ``_gbps`` GB/s (1e9
bytes per second, the nccl-tests unit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

from calib.core.strict import reject_unknown

SCHEMA_VERSION = 1
RUN_FORMAT = "calib.run"

#: kinds of run directory
KIND_TRACE = "trace"
KIND_NCCL_TESTS = "nccl-tests"
KIND_BENCH = "bench"
RUN_KINDS = (KIND_TRACE, KIND_NCCL_TESTS, KIND_BENCH)

_i32, _i64, _f64, _str, _bool = pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.bool_()

#: One row per rank and iteration.  comm_s + kernel_s + intra_op_s + inter_op_s + other_s
#: == wall_s (the bucket invariant); memcpy_s is part of kernel_s; comm_exposed_s <= comm_s.
BUCKETS = pa.schema(
    [
        ("rank", _i32),
        ("iteration", _i64),  # N of ProfilerStep#N; -1 when the trace has no steps
        ("device", _str),  # "gpu" (device kernels) or "cpu" (host ops as kernels, gloo)
        ("start_s", _f64),  # window start, seconds from the trace's first event
        ("wall_s", _f64),
        ("comm_s", _f64),  # union of communication intervals (overlap counted here first)
        ("comm_exposed_s", _f64),  # communication not overlapped by compute kernels
        ("kernel_s", _f64),  # non-communication kernel time, memcpy/memset included
        ("memcpy_s", _f64),  # memcpy/memset sub-bucket of kernel_s
        ("intra_op_s", _f64),  # device idle, host inside an operator
        ("inter_op_s", _f64),  # device idle, host between operators
        ("other_s", _f64),  # device idle, host waiting (sync, data loading) or absent
        ("compute_s", _f64),  # wall_s - comm_s (seed 004: everything that is not comm)
        ("compute_busy_s", _f64),  # union of compute kernels, overlap with comm included
        ("n_kernels", _i64),  # device kernels (or host compute ops) started in the window
        ("n_ops", _i64),  # outermost host operators started in the window
        ("n_gemms", _i64),  # matmul operators with shapes
        ("gemm_flops", _f64),  # FLOPs of those matmuls (NaN without record_shapes)
    ]
)

BUCKET_PARTS = ("comm_s", "kernel_s", "intra_op_s", "inter_op_s", "other_s")

#: Kernel classes of seed 004 Table 6; the rules mapping names to them are in ingest.rules.
KERNEL_CLASSES = (
    "gemm",
    "attention",
    "elementwise",
    "copy_concat",
    "normalization",
    "optimizer",
    "embedding",
    "memcpy",
    "memset",
    "other",
)
#: classes counted as transformer kernels for k2 (seed 004: GEMM + attention)
TRANSFORMER_CLASSES = ("gemm", "attention")

#: One row per rank, iteration and kernel class; time_s partitions the iteration's kernel_s.
KERNELS = pa.schema(
    [
        ("rank", _i32),
        ("iteration", _i64),
        ("kernel_class", _str),
        ("time_s", _f64),  # share of kernel_s (overlaps resolved by class priority)
        ("busy_s", _f64),  # summed kernel durations of the class inside the window
        ("count", _i64),
    ]
)

#: Per rank and kernel (or host compute op) name over the whole trace.
KERNEL_STATS = pa.schema(
    [
        ("rank", _i32),
        ("kernel_class", _str),
        ("name", _str),
        ("count", _i64),
        ("dur_sum_s", _f64),
        ("dur_mean_s", _f64),
    ]
)

#: Intra-op dispatch time attributed to the innermost host operator (seed 004 Table 6).
DISPATCH_OPS = pa.schema(
    [
        ("rank", _i32),
        ("iteration", _i64),
        ("op", _str),
        ("intra_op_s", _f64),
    ]
)

#: One row per collective call on a rank.  bytes follow nccl-tests' "size" (the larger of
#: the send and receive buffers); busbw = algbw * busbw_factor(collective, group_size).
COLLECTIVES = pa.schema(
    [
        ("rank", _i32),
        ("iteration", _i64),
        ("collective", _str),  # canonical: allreduce, allgather, reducescatter, ...
        ("backend", _str),  # nccl, rccl, gloo, deepep, userbuffers
        ("pg_name", _str),
        ("pg_desc", _str),
        ("pg_role", _str),  # tp, pp, dp, ep, cp, default or unknown
        ("dtype", _str),
        ("nelems", _i64),
        ("bytes", _i64),  # -1 when the trace does not tell
        ("group_size", _i32),  # -1 when unknown
        ("seq", _i64),  # process-group sequence number, -1 when absent
        ("start_s", _f64),
        ("dur_s", _f64),
        ("algbw_gbps", _f64),
        ("busbw_gbps", _f64),
        ("stream", _i64),  # device stream, or host thread id for gloo
    ]
)

#: One row per matmul operator with shapes (record_shapes traces).
GEMMS = pa.schema(
    [
        ("rank", _i32),
        ("iteration", _i64),
        ("op", _str),
        ("m", _i64),
        ("n", _i64),
        ("k", _i64),
        ("batch", _i64),
        ("flops", _f64),  # 2*m*n*k*batch
        ("dtype", _str),
        ("dur_s", _f64),  # device time of the op's kernels (GPU) or the op itself (CPU)
        ("device", _str),
    ]
)

#: Collective bandwidth samples: nccl-tests log lines, or calib's own benchmarks.
SAMPLES = pa.schema(
    [
        ("source", _str),  # nccl-tests, calib-bench
        ("file", _str),
        ("setup", _i32),  # environment setup index (nccl-tests file suffix), -1 if none
        ("collective", _str),
        ("bytes", _i64),
        ("count", _i64),
        ("dtype", _str),
        ("redop", _str),
        ("root", _i32),
        ("nranks", _i32),
        ("nnodes", _i32),
        ("gpus_per_node", _i32),
        ("time_oop_us", _f64),
        ("algbw_oop_gbps", _f64),
        ("busbw_oop_gbps", _f64),
        ("time_ip_us", _f64),
        ("algbw_ip_gbps", _f64),
        ("busbw_ip_gbps", _f64),
        ("wrong", _i64),  # nccl-tests #wrong column, -1 when "N/A"
        ("nccl_version", _str),
    ]
)

#: GEMM microbenchmark samples (calib bench gemm).
GEMM_SAMPLES = pa.schema(
    [
        ("source", _str),
        ("device", _str),  # device name, e.g. "NVIDIA H200" or the CPU model
        ("dtype", _str),
        ("m", _i64),
        ("n", _i64),
        ("k", _i64),
        ("batch", _i64),
        ("flops", _f64),
        ("time_s", _f64),
        ("tflops", _f64),
    ]
)

#: Cross-rank view of the collectives (ingest.crossrank): one row per call per rank,
#: matched across ranks.  transfer_s = the shortest duration among the match's ranks (the
#: last to arrive waits for nobody), wait_s = dur_s - transfer_s (torch-tb-profiler's
#: split); NaN when the call matched no other rank (n_ranks == 1).
CROSSRANK = pa.schema(
    [
        ("match_id", _i64),  # same id on every rank for one collective call
        ("rank", _i32),
        ("iteration", _i64),  # this rank's iteration of the call
        ("match_iteration", _i64),  # the earliest iteration among the match's ranks
        ("collective", _str),
        ("pg_name", _str),
        ("seq", _i64),  # -1 when the trace has none
        ("matched_by", _str),  # "seq" (process group + sequence number) or "order"
        ("ordinal", _i64),  # n-th call of its key on this rank
        ("bytes", _i64),
        ("n_ranks", _i32),  # ranks in the match (1: unmatched)
        ("start_s", _f64),  # this rank's clock, seconds from its first event
        ("dur_s", _f64),
        ("transfer_s", _f64),
        ("wait_s", _f64),
        ("straggler_rank", _i32),  # last rank to arrive (shortest duration); -1 unmatched
    ]
)

#: GPU traces: device kernels grouped by what launched them and what it read
#: (ingest.device_ops).  in_bytes = bytes of the launching op's tensor inputs, numel =
#: elements of its largest input (0 when the trace has no shapes), lead = the product of
#: that input's dimensions but the last (b s for an activation [b, s, w]).
DEVICE_OPS = pa.schema(
    [
        ("rank", _i32),
        ("iteration", _i64),
        ("kernel_class", _str),
        ("op", _str),  # launching host op ("" when unknown)
        ("numel", _i64),
        ("lead", _i64),
        ("in_bytes", _i64),
        ("count", _i64),
        ("dur_s", _f64),
    ]
)

#: GPU traces: how the host issued each iteration while profiled (ingest.device_ops).
HOST_STEPS = pa.schema(
    [
        ("rank", _i32),
        ("iteration", _i64),
        ("n_host_ops", _i64),  # host operators started in the window, every nesting level
        ("n_launches", _i64),  # kernel/memcpy launches (runtime calls) in the window
        ("host_issue_s", _f64),  # window start to the last launch: the host's time to issue the step
    ]
)

TABLES: dict[str, pa.Schema] = {
    "buckets": BUCKETS,
    "kernels": KERNELS,
    "kernel_stats": KERNEL_STATS,
    "dispatch_ops": DISPATCH_OPS,
    "collectives": COLLECTIVES,
    "gemms": GEMMS,
    "samples": SAMPLES,
    "gemm_samples": GEMM_SAMPLES,
    "crossrank": CROSSRANK,
    "device_ops": DEVICE_OPS,
    "host_steps": HOST_STEPS,
}


_EMPTY: dict[str, pd.DataFrame] = {}


def empty_table(name: str) -> pd.DataFrame:
    """An empty frame with the columns and dtypes of table ``name`` (a fresh copy)."""
    if name not in _EMPTY:
        _EMPTY[name] = TABLES[name].empty_table().to_pandas()
    return _EMPTY[name].copy()


def conform(name: str, df: pd.DataFrame) -> pa.Table:
    """Check ``df`` against the schema of table ``name`` and return it as an Arrow table.

    Missing or extra columns are a programming error (ValueError), not user input.
    """
    schema = TABLES[name]
    missing = [c for c in schema.names if c not in df.columns]
    extra = [c for c in df.columns if c not in schema.names]
    if missing or extra:
        raise ValueError(f"table {name}: missing columns {missing}, unexpected {extra}")
    if list(df.columns) != schema.names:  # selecting copies the frame: only when needed
        df = df[schema.names]
    return pa.Table.from_pandas(df, schema=schema, preserve_index=False, nthreads=1)


@dataclass(frozen=True)
class SourceFile:
    """A file a run was made from, with what identifies it."""

    path: str
    sha256: str
    size_bytes: int
    rank: int | None = None


@dataclass(frozen=True)
class Framework:
    """What trained the traced model, as detected or as stated by the user.

    ``detected_from`` lists the trace signatures that decided it; ``stated`` is True when
    the user gave it on the command line (it then overrides detection).
    """

    name: str = "unknown"  # ddp, fsdp, fsdp2, deepspeed, megatron, pytorch, unknown
    zero_stage: int | None = None  # 0..3 (FSDP FULL_SHARD ~ 3, SHARD_GRAD_OP ~ 2)
    sharding_strategy: str | None = None  # FSDP: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD
    detected_from: tuple[str, ...] = ()
    stated: bool = False


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    desc: str
    role: str  # tp, pp, dp, ep, cp, default, unknown
    size: int
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class RunMeta:
    """Everything in ``run.json``; the tables hold the numbers."""

    name: str
    kind: str  # one of RUN_KINDS
    system: str | None = None
    created: str = ""  # ISO 8601 UTC
    calib_version: str = ""
    world_size: int | None = None
    ranks: tuple[int, ...] = ()
    backend: str | None = None  # nccl, gloo, ...
    devices: tuple[str, ...] = ()  # device names seen (deviceProperties), or "cpu"
    framework: Framework = field(default_factory=Framework)
    process_groups: tuple[ProcessGroup, ...] = ()
    parallel: Mapping[str, int] = field(default_factory=dict)  # tp, pp, dp when known
    model: Mapping[str, Any] = field(
        default_factory=dict
    )  # d, l, a, s, V, b (+ kv, ffn, precision, ...) when given
    #: measurements made beside the trace (run_config.json): step_s_unprofiled (median host
    #: seconds of the steps after the profiler window), steps_unprofiled (how many)
    measured: Mapping[str, Any] = field(default_factory=dict)
    sources: tuple[SourceFile, ...] = ()
    tables: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what ingest decided that a reader should know
    schema_version: int = SCHEMA_VERSION
    format: str = RUN_FORMAT

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RunMeta:
        """Strict: unknown keys, here or in a nested object, are a ValueError (calib.core.strict)."""
        reject_unknown(d, cls, "run")
        d = dict(d)
        fw = d.get("framework", {})
        reject_unknown(fw, Framework, "framework")
        d["framework"] = Framework(**{**fw, "detected_from": tuple(fw.get("detected_from", ()))})
        for pg in d.get("process_groups", ()):
            reject_unknown(pg, ProcessGroup, "process_groups")
        d["process_groups"] = tuple(
            ProcessGroup(**{**pg, "ranks": tuple(pg.get("ranks", ()))}) for pg in d.get("process_groups", ())
        )
        for s in d.get("sources", ()):
            reject_unknown(s, SourceFile, "sources")
        d["sources"] = tuple(SourceFile(**s) for s in d.get("sources", ()))
        for k in ("ranks", "devices", "tables", "notes"):
            d[k] = tuple(d.get(k, ()))
        return cls(**d)
