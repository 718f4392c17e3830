"""Every executor gives the serial run: a process pool, and a real Dask LocalCluster."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from calib.ingest.budget import MemoryBudget
from calib.ingest.executors import ExecutorSpec, parse_jobs
from calib.ingest.orchestrate import IngestOptions, ingest

from calib.cli import main
from calib.core.errors import InputError
from tests.conftest import CPU_TRACES, FIXTURES, GPU_TRACES

GENERATED_WS4 = sorted((FIXTURES / "traces" / "generated" / "ddp-d128-ws4").glob("rank*.json*"))


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory) -> Path:
    """A multi-rank directory of real traces: the generated 4-rank DDP run when present,
    else the two gloo DDP ranks."""
    d = tmp_path_factory.mktemp("ranks")
    files = GENERATED_WS4 or [CPU_TRACES["ws2_ddp_rank0"], CPU_TRACES["ws2_ddp_rank1"]]
    for f in files:
        shutil.copy(f, d / f.name)
    return d


@pytest.fixture(scope="module")
def serial(ranks_dir):
    return ingest([ranks_dir], IngestOptions(name="r"), executor=ExecutorSpec())


def assert_same_run(a, b) -> None:
    meta_a, tables_a = a
    meta_b, tables_b = b
    assert sorted(tables_a) == sorted(tables_b)
    for name in tables_a:
        pd.testing.assert_frame_equal(tables_a[name], tables_b[name], check_exact=True, obj=name)
    for field in ("ranks", "world_size", "framework", "sources", "notes", "process_groups", "parallel"):
        assert getattr(meta_a, field) == getattr(meta_b, field), field


def test_run_has_every_rank(serial, ranks_dir) -> None:
    meta, tables = serial
    n = len(list(ranks_dir.iterdir()))
    assert len(meta.ranks) == n
    assert sorted(tables["buckets"]["rank"].unique()) == list(meta.ranks)
    assert "crossrank" in tables


def test_process_pool_equals_serial(serial, ranks_dir) -> None:
    pooled = ingest([ranks_dir], IngestOptions(name="r"), executor=ExecutorSpec(jobs=2))
    assert_same_run(serial, pooled)


def test_dask_local_cluster_equals_serial(serial, ranks_dir) -> None:
    """A real LocalCluster: two worker processes, results gathered over TCP."""
    pytest.importorskip("dask.distributed")
    run = ingest([ranks_dir], IngestOptions(name="r"), executor=ExecutorSpec(kind="dask", jobs=2))
    assert_same_run(serial, run)


def test_dask_scheduler_address_equals_serial(serial, ranks_dir, tmp_path) -> None:
    """``--scheduler ADDRESS``: a cluster calib did not start (a LocalCluster here, as
    dask-jobqueue would give one), through the command line."""
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        code, out, err = cli(
            "ingest", str(ranks_dir), "--out", str(tmp_path / "d"), "--executor", "dask",
            "--scheduler", cluster.scheduler_address,
        )  # fmt: skip
    assert code == 0, err
    code, _, err = cli("ingest", str(ranks_dir), "--out", str(tmp_path / "s"))
    assert code == 0, err
    for name in serial[1]:
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "d" / f"{name}.parquet"),
            pd.read_parquet(tmp_path / "s" / f"{name}.parquet"),
            obj=name,
        )


def test_streaming_budget_gives_the_same_run(serial, ranks_dir) -> None:
    """A budget too small for any rank: every worker streams; the run is unchanged."""
    tiny = MemoryBudget(8 << 20, "test")  # 4 MiB per worker: below every rank's in-memory need
    run = ingest([ranks_dir], IngestOptions(name="r"), executor=ExecutorSpec(jobs=2, memory=tiny))
    _, tables = run
    _, expected = serial
    for name in expected:
        pd.testing.assert_frame_equal(expected[name], tables[name], check_exact=True, obj=name)
    assert all("streamed in batches" in n for n in run[0].notes if "streamed" in n)
    assert sum("streamed in batches" in n for n in run[0].notes) == len(run[0].ranks)


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_cli_jobs_writes_the_serial_tables(ranks_dir, tmp_path) -> None:
    code1, out1, err1 = cli("ingest", str(ranks_dir), "--out", str(tmp_path / "j1"))
    code2, out2, err2 = cli("ingest", str(ranks_dir), "--out", str(tmp_path / "j2"), "--jobs", "2")
    assert code1 == code2 == 0, err1 + err2
    tables = sorted(p.name for p in (tmp_path / "j1").glob("*.parquet"))
    assert "crossrank.parquet" in tables
    assert tables == sorted(p.name for p in (tmp_path / "j2").glob("*.parquet"))
    for name in tables:
        pd.testing.assert_frame_equal(
            pd.read_parquet(tmp_path / "j1" / name), pd.read_parquet(tmp_path / "j2" / name), obj=name
        )
    assert "Stragglers" in out1 and "Stragglers" in out2
    meta = json.loads((tmp_path / "j2" / "run.json").read_text())
    assert "crossrank" in meta["tables"]


def test_single_rank_has_no_crossrank(tmp_path) -> None:
    code, out, err = cli("ingest", str(GPU_TRACES["nccl_data"]), "--out", str(tmp_path / "one"))
    assert code == 0, err
    assert not (tmp_path / "one" / "crossrank.parquet").exists()
    assert "Stragglers" not in out


def test_bad_rank_stops_a_parallel_run(tmp_path) -> None:
    d = tmp_path / "ranks"
    d.mkdir()
    good = CPU_TRACES["ws2_ddp_rank0"].read_bytes()
    (d / "rank0.pt.trace.json.gz").write_bytes(good)
    (d / "rank1.pt.trace.json.gz").write_bytes(good[:5000])
    for executor in (["--jobs", "2"], ["--executor", "dask", "--jobs", "2"]):
        code, _, err = cli("ingest", str(d), "--out", str(tmp_path / "out"), *executor)
        assert code == 2, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("calib: ") and "rank1.pt.trace.json.gz" in lines[0], (
            err
        )
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, where",
    [
        (["--jobs", "0"], "--jobs"),
        (["--jobs", "many"], "--jobs"),
        (["--scheduler", "tcp://127.0.0.1:8786"], "--scheduler"),
        (["--max-memory", "lots"], "--max-memory"),
        (["--max-memory", "200%"], "--max-memory"),
        (["--executor", "dask", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler"),
    ],
)
def test_bad_executor_options(args, where, tmp_path) -> None:
    dask = pytest.importorskip("dask")
    with dask.config.set({"distributed.comm.timeouts.connect": "2s"}):  # the unreachable scheduler
        code, _, err = cli(
            "ingest", str(CPU_TRACES["ws2_collectives_rank0"]), "--out", str(tmp_path / "o"), *args
        )
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"calib: {where}: "), err
    assert not (tmp_path / "o").exists()


def test_parse_jobs() -> None:
    assert parse_jobs("3") == 3
    assert parse_jobs("auto") >= 1
    with pytest.raises(InputError):
        parse_jobs("-2")
