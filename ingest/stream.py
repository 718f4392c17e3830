"""Read a trace larger than memory: inflate, split and decode it in batches.

The in-memory reader (``ingest.reader``) holds the inflated JSON and one Python struct
per event at once, about 3 bytes of RAM per byte of JSON.  Here the file is inflated a
chunk at a time; a vectorised scanner finds where whole events end inside the
``traceEvents`` array; each batch of whole events is decoded by the same msgspec types
and checked by the same per-event validation as the in-memory path, then folded into
the integer-coded columns of :class:`ingest.events.Events` and dropped.  What stays is
about 40 bytes per complete event, so the analysis that follows is the very same code
on the very same columns.

``args`` are kept as columns too (:class:`ArgColumns`): the correlation id of every
event as int64, and everything else deduplicated (kernels on one stream share one entry, ops
with the same shapes share one), since a struct per event is what costs the memory.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
from calib.ingest.budget import STREAMED_BYTES_PER_EVENT, human
from calib.ingest.events import Events, normalise
from calib.ingest.inflate import Inflated, prefetched
from calib.ingest.reader import (
    MAX_SPAN_US,
    Args,
    Event,
    RawTrace,
    TraceFile,
    _columns,
    _FastTraceFile,
)
from calib.ingest.splitter import Splitter

from calib.core.errors import InputError

_ID_FIELDS = ("correlation",)
_RAW_FIELDS = tuple(f for f in Args.__struct_fields__ if isinstance(getattr(Args(), f), msgspec.Raw))
_PLAIN_FIELDS = tuple(f for f in Args.__struct_fields__ if f not in _ID_FIELDS + _RAW_FIELDS)
_get_plain = attrgetter(*_PLAIN_FIELDS)
_get_raws = attrgetter(*_RAW_FIELDS)
_get_corr = attrgetter("correlation")
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
    splitter = Splitter(path, batch_bytes)
    cols = _Columns(path, budget_bytes)
    stream = Inflated(path, batch_bytes)
    for chunk in prefetched(stream):
        for events in splitter.feed(chunk):
            cols.add(events)
    header, rest = splitter.finish(stream.total)
    for events in rest:
        cols.add(events)
    raw = _header_raw(path, header, cols, stream)
    if cols.n_events == 0:
        raise InputError(path, "trace has an empty 'traceEvents' list")
    return raw, cols.events()


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
            k: [] for k in ("ts", "dur", "cat", "name", "th", "corr", "tail")
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
                f"{human(self.budget)} memory budget of this worker; give it a larger memory budget",
            )
        p = self.parts
        p["ts"].append(raw.ts_us)
        p["dur"].append(raw.dur_us)
        p["cat"].append(np.fromiter(map(self.cats.__getitem__, raw.cat), np.int32, n))
        p["name"].append(np.fromiter(map(self.names.__getitem__, raw.name), np.int32, n))
        p["th"].append(np.fromiter(map(self.threads.__getitem__, zip(raw.pid, raw.tid)), np.int32, n))
        args = raw.args
        p["corr"].append(np.fromiter(map(_get_corr, args), np.int64, n))
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
            args=ArgColumns(p.pop("corr"), p.pop("tail"), self.tail_args),
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
    """Everything but the correlation id, as JSON bytes: hashable even when a value is a list,
    and 1, 1.0 and true stay distinct.  (C-level maps: no Python frame per event.)"""
    return map(_encode, zip(map(_get_plain, args), map(_get_raws, args)))


def _tail_of(a: Args) -> Args:
    """A copy of ``a`` without its correlation id, owning its raw JSON (not pinning a batch buffer)."""
    raws = {f: getattr(a, f).copy() for f in _RAW_FIELDS}
    return msgspec.structs.replace(a, correlation=-1, **raws)


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


def _header_raw(path: Path, doc: TraceFile, cols: _Columns, stream: Inflated) -> RawTrace:
    raw = _columns(path, doc, [])
    raw.thread_names, raw.process_labels = cols.thread_names, cols.process_labels
    raw.n_events = cols.n_events
    raw.raw_bytes = stream.total
    raw.sha256 = stream.sha.hexdigest()
    raw.file_bytes = stream.file_bytes
    return raw


class ArgColumns(Sequence):
    """``Events.args`` as columns: correlation ids as int64, the rest deduplicated.

    Indexing gives an :class:`ingest.reader.Args` equal to the decoded one, so code
    written for the in-memory list works unchanged; :meth:`column` is the fast path.
    """

    def __init__(self, corr: np.ndarray, tail: np.ndarray, tails: list[Args]) -> None:
        self.corr, self.tail, self.tails = corr, tail, tails

    def __len__(self) -> int:
        return len(self.corr)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        t = self.tails[self.tail[i]]
        return msgspec.structs.replace(t, correlation=int(self.corr[i]))

    def column(self, attr: str, idx: np.ndarray) -> list[Any]:
        if attr == "correlation":
            return self.corr[idx].tolist()
        values = [getattr(t, attr) for t in self.tails]
        codes = self.tail[idx]
        return [values[c] for c in codes.tolist()]


@dataclass
class StreamedEvents(Events):
    """:class:`Events` whose ``args`` are :class:`ArgColumns`; same answers, less memory."""

    def arg(self, idx: np.ndarray, attr: str) -> list[Any]:
        return self.args.column(attr, np.asarray(idx, dtype=np.int64))

    def args_table(self, idx: np.ndarray, attrs: tuple[str, ...]) -> list[list[Any]]:
        return [self.arg(idx, a) for a in attrs]

    def int_arg(self, idx: np.ndarray, attr: str) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if attr == "correlation":
            return self.args.corr[idx]
        return np.fromiter(self.args.column(attr, idx), dtype=np.int64, count=len(idx))
