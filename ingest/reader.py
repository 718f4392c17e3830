"""Read a Kineto (PyTorch profiler) Chrome-trace file into typed numpy columns.

Speed matters here (traces of hundreds of MB, one per rank): the file is inflated with
ISA-L when available, decoded by msgspec into slotted structs with the garbage
collector paused (the fastest measured JSON path), and turned into columns once.  Only
the ``args`` keys calib uses are decoded; everything else is skipped by the decoder.

Both Kineto schemas are accepted: old (absolute microsecond ``ts``, ``Kernel``/
``Runtime``/``Operator`` categories) and new (``baseTimeNanoseconds``, lower-case
categories, NCCL ``Collective name``/``In msg nelems``/... args on kernels).
"""

from __future__ import annotations

import gc
import gzip
import hashlib
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress
from operator import attrgetter, eq
from pathlib import Path
from typing import Annotated, Any, Union

import msgspec
import numpy as np

from calib.core.errors import InputError

try:  # ISA-L inflates gzip about 1.7x faster than zlib, with the same API
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover - isal is a dependency, kept optional for safety
    _zlib = zlib

#: refuse to inflate beyond this many bytes per input byte (gzip bombs).  Deflate cannot
#: exceed about 1032:1, so the guard must sit below that to ever fire; Kineto JSON
#: compresses 10-30:1, so 250 leaves real traces a wide margin.
MAX_INFLATE_RATIO = 250
#: longest span of complete events: 2**50 ns (13 days), the per-thread key space of
#: ingest.intervals (THREAD_STRIDE).  A profiler trace covers seconds to hours.
MAX_SPAN_US = 2.0**50 / 1000.0


#: an id that must fit the int64 columns it ends up in (larger ones are malformed)
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class Args(msgspec.Struct, gc=False, omit_defaults=True, frozen=True):
    """The ``args`` keys calib reads; the decoder skips all others (``External id``,
    ``device``...: each decoded value is an object to allocate and free, per event).

    The correlation id is typed (a trace whose correlation ids are not integers is
    malformed); the rest stay ``Any`` because their types vary across PyTorch versions."""

    correlation: Int64 = -1
    stream: Any = None
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    seq: Any = msgspec.field(default=None, name="Seq")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    name: Any = None  # metadata events: process/thread names
    labels: Any = None  # metadata events: "CPU", "GPU 0"


_NO_ARGS = Args()


#: what identifies an event (category, name, process, thread): a JSON scalar.  Typed so
#: that a list or object there is refused at decode time, not hashed later.
Scalar = str | int | float | bool | None


class Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Scalar = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: float = float("nan")
    dur: float = 0.0
    args: Args = _NO_ARGS


class TraceFile(msgspec.Struct, gc=False):
    traceEvents: list[Event] | None = None  # noqa: N815 - Kineto's key
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815
    baseTimeNanoseconds: Any = None  # noqa: N815
    schemaVersion: Any = None  # noqa: N815


# Fast path: a tagged union on "ph".  Flow, instant and other events (often 40 % of a
# GPU trace) decode into empty structs, their keys skipped; complete and metadata events
# decode as above.  A trace with a "ph" this union does not list falls back to the
# generic ``TraceFile`` decoder.
class _X(msgspec.Struct, tag="X", tag_field="ph", gc=False):
    cat: Scalar = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: float = float("nan")
    dur: float = 0.0
    args: Args = _NO_ARGS


class _M(msgspec.Struct, tag="M", tag_field="ph", gc=False):
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    args: Args = _NO_ARGS


_OTHER_PHASES = "iIsftBECbenPONDRcpvV"
_FastEvent = Union[  # noqa: UP007 - msgspec needs a real Union of the tagged structs
    tuple(
        [_X, _M]
        + [msgspec.defstruct(f"_Ph{ord(p)}", [], tag=p, tag_field="ph", gc=False) for p in _OTHER_PHASES]
    )
]


class _FastTraceFile(msgspec.Struct, gc=False):
    traceEvents: list[_FastEvent] | None = None  # noqa: N815
    distributedInfo: Any = None  # noqa: N815
    deviceProperties: Any = None  # noqa: N815


_FAST_DECODER = msgspec.json.Decoder(_FastTraceFile)
_DECODER = msgspec.json.Decoder(TraceFile)
_get_ts, _get_dur, _get_cat, _get_name = (attrgetter(a) for a in ("ts", "dur", "cat", "name"))
_get_pid, _get_tid, _get_args = (attrgetter(a) for a in ("pid", "tid", "args"))
_get_ph, _get_corr = attrgetter("ph"), attrgetter("correlation")
_get_key = attrgetter("cat", "name", "pid", "tid")
_IS_X, _IS_M = partial(eq, "X"), partial(eq, "M")  # operator.eq: False, never NotImplemented
_LIST_DECODER = msgspec.json.Decoder(list[Event])


@dataclass
class RawTrace:
    """Complete ('X') events of one trace as columns, plus the file's metadata.

    Times are float microseconds as in the file; ``ingest.events`` normalises them.
    List columns hold Python values (str/int/None) exactly as decoded.
    """

    path: Path
    n_events: int
    ts_us: np.ndarray
    dur_us: np.ndarray
    cat: list[Any]
    name: list[Any]
    pid: list[Any]
    tid: list[Any]
    args: Sequence[Args]
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    process_labels: dict[Any, str] = field(default_factory=dict)
    distributed_info: dict[str, Any] = field(default_factory=dict)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    raw_bytes: int = 0
    sha256: str = ""
    file_bytes: int = 0
    #: with ``read_trace(..., coders=...)``: the category, name, pid and tid columns
    #: already coded by the caller's coders (four code arrays, then the four coders),
    #: the list columns above left empty (``ingest.events.read_events``)
    codes: tuple[Any, ...] | None = None
    #: with ``coders``: ``args.correlation`` of each complete event (int64, -1 none), read
    #: while each block of events is in the CPU cache (later each ``Args`` is a RAM fetch)
    correlation: np.ndarray | None = None


class InflateLimit(Exception):
    """The gzip file inflates beyond the caller's ``max_inflated_bytes``: not bad input,
    just too big to hold in memory (the caller streams it instead)."""


def read_bytes(path: Path, max_inflated_bytes: int | None = None) -> tuple[bytes, int, str]:
    """File contents, inflated if gzip; returns (data, size on disk, sha256 of the file).

    ``max_inflated_bytes`` bounds the inflated size (the gzip trailer's size cannot be
    trusted): beyond it :class:`InflateLimit` is raised before the memory is used.
    """
    try:
        blob = path.read_bytes()
    except IsADirectoryError:
        raise InputError(path, "is a directory, expected a trace file") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    digest = hashlib.sha256(blob).hexdigest()
    if blob[:2] == b"\x1f\x8b":
        limit = max(len(blob) * MAX_INFLATE_RATIO, 1 << 20)
        if max_inflated_bytes is not None and max_inflated_bytes < limit:
            limit = max_inflated_bytes
        try:
            data = _inflate(blob, limit)
        except (OSError, EOFError, zlib.error, _zlib.error, ValueError) as exc:
            raise InputError(path, f"corrupt gzip: {exc}") from None
        if data is None and limit == max_inflated_bytes:
            raise InflateLimit(f"{path}: inflates beyond {limit} bytes")
        if data is None:
            raise InputError(
                path, f"gzip inflates beyond {MAX_INFLATE_RATIO}x its size; refusing (gzip bomb?)"
            )
        return data, len(blob), digest
    return blob, len(blob), digest


def _inflate(blob: bytes, limit: int) -> bytes | None:
    """Inflate all gzip members, or None as soon as the output exceeds ``limit`` bytes.

    One call per member, its output capped at what the limit still allows (plus one
    byte, to tell "exactly at the limit" from "beyond"): a gzip bomb stops at the limit,
    memory never exceeds it, and a one-member file (every trace) comes out as the
    decompressor's own buffer, without joining steps (a copy of the whole JSON).
    """
    chunks: list[bytes] = []
    total = 0
    buf = blob
    while buf:
        d = _zlib.decompressobj(wbits=31)
        chunk = d.decompress(buf, limit - total + 1)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            return None
        if not d.eof:
            raise EOFError("compressed file ended before the end-of-stream marker")
        buf = d.unused_data
        if buf and buf[:2] != b"\x1f\x8b":
            break  # trailing garbage after the last member, as gzip(1) tolerates
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_trace(
    path: str | Path, max_inflated_bytes: int | None = None, coders: tuple[Any, ...] | None = None
) -> RawTrace:
    """Decode one Kineto trace file (``.json`` or ``.json.gz``) into a :class:`RawTrace`.

    ``coders`` (category, name, pid and tid coders: mappings value -> int code that
    assign codes on first lookup) code those columns as they are read, see ``codes``.
    """
    path = Path(path)
    data, file_bytes, digest = read_bytes(path, max_inflated_bytes)
    first = _first_char(data)
    if first is None:
        raise InputError(path, "empty file")
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            if first == b"[":
                doc = TraceFile(traceEvents=_LIST_DECODER.decode(data))
            else:
                try:
                    doc = _FAST_DECODER.decode(data)
                except msgspec.ValidationError:  # an unusual "ph" or layout: generic path
                    doc = _DECODER.decode(data)
        except msgspec.ValidationError as exc:
            raise InputError(path, f"not a Kineto trace: {exc}") from None
        except msgspec.DecodeError as exc:
            raise InputError(path, f"invalid JSON ({_json_problem(exc, len(data))})") from None
        except UnicodeDecodeError as exc:  # a string that is not UTF-8 (a lone surrogate)
            raise InputError(
                path, f"invalid JSON (a string that is not UTF-8 near byte {exc.start})"
            ) from None
        events = doc.traceEvents
        if events is None:
            raise InputError(path, "JSON is not a trace: no 'traceEvents' list")
        if not events:
            raise InputError(path, "trace has an empty 'traceEvents' list")
        raw = _columns(path, doc, events, coders)
    finally:
        if gc_was_enabled:
            gc.enable()
    raw.raw_bytes = len(data)
    raw.sha256 = digest
    raw.file_bytes = file_bytes
    return raw


def _first_char(data: bytes | bytearray) -> bytes | None:
    """First non-whitespace byte, looking at a small prefix first (no 50 MB copies)."""
    for size in (4096, len(data)):
        head = bytes(data[:size]).lstrip()
        if head:
            return head[:1]
    return None


def _json_problem(exc: msgspec.DecodeError, size: int) -> str:
    text = str(exc)
    if "truncated" in text.lower():
        return f"truncated after {size} bytes"
    return text


def _columns(
    path: Path, doc: TraceFile | _FastTraceFile, events: list[Any], coders: tuple[Any, ...] | None = None
) -> RawTrace:
    """Validated columns of the complete events (list columns, or coded: ``coders``)."""
    fast = isinstance(doc, _FastTraceFile)
    x: list[Any] | None = None
    codes = None
    if fast and coders is not None:
        # one sweep over blocks of events: split and column passes share the cache
        meta: list[Any] = []
        ts, dur, codes = _coded(_fast_blocks(events, meta), coders)
    else:
        if fast:
            x = [e for e in events if type(e) is _X]
            meta = [e for e in events if type(e) is _M]
        else:
            phs = list(map(_get_ph, events))
            x = list(compress(events, map(_IS_X, phs)))
            meta = list(compress(events, map(_IS_M, phs)))
        if coders is None:
            ts = np.fromiter(map(_get_ts, x), dtype=np.float64, count=len(x))
            dur = np.fromiter(map(_get_dur, x), dtype=np.float64, count=len(x))
        else:
            ts, dur, codes = _coded((x[lo : lo + _BLOCK] for lo in range(0, len(x), _BLOCK)), coders)
    thread_names: dict[tuple[Any, Any], str] = {}
    process_labels: dict[Any, str] = {}
    for e in meta:
        if e.name == "thread_name" and isinstance(e.args.name, str):
            # a thread may be named twice (e.g. "python", then "pt_gloo_runloop"): keep both
            key = (e.pid, e.tid)
            prev = thread_names.get(key)
            thread_names[key] = e.args.name if prev is None else f"{prev}|{e.args.name}"
        elif e.name == "process_labels" and isinstance(e.args.labels, str):
            process_labels[e.pid] = e.args.labels
    n = len(ts)
    bad = ~np.isfinite(ts) | ~np.isfinite(dur) | (dur < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        if x is None:
            x = [e for e in events if type(e) is _X]
        raise InputError(
            path,
            f"{int(bad.sum())} complete events have a missing, negative or non-finite ts/dur "
            f"(first: '{_short(x[i].name)}' ts={x[i].ts!r} dur={x[i].dur!r})",
        )
    with np.errstate(over="ignore", invalid="ignore"):  # an infinite span is an answer here
        span = float((ts + dur).max() - ts.min()) if n else 0.0
    if span > MAX_SPAN_US:
        raise InputError(
            path,
            f"complete events span {span / 86400e6:.3g} days, more than a profiler trace can "
            f"({MAX_SPAN_US / 86400e6:.0f} days): timestamps from different clocks, or corrupt",
        )
    dist = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    props = doc.deviceProperties if isinstance(doc.deviceProperties, list) else []
    return RawTrace(
        path=path,
        n_events=len(events),
        ts_us=ts,
        dur_us=dur,
        cat=list(map(_get_cat, x)) if codes is None else [],
        name=list(map(_get_name, x)) if codes is None else [],
        pid=list(map(_get_pid, x)) if codes is None else [],
        tid=list(map(_get_tid, x)) if codes is None else [],
        args=list(map(_get_args, x)) if codes is None else codes[4],
        thread_names=thread_names,
        process_labels=process_labels,
        distributed_info=dist,
        device_properties=[p for p in props if isinstance(p, dict)],
        codes=None if codes is None else (*codes[:4], *coders),
        correlation=None if codes is None else codes[5],
    )


#: events per block of :func:`_coded`: a block's structs stay in the CPU cache across
#: its passes (one pass per column over all events would fetch every struct from RAM
#: once per column)
_BLOCK = 4096


def _fast_blocks(events: list[Any], meta: list[Any]) -> Iterator[list[Any]]:
    """The complete events of each block of ``events`` (tagged-union structs); the
    metadata events are appended to ``meta`` on the way, in the same single pass (the
    append returns None, so they are not kept: one type test per event, not two)."""
    keep_meta = meta.append
    for lo in range(0, len(events), _BLOCK):
        yield [e for e in events[lo : lo + _BLOCK] if type(e) is _X or (type(e) is _M and keep_meta(e))]


def _coded(blocks: Iterable[list[Any]], coders: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray, tuple]:
    """ts, dur, and (kind, name, pid and tid codes, args, correlation ids) of complete
    events, block by block.  One lookup per event, of its (cat, name, pid, tid); the coders
    see the distinct keys in order of first sight, so assign the codes one pass would."""
    keys = _Codes()
    key_code = keys.__getitem__
    cols: tuple[list[np.ndarray], ...] = ([], [], [], [])
    args: list[Args] = []
    for b in blocks:
        m = len(b)
        cols[0].append(np.fromiter(map(_get_ts, b), dtype=np.float64, count=m))
        cols[1].append(np.fromiter(map(_get_dur, b), dtype=np.float64, count=m))
        cols[2].append(np.fromiter(map(key_code, map(_get_key, b)), dtype=np.intp, count=m))
        a = list(map(_get_args, b))
        cols[3].append(np.fromiter(map(_get_corr, a), dtype=np.int64, count=m))
        args += a
    ts, dur, key, corr = (
        np.concatenate(c) if c else np.zeros(0, dtype=t)
        for c, t in zip(cols, (np.float64, np.float64, np.intp, np.int64), strict=True)
    )
    kinds, names, pids, tids = coders
    per_key = [(kinds[c], names[n], pids[p], tids[t]) for c, n, p, t in keys]
    table = np.array(per_key, dtype=np.int64).reshape(-1, 4)
    dtypes = (np.int8, np.int32, np.int32, np.int32)
    kind, name, pid, tid = (table[:, j].astype(t)[key] for j, t in enumerate(dtypes))
    return ts, dur, (kind, name, pid, tid, args, corr)


class _Codes(dict):
    """value -> dense integer code, assigned on first sight (C-speed via map(__getitem__))."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sniff(path: Path, nbytes: int = 8192) -> str:
    """The first ``nbytes`` of a file as text (inflated if gzip), for content detection."""
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        if head == b"\x1f\x8b":
            with gzip.open(path, "rb") as fh:
                data = fh.read(nbytes)
        else:
            with path.open("rb") as fh:
                data = fh.read(nbytes)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(path, f"corrupt or truncated gzip: {exc}") from None
    return data.decode("utf-8", errors="replace")
