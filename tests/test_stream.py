"""Streamed ingest (traces larger than memory) gives exactly the in-memory columns and tables.

Small batch sizes force many batches, so batch boundaries fall everywhere: inside
strings, inside ``args``, between events, in the metadata after ``traceEvents``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest
from calib.ingest import budget as memory
from calib.ingest.events import Events, normalise
from calib.ingest.orchestrate import ingest_rank
from calib.ingest.reader import read_trace
from calib.ingest.stream import read_streaming

from calib.core.errors import InputError
from tests.conftest import ALL_TRACES, CPU_TRACES, GPU_TRACES


def assert_same_events(a: Events, b: Events) -> None:
    for col in ("start", "end", "kind", "name", "names", "thread"):
        x, y = getattr(a, col), getattr(b, col)
        assert x.dtype == y.dtype, col
        np.testing.assert_array_equal(x, y, err_msg=col)
    assert a.threads == b.threads
    assert a.thread_names == b.thread_names
    assert a.t0_us == b.t0_us
    assert len(a.args) == len(b.args)
    assert [a.args[i] for i in range(len(a.args))] == [b.args[i] for i in range(len(b.args))]


@pytest.mark.parametrize("key", sorted(ALL_TRACES))
def test_streamed_columns_equal_in_memory(key: str) -> None:
    path = ALL_TRACES[key]
    raw = read_trace(path)
    ev = normalise(raw)
    batch = 1 << 16 if raw.raw_bytes < 20e6 else 1 << 20
    raw2, ev2 = read_streaming(path, batch)
    assert_same_events(ev, ev2)
    for attr in ("distributed_info", "device_properties", "raw_bytes", "sha256", "file_bytes", "n_events"):
        assert getattr(raw, attr) == getattr(raw2, attr), attr
    assert raw.process_labels == raw2.process_labels


@pytest.mark.parametrize("key", ["ws2_ddp_rank0", "nccl_data", "control"])
def test_streamed_tables_equal_in_memory(key: str) -> None:
    """The whole per-rank analysis, forced to stream by a tiny budget."""
    path = ALL_TRACES[key]
    small = ingest_rank(path)
    # half of what the in-memory path needs: it must stream, and the columns fit
    budget = int(memory.inflated_size(path) * memory.IN_MEMORY_BYTES_PER_JSON_BYTE / 2)
    streamed = ingest_rank(path, memory_budget_bytes=budget)
    assert any("streamed in batches" in n for n in streamed.notes)
    assert small.tables.keys() == streamed.tables.keys()
    for name, df in small.tables.items():
        pd.testing.assert_frame_equal(df, streamed.tables[name], check_exact=True, obj=name)
    assert small.source == streamed.source


def _doc(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


LAYOUTS = {
    # msgspec's compact form: no whitespace anywhere
    "minified": lambda d: msgspec.json.encode(d),
    # the events array first, metadata after it
    "events_first": lambda d: json.dumps(
        {"traceEvents": d["traceEvents"], **{k: v for k, v in d.items() if k != "traceEvents"}}
    ).encode(),
    # a bare array of events, no metadata
    "bare_array": lambda d: json.dumps(d["traceEvents"], indent=3).encode(),
    # CRLF line ends and tabs
    "crlf_tabs": lambda d: json.dumps(d, indent="\t").replace("\n", "\r\n").encode(),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_stream_like_in_memory(tmp_path: Path, layout: str) -> None:
    doc = _doc(CPU_TRACES["ws2_ddp_rank0"])
    p = tmp_path / "t.json"
    p.write_bytes(LAYOUTS[layout](doc))
    for batch in (1 << 12, 1 << 16):
        _, ev = read_streaming(p, batch)
        assert_same_events(normalise(read_trace(p)), ev)


def test_hostile_names_stream_like_in_memory(tmp_path: Path) -> None:
    """Names full of JSON structure, escaped quotes and backslash runs; boundaries in them."""
    doc = _doc(GPU_TRACES["sampled_rank-0"])
    nasty = ['},{"ph": "X"}', 'a\\"},', "\\\\", '\\"\\\\\\"]', "<b>x</b> & ü 模型 😀 [{", "},"]
    for i, e in enumerate(doc["traceEvents"]):
        if e.get("ph") == "X" and i % 3 == 0:
            e["name"] = f"{e['name']}{nasty[i % len(nasty)]}"
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
    for batch in (1 << 10, 1 << 13, 1 << 20):
        _, ev = read_streaming(p, batch)
        assert_same_events(normalise(read_trace(p)), ev)


def test_multi_member_gzip(tmp_path: Path) -> None:
    data = gzip.decompress(CPU_TRACES["ws2_collectives_rank0"].read_bytes())
    p = tmp_path / "t.json.gz"
    p.write_bytes(gzip.compress(data[:1000]) + gzip.compress(data[1000:]))
    _, ev = read_streaming(p, 1 << 12)
    assert_same_events(normalise(read_trace(p)), ev)


@pytest.mark.parametrize(
    "mutate, problem",
    [
        (lambda b: b[: len(b) // 2], "truncated"),
        (lambda b: b[: len(b) - 3], "invalid json"),
        (lambda b: b.replace(b'"traceEvents"', b'"events"'), "no 'traceevents'"),
        (lambda b: b.replace(b'"ph": "X"', b'"ph": "X",', 1), "invalid json"),
        (lambda b: b.replace(b'"correlation": ', b'"correlation": "', 1), "invalid json"),
        (lambda b: b"", "empty file"),
        (lambda b: b"   \n ", "empty file"),
        (lambda b: b'{"traceEvents": []}', "empty 'traceevents'"),
        (
            lambda b: b'{"traceEvents": [{"ph": "X", "ts": 1}], "traceEvents": [{"ph": "X", "ts": 2}]}',
            "more than",
        ),
    ],
)
def test_stream_errors_are_input_errors(tmp_path: Path, mutate, problem: str) -> None:
    data = gzip.decompress(GPU_TRACES["sampled_rank-0"].read_bytes())
    p = tmp_path / "bad.json"
    p.write_bytes(mutate(data))
    with pytest.raises(InputError) as err:
        read_streaming(p, 1 << 12)
    assert problem in err.value.problem.lower()
    assert err.value.where == str(p)


def test_gzip_bomb_is_refused_while_streaming(tmp_path: Path) -> None:
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20) + b"]}", 9))
    with pytest.raises(InputError, match="gzip bomb"):
        read_streaming(p, 1 << 20)


def test_sizes_and_budget() -> None:
    assert memory.parse_size("512M") == 512 << 20
    assert memory.parse_size("1.5GiB") == int(1.5 * (1 << 30))
    assert memory.parse_size("2g") == 2 << 30
    assert memory.parse_size("50%", available=1000 << 20) == 500 << 20
    for bad in ("lots", "-1G", "0%", "101%", "1K"):
        with pytest.raises(InputError):
            memory.parse_size(bad)
    assert memory.available_bytes() > 0
    path = GPU_TRACES["df_index_resolver"]
    assert memory.inflated_size(path) == read_trace(path).raw_bytes
    assert memory.fits_in_memory(path, 1 << 40)
    assert not memory.fits_in_memory(path, 64 << 20)
