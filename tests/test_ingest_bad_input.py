"""Bad input to ``calib ingest``: one line naming the file and the problem, exit 2, nothing written."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import CPU_TRACES, GPU_TRACES

GOOD = CPU_TRACES["ws2_collectives_rank0"]


def run_calib(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CALIB_STORE": str(cwd / "store")}
    return subprocess.run(
        [sys.executable, "-m", "calib.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_clean_failure(proc: subprocess.CompletedProcess, tmp: Path, needle: str, problem: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("calib: ")
    assert needle in lines[0]
    assert problem in lines[0].lower()
    assert "Traceback" not in proc.stderr
    store = tmp / "store"
    leftovers = [p for p in store.rglob("*")] if store.exists() else []
    assert not [p for p in leftovers if p.is_file()], leftovers
    assert not (tmp / "out").exists()


def write_json(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


CASES = {
    "truncated_json": lambda d: (
        (d / "t.json").write_bytes(gzip.decompress(GOOD.read_bytes())[:5000]) and d / "t.json"
    ),
    "truncated_gzip": lambda d: (d / "t.json.gz").write_bytes(GOOD.read_bytes()[:1500]) and d / "t.json.gz",
    "corrupt_gzip": lambda d: (
        (d / "c.json.gz").write_bytes(
            GOOD.read_bytes()[:200]
            + bytes(b ^ 0x5A for b in GOOD.read_bytes()[200:900])
            + GOOD.read_bytes()[900:]
        )
        and d / "c.json.gz"
    ),
    "not_a_trace": lambda d: write_json(d / "x.json", {"model": "gpt", "layers": 12}),
    "empty_events": lambda d: write_json(d / "e.json", {"traceEvents": []}),
    "empty_file": lambda d: (d / "z.json").write_bytes(b"") or d / "z.json",
    "no_kernels_no_ops": lambda d: write_json(
        d / "n.json",
        {
            "traceEvents": [
                {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 1, "dur": 5},
                {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
            ]
        },
    ),
    "negative_duration": lambda d: write_json(
        d / "neg.json",
        {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": -5}]},
    ),
    "string_timestamps": lambda d: write_json(
        d / "s.json",
        {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": "soon", "dur": 5}]},
    ),
}
PROBLEMS = {
    "truncated_json": "truncated",
    "truncated_gzip": "gzip",
    "corrupt_gzip": "gzip",
    "not_a_trace": "no 'traceevents'",
    "empty_events": "empty 'traceevents'",
    "empty_file": "empty file",
    "no_kernels_no_ops": "no gpu kernels and no cpu operators",
    "negative_duration": "negative",
    "string_timestamps": "not a kineto trace",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_trace_file(tmp_path, case):
    bad = CASES[case](tmp_path)
    proc = run_calib("ingest", str(bad), "--system", "t", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, bad.name, PROBLEMS[case])


def test_bad_file_inside_directory_fails_whole_run(tmp_path):
    d = tmp_path / "ranks"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(GOOD.read_bytes())
    (d / "rank1.pt.trace.json.gz").write_bytes(GOOD.read_bytes()[:700])
    proc = run_calib("ingest", str(d), "--system", "t", cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, "rank1.pt.trace.json.gz", "gzip")


def test_dangling_link_inside_directory(tmp_path):
    d = tmp_path / "ranks"
    d.mkdir()
    (d / "rank0.pt.trace.json.gz").write_bytes(GOOD.read_bytes())
    (d / "rank1.pt.trace.json.gz").symlink_to(tmp_path / "gone.json.gz")
    proc = run_calib("ingest", str(d), "--system", "t", cwd=tmp_path)
    # a dangling link is not a file: reported, not silently dropped
    assert proc.returncode in (0, 2), proc.stderr
    if proc.returncode == 0:
        meta = json.loads(next((tmp_path / "store").rglob("run.json")).read_text())
        assert any("rank1.pt.trace.json.gz" in n for n in meta["notes"])
    else:
        assert_clean_failure(proc, tmp_path, "rank1.pt.trace.json.gz", "")


def test_missing_path_and_bad_options(tmp_path):
    proc = run_calib("ingest", str(tmp_path / "nope.json"), cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, "nope.json", "no such file")
    proc = run_calib("ingest", str(GOOD), "--zero-stage", "7", cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, "--zero-stage", "0, 1, 2 or 3")
    proc = run_calib("ingest", str(GOOD), "--system", "bad/name", cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, "--system", "not a valid system name")
    proc = run_calib("ingest", str(GOOD), "--model", "d=big", cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, "--model", "integer")


def test_mixed_ranks_of_different_jobs_rejected(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    for name in ("sampled_rank-0", "nccl_data"):  # both claim rank 0
        (d / f"{name}.json.gz").write_bytes(GPU_TRACES[name].read_bytes())
    proc = run_calib("ingest", str(d), cwd=tmp_path)
    assert_clean_failure(proc, tmp_path, ".json.gz", "rank 0 appears in more than one trace")


def test_good_ingest_writes_readable_run(tmp_path):
    from calib.core.rundir import read_run

    proc = run_calib(
        "ingest",
        str(CPU_TRACES["ws2_ddp_rank0"]),
        str(CPU_TRACES["ws2_ddp_rank1"]),
        "--system",
        "laptop",
        "--name",
        "ddp2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "run written to" in proc.stdout
    run = read_run(tmp_path / "store" / "laptop" / "runs" / "ddp2")
    assert run.meta.ranks == (0, 1) and run.meta.world_size == 2 and run.meta.framework.name == "ddp"
    assert len(run.table("buckets")) == 6
    assert [s.rank for s in run.meta.sources] == [0, 1]
    assert all(len(s.sha256) == 64 for s in run.meta.sources)
    # no temporary directories left next to the run
    assert [p.name for p in (tmp_path / "store" / "laptop" / "runs").iterdir()] == ["ddp2"]
