"""Read a trace larger than memory: inflate, split and decode it in batches.

The in-memory reader (``ingest.reader``) holds the inflated JSON and one Python struct
per event at once, about 4 bytes of RAM per byte of JSON.  Here the file is inflated a
chunk at a time; a vectorised scanner finds where whole events end inside the
``traceEvents`` array; each batch of whole events is decoded by the same msgspec types
and checked by the same per-event validation as the in-memory path, then folded into
the integer-coded columns of :class:`ingest.events.Events` and dropped.  What stays is
about 45 bytes per complete event, so the analysis that follows is the very same code
on the very same columns.

``args`` are kept as columns too (:class:`ArgColumns`): the two ids of every event as
int64, and everything else deduplicated (kernels on one stream share one entry, ops
with the same shapes share one), since a struct per event is what costs the memory.
"""

from __future__ import annotations

import hashlib
import queue
import re
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from ingest.errors import InputError
from ingest.events import Events, normalise
from ingest.memory import STREAMED_BYTES_PER_EVENT, human
from ingest.reader import (
    MAX_INFLATE_RATIO,
    MAX_SPAN_US,
    Args,
    Event,
    RawTrace,
    TraceFile,
    _columns,
    _FastEvent,
    _FastTraceFile,
)

try:
    from isal import isal_zlib as _zlib
except ImportError:  # pragma: no cover
    _zlib = zlib

#: the non-event parts of a trace (deviceProperties, distributedInfo, ...) are kilobytes,
#: and one event is at most kilobytes too; a buffer that grows past this without an event
#: boundary is refused (it is rescanned as it grows, so the limit also bounds that work)
HEADER_LIMIT_BYTES = 16 << 20
_READ_BYTES = 1 << 20
_PRE, _EVENTS, _POST = range(3)
_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*$')
_WS_RE = re.compile(rb"[ \t\r\n]*")
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[[ord("{"), ord("[")]] = 1
_DELTA[[ord("}"), ord("]")]] = -1
_BATCH_DECODER = msgspec.json.Decoder(list[Event])
# the reader's fast path: a union tagged on "ph" that skips flow and instant events' keys
_FAST_BATCH_DECODER = msgspec.json.Decoder(list[_FastEvent])
_HEADER_DECODER = msgspec.json.Decoder(TraceFile)
_ID_FIELDS = ("correlation", "external_id")
_RAW_FIELDS = tuple(f for f in Args.__struct_fields__ if isinstance(getattr(Args(), f), msgspec.Raw))
_PLAIN_FIELDS = tuple(f for f in Args.__struct_fields__ if f not in _ID_FIELDS + _RAW_FIELDS)
_get_plain = attrgetter(*_PLAIN_FIELDS)
_get_raws = attrgetter(*_RAW_FIELDS)
_get_corr, _get_ext = attrgetter("correlation"), attrgetter("external_id")
_encode = msgspec.json.encode


def read_streaming(
    path: str | Path, batch_bytes: int, budget_bytes: int | None = None
) -> tuple[RawTrace, Events]:
    """Decode ``path`` in batches of about ``batch_bytes`` inflated bytes.

    Returns the file's metadata as a :class:`RawTrace` with empty event columns, and
    the events as columns identical to ``normalise(read_trace(path))``.  With
    ``budget_bytes``, a trace with more events than fit it even as columns is refused
    as it is read (a clear error instead of the kernel's out-of-memory killer).
    """
    path = Path(path)
    splitter = _Splitter(path, batch_bytes)
    cols = _Columns(path, budget_bytes)
    stream = _inflated_chunks(path, batch_bytes)
    for chunk in _prefetched(stream):
        for events in splitter.feed(chunk):
            cols.add(events)
    header, rest = splitter.finish(stream.total)
    for events in rest:
        cols.add(events)
    raw = _header_raw(path, header, cols, stream)
    if cols.n_events == 0:
        raise InputError(path, "trace has an empty 'traceEvents' list")
    return raw, cols.events()


class _Inflated:
    """The file's bytes, inflated when gzip, as chunks; counts and hashes as it goes."""

    def __init__(self, path: Path, chunk: int) -> None:
        self.path, self.chunk = path, chunk
        self.total = 0
        self.file_bytes = 0
        self.sha = hashlib.sha256()

    def __iter__(self) -> Iterator[bytes]:
        try:
            fh = self.path.open("rb")
        except IsADirectoryError:
            raise InputError(self.path, "is a directory, expected a trace file") from None
        except OSError as exc:
            raise InputError(self.path, f"cannot read: {exc.strerror or exc}") from None
        with fh:
            first = self._read(fh)
            if first[:2] == b"\x1f\x8b":
                yield from self._gunzip(fh, first)
            else:
                data = first
                while data:
                    self.total += len(data)
                    yield data
                    data = self._read(fh, self.chunk)

    def _read(self, fh, n: int = _READ_BYTES) -> bytes:
        data = fh.read(n)
        self.sha.update(data)
        self.file_bytes += len(data)
        return data

    def _gunzip(self, fh, buf: bytes) -> Iterator[bytes]:
        """All gzip members, output bounded per step; stops gzip bombs like the reader."""
        errors = (OSError, EOFError, zlib.error, _zlib.error, ValueError)
        d = _zlib.decompressobj(wbits=31)
        exhausted = False
        while True:
            try:
                out = d.decompress(buf, self.chunk)
            except errors as exc:
                raise InputError(self.path, f"corrupt gzip: {exc}") from None
            buf = d.unconsumed_tail
            if out:
                self.total += len(out)
                if self.total > max(self.file_bytes * MAX_INFLATE_RATIO, 1 << 20) and self._bomb(fh):
                    raise InputError(
                        self.path,
                        f"gzip inflates beyond {MAX_INFLATE_RATIO}x its size; refusing (gzip bomb?)",
                    )
                yield out
            if d.eof:
                rest = d.unused_data + buf
                while len(rest) < 2 and not exhausted:
                    more = self._read(fh)
                    exhausted = not more
                    rest += more
                if rest[:2] != b"\x1f\x8b":
                    return  # the end, or trailing garbage after the last member as gzip(1) allows
                d, buf = _zlib.decompressobj(wbits=31), rest
            elif not buf:
                if not exhausted:
                    buf = self._read(fh)
                    exhausted = not buf
                if exhausted and not buf and not out:
                    raise InputError(
                        self.path, "corrupt gzip: compressed file ended before the end-of-stream marker"
                    )

    def _bomb(self, fh) -> bool:
        """The ratio guard counts the whole file, as the in-memory reader does."""
        here = fh.tell()
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(here)
        return self.total > max(size * MAX_INFLATE_RATIO, 1 << 20)


def _inflated_chunks(path: Path, chunk: int) -> _Inflated:
    return _Inflated(path, chunk)


def _prefetched(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Inflate the next chunk on a thread while this one is decoded (ISA-L and file reads
    release the GIL), one chunk ahead: about 15 % faster for one more chunk of memory."""
    q: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    done = object()

    def put(item: object) -> bool:
        """Hand ``item`` over unless the consumer has gone (then never block)."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for c in chunks:
                if not put(c):
                    return
            put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(exc)

    th = threading.Thread(target=produce, name="calib-inflate", daemon=True)
    th.start()
    try:
        while (item := q.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        th.join()


class _Splitter:
    """Cut the JSON stream into batches of whole ``traceEvents`` elements.

    Works on the bracket structure outside strings, found with numpy (no per-byte
    Python).  Every buffer it scans starts where the state is known (outside any
    string, at a known depth), so nothing but the unfinished tail is carried over.
    Everything outside the events array is kept, with the array emptied, as a small
    "skeleton" document decoded at the end for the trace's metadata.
    """

    def __init__(self, path: Path, batch_bytes: int) -> None:
        self.path = path
        self.region = _PRE
        self.pending = b""
        self.offset = 0  # stream offset of pending[0]
        self.skeleton = bytearray()
        self.ev_depth = 0
        self.first_batch = True
        self.carry_limit = max(HEADER_LIMIT_BYTES, 4 * batch_bytes)

    def feed(self, chunk: bytes) -> list[list[Event]]:
        """Decoded batches of the whole events that ``chunk`` completes."""
        buf = bytearray(self.pending)  # the one copy of the chunk; batches are views of it
        buf += chunk
        self.pending = b""
        if self.region == _PRE:
            buf = self._find_events(buf)
            if buf is None:
                return []
        if self.region == _EVENTS:
            return self._fast(buf) or self._events(buf)
        self._keep(buf)
        return []

    def finish(self, total: int) -> tuple[TraceFile, list[list[Event]]]:
        """The trace's metadata, and the last batches (or, for a small document the
        scanner found no events array in, all of its events)."""
        if self.region == _PRE:
            if not self.pending.strip():
                raise InputError(self.path, "empty file")
            doc = self._decode_header(self.pending, total)
            events, doc.traceEvents = doc.traceEvents, None
            if events is None:
                raise InputError(self.path, "JSON is not a trace: no 'traceEvents' list")
            return doc, [events]
        last = self._events(self.pending) if self.region == _EVENTS and self.pending else []
        if self.region == _EVENTS:
            raise InputError(self.path, f"invalid JSON (truncated after {total} bytes, inside 'traceEvents')")
        doc = self._decode_header(bytes(self.skeleton), total)
        if doc.traceEvents:
            raise InputError(self.path, "has more than one 'traceEvents' list")
        return doc, last

    def _fast(self, buf: bytearray) -> list[list[Event]]:
        """The common case without scanning: cut after the last '},' and let msgspec check.

        The decode succeeds only if the cut is a real boundary between events (a cut
        inside a string, inside an event or past the array's end is invalid JSON once
        bracketed), so a success is exactly what the scanner would have found.  The
        batch is decoded in place: the ',' before it and the ',' after it become the
        brackets for the duration of the decode.
        """
        cut = buf.rfind(b"},") + 1
        if cut <= 0:
            return []
        lead = _WS_RE.match(buf).end()
        if self.first_batch:
            batch: bytes | memoryview = b"[" + buf[:cut] + b"]"
        elif lead < cut and buf[lead] == 0x2C:
            buf[lead], buf[cut] = 0x5B, 0x5D
            batch = memoryview(buf)[lead : cut + 1]
        else:
            return []
        try:
            events = _decode(batch)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return []  # let the exact scanner find the boundary, or the error
        finally:
            if not self.first_batch:
                buf[lead], buf[cut] = 0x2C, 0x2C
        self.first_batch = False
        self.offset += cut
        self.pending = buf[cut:]
        return [events]

    def _decode_header(self, data: bytes, total: int) -> TraceFile:
        try:
            if data.lstrip()[:1] == b"[":
                return TraceFile(traceEvents=_BATCH_DECODER.decode(data))
            return _HEADER_DECODER.decode(data)
        except msgspec.ValidationError as exc:
            raise InputError(self.path, f"not a Kineto trace: {exc}") from None
        except msgspec.DecodeError as exc:
            text = str(exc)
            if "truncated" in text.lower():
                text = f"truncated after {total} bytes"
            raise InputError(self.path, f"invalid JSON ({text})") from None

    def _find_events(self, buf: bytes) -> bytes | None:
        """In the part before the events: find the array's '['; return what follows it."""
        pos, delta, depth = _brackets(buf, 0)
        for j in np.flatnonzero((delta > 0) & (depth <= 2)).tolist():
            p, d = int(pos[j]), int(depth[j])
            if buf[p] != 0x5B:  # '['
                continue
            if d == 1:
                self.ev_depth = 1  # the document is a bare array of events
            elif _KEY_RE.search(buf[max(0, p - 256) : p]):
                self.ev_depth = 2
            else:
                continue
            self.skeleton += buf[: p + 1]
            self.region = _EVENTS
            self.offset += p + 1
            return buf[p + 1 :]
        if len(buf) > HEADER_LIMIT_BYTES:
            raise InputError(self.path, f"no 'traceEvents' array in the first {HEADER_LIMIT_BYTES >> 20} MiB")
        self.pending = buf
        return None

    def _events(self, buf: bytes) -> list[list[Event]]:
        """The exact path: scan the bracket structure for the events' boundaries."""
        pos, delta, depth = _brackets(buf, self.ev_depth)
        closes = np.flatnonzero(depth < self.ev_depth)
        end_of_array = int(pos[closes[0]]) if len(closes) else -1
        ends = pos[(delta < 0) & (depth == self.ev_depth)]
        if end_of_array >= 0:
            if buf[end_of_array] != 0x5D:  # ']'
                raise InputError(
                    self.path, f"invalid JSON (mismatched bracket at byte {self.offset + end_of_array})"
                )
            cut = end_of_array
        else:
            cut = int(ends[-1]) + 1 if len(ends) else 0
        out = []
        body = buf[:cut]
        if body.strip():
            out.append(_decode_batch(self.path, self._batch(body), self.offset))
            self.first_batch = False
        if end_of_array >= 0:
            self.skeleton += b"]"
            self.region = _POST
            self._keep(buf[end_of_array + 1 :])
            return out
        self.offset += cut
        self.pending = buf[cut:]
        if len(self.pending) > self.carry_limit:
            raise InputError(
                self.path,
                f"a trace event near byte {self.offset} is over {self.carry_limit >> 20} MiB "
                "or its brackets never close",
            )
        return out

    def _batch(self, body: bytes) -> bytes:
        if not self.first_batch:
            body = body.lstrip()
            if body[:1] != b",":
                raise InputError(
                    self.path, f"invalid JSON (expected ',' between events near byte {self.offset})"
                )
            body = body[1:]
            if not body.strip():
                raise InputError(self.path, f"invalid JSON (trailing ',' near byte {self.offset})")
        return b"[" + body + b"]"

    def _keep(self, data: bytes) -> None:
        self.skeleton += data
        if len(self.skeleton) > HEADER_LIMIT_BYTES:
            raise InputError(
                self.path, f"the parts outside 'traceEvents' exceed {HEADER_LIMIT_BYTES >> 20} MiB"
            )


def _brackets(buf: bytes, depth0: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions of brackets outside strings, their +1/-1, and the depth after each.

    ``buf`` must start outside a string.  A quote is real unless an odd run of
    backslashes precedes it (rare in traces: those few are checked in Python).
    """
    a = np.frombuffer(buf, dtype=np.uint8)
    quotes = np.flatnonzero(a == 34)
    if len(quotes):
        after_bs = quotes[(quotes > 0) & (a[np.maximum(quotes - 1, 0)] == 92)]
        if len(after_bs):
            escaped = [q for q in after_bs.tolist() if _odd_backslashes(buf, q)]
            if escaped:
                quotes = np.setdiff1d(quotes, np.array(escaped, dtype=quotes.dtype), assume_unique=True)
    d = _DELTA[a]
    pos = np.flatnonzero(d)
    outside = (np.searchsorted(quotes, pos) & 1) == 0
    pos = pos[outside]
    delta = d[pos].astype(np.int64)
    depth = depth0 + np.cumsum(delta)
    return pos, delta, depth


def _odd_backslashes(buf: bytes, q: int) -> bool:
    i = q - 1
    while i >= 0 and buf[i] == 92:
        i -= 1
    return (q - 1 - i) % 2 == 1


class _Batch(list):
    """Decoded events of one batch, and which decoder made them (for reader._columns)."""

    fast = False


def _decode(batch: bytes | memoryview) -> _Batch:
    """The reader's order: the tagged fast decoder, else (an unusual "ph") the generic one."""
    try:
        out = _Batch(_FAST_BATCH_DECODER.decode(batch))
        out.fast = True
    except msgspec.ValidationError:
        out = _Batch(_BATCH_DECODER.decode(batch))
    return out


def _decode_batch(path: Path, batch: bytes, offset: int) -> list[Event]:
    try:
        return _decode(batch)
    except msgspec.ValidationError as exc:
        raise InputError(path, f"not a Kineto trace: {exc} (in the events from byte {offset})") from None
    except msgspec.DecodeError as exc:
        raise InputError(path, f"invalid JSON ({exc}; in the events from byte {offset})") from None


class _Codes(dict):
    """value -> dense integer code, assigned on first sight (as ingest.events does)."""

    def __missing__(self, key: Any) -> int:
        code = self[key] = len(self)
        return code


class _Columns:
    """Accumulates batches of events into compact columns."""

    def __init__(self, path: Path, budget_bytes: int | None = None) -> None:
        self.path = path
        self.budget = budget_bytes
        self.n_events = 0
        self.n_complete = 0
        self.parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("ts", "dur", "cat", "name", "th", "corr", "ext", "tail")
        }
        self.cats, self.names, self.threads, self.tails = _Codes(), _Codes(), _Codes(), _Codes()
        self.tail_args: list[Args] = []
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.process_labels: dict[Any, str] = {}

    def add(self, events: list[Event]) -> None:
        doc = _FastTraceFile() if getattr(events, "fast", False) else TraceFile()
        raw = _columns(self.path, doc, events)  # the in-memory path's own validation
        del events
        self.n_events += raw.n_events
        for key, name in raw.thread_names.items():
            prev = self.thread_names.get(key)
            self.thread_names[key] = name if prev is None else f"{prev}|{name}"
        self.process_labels.update(raw.process_labels)
        n = len(raw.ts_us)
        self.n_complete += n
        if self.budget is not None and self.n_complete * STREAMED_BYTES_PER_EVENT > self.budget:
            raise InputError(
                self.path,
                f"even streamed, over {self.n_complete} complete events need more than the "
                f"{human(self.budget)} memory budget of this worker; give more with --max-memory",
            )
        p = self.parts
        p["ts"].append(raw.ts_us)
        p["dur"].append(raw.dur_us)
        p["cat"].append(np.fromiter(map(self.cats.__getitem__, raw.cat), np.int32, n))
        p["name"].append(np.fromiter(map(self.names.__getitem__, raw.name), np.int32, n))
        p["th"].append(np.fromiter(map(self.threads.__getitem__, zip(raw.pid, raw.tid)), np.int32, n))
        args = raw.args
        p["corr"].append(np.fromiter(map(_get_corr, args), np.int64, n))
        p["ext"].append(np.fromiter(map(_get_ext, args), np.int64, n))
        keys = _tail_keys(args)
        before = len(self.tails)
        codes = np.fromiter(map(self.tails.__getitem__, keys), np.int32, n)
        if len(self.tails) > before:  # new distinct tails: keep a compact copy of each
            new = np.flatnonzero(codes >= before)
            _, first = np.unique(codes[new], return_index=True)  # sorted by code
            self.tail_args.extend(_tail_of(args[i]) for i in new[first].tolist())
        p["tail"].append(codes)

    def events(self) -> Events:
        p = {k: _cat(v, np.float64 if k in ("ts", "dur") else None) for k, v in self.parts.items()}
        self.parts = {}
        ts, dur = p.pop("ts"), p.pop("dur")
        t0 = float(ts.min()) if len(ts) else 0.0
        with np.errstate(over="ignore", invalid="ignore"):  # as reader._columns
            span = float((ts + dur).max() - t0) if len(ts) else 0.0
        if span > MAX_SPAN_US:
            raise InputError(
                self.path,
                f"complete events span {span / 86400e6:.3g} days, more than a profiler trace can "
                f"({MAX_SPAN_US / 86400e6:.0f} days): timestamps from different clocks, or corrupt",
            )
        start = np.rint((ts - t0) * 1000.0).astype(np.int64)
        del ts
        end = start + np.rint(dur * 1000.0).astype(np.int64)
        del dur
        # Codes and per-value conversions are ingest.events' own: normalise runs on a probe
        # of one event per distinct value, in first-seen order, and our codes map through
        # its answer.  Any encoding normalise chooses (first seen, sorted, ...) is a
        # function of the distinct values in that order, so the result is the same.
        kinds = _probe(self.path, cat=list(self.cats))
        names = _probe(self.path, name=list(self.names))
        pairs = list(self.threads)
        threads = _probe(self.path, pid=[t[0] for t in pairs], tid=[t[1] for t in pairs])
        return StreamedEvents(
            start=start,
            end=end,
            kind=kinds.kind[p.pop("cat")],
            name=names.name[p.pop("name")],
            names=names.names,
            thread=threads.thread[p.pop("th")],
            threads=threads.threads,
            args=ArgColumns(p.pop("corr"), p.pop("ext"), p.pop("tail"), self.tail_args),
            t0_us=t0,
            thread_names={i: self.thread_names.get(t, "") for i, t in enumerate(threads.threads)},
        )


def _cat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype or np.int32)
    out = np.concatenate(parts)
    parts.clear()
    return out


def _tail_keys(args: list[Args]) -> Iterator[bytes]:
    """Everything but the two ids, as JSON bytes: hashable even when a value is a list,
    and 1, 1.0 and true stay distinct.  (C-level maps: no Python frame per event.)"""
    return map(_encode, zip(map(_get_plain, args), map(_get_raws, args)))


def _tail_of(a: Args) -> Args:
    """A copy of ``a`` without its ids, owning its raw JSON (not pinning a batch buffer)."""
    raws = {f: getattr(a, f).copy() for f in _RAW_FIELDS}
    return msgspec.structs.replace(a, correlation=-1, external_id=-1, **raws)


def _probe(path: Path, **column: list[Any]) -> Events:
    """``normalise`` of one probe event per distinct value of the given column(s)."""
    k = len(next(iter(column.values())))
    filler = [None] * k
    probe = RawTrace(
        path=path,
        n_events=k,
        ts_us=np.zeros(k),
        dur_us=np.zeros(k),
        cat=column.get("cat", filler),
        name=column.get("name", filler),
        pid=column.get("pid", filler),
        tid=column.get("tid", filler),
        args=[Args()] * k,
    )
    return normalise(probe)


def _header_raw(path: Path, doc: TraceFile, cols: _Columns, stream: _Inflated) -> RawTrace:
    raw = _columns(path, doc, [])
    raw.thread_names, raw.process_labels = cols.thread_names, cols.process_labels
    raw.n_events = cols.n_events
    raw.raw_bytes = stream.total
    raw.sha256 = stream.sha.hexdigest()
    raw.file_bytes = stream.file_bytes
    return raw


class ArgColumns(Sequence):
    """``Events.args`` as columns: ids as int64, the rest deduplicated.

    Indexing gives an :class:`ingest.reader.Args` equal to the decoded one, so code
    written for the in-memory list works unchanged; :meth:`column` is the fast path.
    """

    def __init__(self, corr: np.ndarray, ext: np.ndarray, tail: np.ndarray, tails: list[Args]) -> None:
        self.corr, self.ext, self.tail, self.tails = corr, ext, tail, tails

    def __len__(self) -> int:
        return len(self.corr)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        t = self.tails[self.tail[i]]
        return msgspec.structs.replace(t, correlation=int(self.corr[i]), external_id=int(self.ext[i]))

    def column(self, attr: str, idx: np.ndarray) -> list[Any]:
        if attr == "correlation":
            return self.corr[idx].tolist()
        if attr == "external_id":
            return self.ext[idx].tolist()
        values = [getattr(t, attr) for t in self.tails]
        codes = self.tail[idx]
        return [values[c] for c in codes.tolist()]


@dataclass
class StreamedEvents(Events):
    """:class:`Events` whose ``args`` are :class:`ArgColumns`; same answers, less memory."""

    def arg(self, idx: np.ndarray, attr: str) -> list[Any]:
        return self.args.column(attr, np.asarray(idx, dtype=np.int64))

    def int_arg(self, idx: np.ndarray, attr: str) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if attr == "correlation":
            return self.args.corr[idx]
        if attr == "external_id":
            return self.args.ext[idx]
        return np.fromiter(self.args.column(attr, idx), dtype=np.int64, count=len(idx))
