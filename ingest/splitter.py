"""Cut a Kineto JSON stream into batches of whole events, and decode them.

Works on the bracket structure outside strings, found with numpy (no per-byte Python),
after a fast path that needs no scan at all (``Splitter._fast``).  Every buffer it scans
starts where the state is known (outside any string, at a known depth), so nothing but
the unfinished tail is carried from one chunk to the next.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import numpy as np
from calib.ingest.reader import Event, TraceFile, _FastEvent

from calib.core.errors import InputError

#: the non-event parts of a trace (deviceProperties, distributedInfo, ...) are kilobytes,
#: and one event is at most kilobytes too; a buffer that grows past this without an event
#: boundary is refused (it is rescanned as it grows, so the limit also bounds that work)
HEADER_LIMIT_BYTES = 16 << 20
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


class Splitter:
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
        except UnicodeDecodeError as exc:
            raise InputError(
                self.path, f"invalid JSON (a string that is not UTF-8 near byte {exc.start})"
            ) from None

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
    except UnicodeDecodeError as exc:
        raise InputError(
            path, f"invalid JSON (a string that is not UTF-8 near byte {offset + exc.start})"
        ) from None
