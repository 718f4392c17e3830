"""Build large and multi-rank Kineto traces from a real one, for benchmarks.

Real traces over a gigabyte are not redistributable, so the benchmarks make them: the
events of a real trace (``fixtures/traces/hta/``) are repeated ("tiled") with every
identifier that must stay unique shifted per tile, so that the result is a valid trace
whose analysis is N times the original's:

- timestamps move by the original's span plus a gap, so steps stay ordered;
- ``ProfilerStep#N`` numbers, ``correlation`` ids (kernel <-> runtime launch),
  ``External id`` and flow-event ``id`` move by their range, so no two tiles share one.

The output is written tile by tile (never the whole trace in memory), formatted one
key per line at Kineto's own density, gzip-compressed with ISA-L when the name ends
in ``.gz``.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

try:
    from isal import igzip as _gzip
except ImportError:  # pragma: no cover
    _gzip = gzip

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(frozen=True)
class TiledTrace:
    """What :func:`tile_trace` wrote."""

    path: Path
    inflated_bytes: int
    file_bytes: int
    tiles: int
    events: int


def load_trace(src: Path) -> dict[str, Any]:
    with gzip.open(src, "rb") if src.name.endswith(".gz") else src.open("rb") as fh:
        return msgspec.json.decode(fh.read())


def tile_trace(
    src: Path,
    out: Path,
    target_bytes: int,
    rank: int | None = None,
    doc: dict[str, Any] | None = None,
) -> TiledTrace:
    """Write ``out``: ``src``'s events tiled until the JSON is at least ``target_bytes``.

    ``rank`` rewrites ``distributedInfo.rank`` (for multi-rank copies).  ``doc`` is the
    decoded source, to skip decoding it again when making many files.
    """
    doc = doc if doc is not None else load_trace(src)
    events: list[dict[str, Any]] = doc["traceEvents"]
    header = {k: v for k, v in doc.items() if k != "traceEvents"}
    if rank is not None:
        header["distributedInfo"] = {**(header.get("distributedInfo") or {}), "rank": rank}
    ranges = _ranges(events)
    head = msgspec.json.format(msgspec.json.encode(header), indent=2)[:-2].rstrip()
    head += b',\n  "traceEvents": ['
    tile0 = _encode_tile(events, ranges, 0)
    per_tile = len(tile0)
    tiles = max(1, -(-(target_bytes - len(head)) // (per_tile + 2)))
    opener = _gzip.open if out.name.endswith(".gz") else open
    written = 0
    with opener(out, "wb") as fh:
        written += fh.write(head)
        for k in range(tiles):
            body = tile0 if k == 0 else _encode_tile(events, ranges, k)
            written += fh.write(b"\n" if k == 0 else b",\n")
            written += fh.write(body)
        written += fh.write(b"\n  ]\n}\n")
    return TiledTrace(out, written, out.stat().st_size, tiles, tiles * len(events))


@dataclass(frozen=True)
class _Ranges:
    span_us: float
    steps: int
    corr: int
    ext: int
    flow: int


def _ranges(events: list[dict[str, Any]]) -> _Ranges:
    """How far each identifier moves per tile (its range in the source, plus margin)."""
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), int | float)]
    ends = [e["ts"] + e.get("dur", 0) for e in events if isinstance(e.get("ts"), int | float)]
    steps = [int(m.group(1)) for e in events if (m := _STEP_RE.match(str(e.get("name", ""))))]

    def arg_max(key: str) -> int:
        vals = [e["args"][key] for e in events if isinstance(e.get("args", {}).get(key), int)]
        return max(vals, default=0) + 1

    flow = max((e["id"] for e in events if isinstance(e.get("id"), int)), default=0) + 1
    span = (max(ends) - min(ts)) if ts else 0.0
    return _Ranges(
        span_us=span * 1.001 + 1000.0,
        steps=(max(steps) + 1) if steps else 0,
        corr=arg_max("correlation"),
        ext=arg_max("External id"),
        flow=flow,
    )


def _encode_tile(events: list[dict[str, Any]], r: _Ranges, k: int) -> bytes:
    if k == 0:
        tile = events
    else:
        tile = [_shift(e, r, k) for e in events]
    # indent=1 gives Kineto's own density (about 250 bytes per event on this source)
    body = msgspec.json.format(msgspec.json.encode(tile), indent=1)
    return body[1:-1].strip(b"\n")  # drop the list brackets


def _shift(e: dict[str, Any], r: _Ranges, k: int) -> dict[str, Any]:
    e = dict(e)
    if isinstance(e.get("ts"), int | float) and e.get("ph") != "M":
        e["ts"] = e["ts"] + k * r.span_us
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + k * r.flow
    name = e.get("name")
    if r.steps and isinstance(name, str) and name.startswith("ProfilerStep#"):
        m = _STEP_RE.match(name)
        if m:
            e["name"] = f"ProfilerStep#{int(m.group(1)) + k * r.steps}"
    args = e.get("args")
    if isinstance(args, dict) and ("correlation" in args or "External id" in args):
        args = dict(args)
        if isinstance(args.get("correlation"), int) and args["correlation"] >= 0:
            args["correlation"] += k * r.corr
        if isinstance(args.get("External id"), int) and args["External id"] >= 0:
            args["External id"] += k * r.ext
        e["args"] = args
    return e
