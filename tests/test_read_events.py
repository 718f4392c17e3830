"""The fast read path (columns coded while the events are read, block by block) gives
exactly the columns of coding the decoded lists afterwards (``normalise(read_trace)``)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from calib.ingest.events import normalise, read_events
from calib.ingest.reader import read_trace

from calib.core.errors import InputError
from tests.conftest import ALL_TRACES
from tests.test_stream import assert_same_events


@pytest.mark.parametrize("key", sorted(ALL_TRACES))
def test_read_events_equals_normalise_of_lists(key: str) -> None:
    path = ALL_TRACES[key]
    raw, ev = read_events(path)
    assert_same_events(normalise(read_trace(path)), ev)
    assert raw.codes is None  # handed over to the Events, not kept twice


def test_codes_span_blocks_in_first_seen_order(tmp_path: Path) -> None:
    """More events than one block (4096), with pids, tids and names first seen in later
    blocks and one value in two JSON types (1 and 1.0 are one key, as in a dict)."""
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"op{i % 7000}",
            "pid": 1 if i < 5000 else 1.0,
            "tid": i // 3000,
            "ts": float(i),
            "dur": 0.5,
        }
        for i in range(9000)
    ]
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    raw, ev = read_events(path)
    ref = normalise(read_trace(path))
    assert_same_events(ref, ev)
    assert len(ev.names) == 7000 and [t[1] for t in ev.threads] == [0, 1, 2]
    assert ev.threads[0][0] == 1 and type(ev.threads[0][0]) is int  # first seen: the int


def test_bad_times_found_in_any_block(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 0, "ts": i, "dur": 1} for i in range(5000)
    ]
    events[4500]["dur"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(InputError, match="1 complete events have a missing, negative"):
        read_events(path)


@pytest.mark.parametrize("layout", ["unusual_ph", "bare_list"])
def test_generic_decoder_paths_code_the_same(tmp_path: Path, layout: str) -> None:
    """An event phase the tagged union does not list (generic decoder) and a trace that is
    a bare JSON list (no 'traceEvents' object) take the other decoders; same columns."""
    events = [
        {
            "ph": "X",
            "cat": "kernel" if i % 3 else "cpu_op",
            "name": f"k{i % 5}",
            "pid": i % 2,
            "tid": 7,
            "ts": float(i),
            "dur": 0.25,
            "args": {"correlation": i},
        }
        for i in range(5000)
    ]
    events.insert(
        10, {"ph": "Z" if layout == "unusual_ph" else "i", "name": "odd", "pid": 0, "tid": 0, "ts": 1}
    )
    events.insert(20, {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "main"}})
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events if layout == "bare_list" else {"traceEvents": events}))
    raw, ev = read_events(path)
    assert_same_events(normalise(read_trace(path)), ev)
    assert ev.thread_names[0] == "main" and len(ev) == 5000
