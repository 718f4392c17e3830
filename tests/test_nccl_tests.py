"""nccl-tests logs (real ALCF Polaris output) into samples rows, and what bad logs do."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from calib.ingest.nccl_tests import ingest_nccl_tests, looks_like_nccl_tests, parse_nccl_tests_file

from calib.core.collective_names import busbw_factor
from calib.core.errors import InputError
from calib.core.rundir import read_run, write_run
from calib.core.schema import SAMPLES, conform
from tests.conftest import FIXTURES

NCCL = FIXTURES / "nccl-tests"
N8 = NCCL / "polaris" / "n8.g4.2024-04-29-18-14-00"
N2_221 = NCCL / "polaris-nccl2.21" / "n2.g4.2024-04-29-19-08-14"


def test_detects_logs_by_content_only():
    assert looks_like_nccl_tests((N8 / "all_reduce_output.dat.5").read_text()[:4096])
    assert not looks_like_nccl_tests((N8 / "nodes.dat").read_text())
    assert not looks_like_nccl_tests('{"traceEvents": []}')
    assert not looks_like_nccl_tests((NCCL / "SOURCE.txt").read_text()[:4096])


def test_allreduce_lines_match_the_log():
    df = parse_nccl_tests_file(N8 / "all_reduce_output.dat.5")
    conform("samples", df)  # columns and types of the contract
    assert list(df.columns) == SAMPLES.names
    assert len(df) == 29  # 4 B .. 1 GiB, factor 2
    assert set(df["collective"]) == {"allreduce"}
    assert set(df["nranks"]) == {32} and set(df["nnodes"]) == {8} and set(df["gpus_per_node"]) == {4}
    assert set(df["setup"]) == {5} and set(df["redop"]) == {"sum"} and set(df["root"]) == {-1}
    # the last line of the log: 1073741824 268435456 float sum -1 56948 18.85 36.53 0 56843 18.89 36.60 0
    last = df.iloc[-1]
    assert (last["bytes"], last["count"], last["dtype"]) == (1073741824, 268435456, "float")
    assert (last["time_oop_us"], last["algbw_oop_gbps"], last["busbw_oop_gbps"]) == (56948.0, 18.85, 36.53)
    assert (last["time_ip_us"], last["algbw_ip_gbps"], last["busbw_ip_gbps"]) == (56843.0, 18.89, 36.60)
    assert last["wrong"] == 0
    first = df.iloc[0]
    assert (first["bytes"], first["time_oop_us"], first["time_ip_us"]) == (4, 70.65, 61.79)
    assert df["nccl_version"].eq("").all()  # the polaris/ logs and their path do not say


def test_busbw_follows_the_nccl_tests_factor_on_every_log():
    frames = [parse_nccl_tests_file(p) for p in sorted(NCCL.rglob("*.dat.*"))]
    df = pd.concat(frames, ignore_index=True)
    assert len(frames) == 54 and len(df) == 54 * 29
    big = df["algbw_oop_gbps"] >= 1.0  # printed with 2 decimals: compare where that is precise
    f = busbw_factor(df.loc[big, "collective"].to_numpy(), df.loc[big, "nranks"].to_numpy())
    rel = (
        np.abs(df.loc[big, "busbw_oop_gbps"] - df.loc[big, "algbw_oop_gbps"] * f)
        / df.loc[big, "busbw_oop_gbps"]
    )
    assert rel.max() < 0.01
    # algbw = size / time (GB/s, time in us)
    algbw = df.loc[big, "bytes"] / (df.loc[big, "time_oop_us"] * 1e3)
    assert np.allclose(algbw, df.loc[big, "algbw_oop_gbps"], rtol=0.01, atol=0.01)


def test_version_setup_and_na_columns():
    df = parse_nccl_tests_file(N2_221 / "alltoall_output.dat.5")
    assert set(df["nccl_version"]) == {"2.21"} and set(df["setup"]) == {5}
    assert set(df["collective"]) == {"alltoall"} and set(df["nranks"]) == {8} and set(df["nnodes"]) == {2}
    # the zero-byte lines print "N/A" for the in-place #wrong; out-of-place says 0
    zero = df[df["bytes"] == 0]
    assert len(zero) > 0 and set(zero["wrong"]) == {0}
    ag = parse_nccl_tests_file(N8 / "all_gather_output.dat.1")
    assert set(ag["collective"]) == {"allgather"} and set(ag["redop"]) == {"none"}


def test_trailing_launcher_output_is_not_data():
    # ends with "MPICH Slingshot Network Summary: 3 network timeouts" after the summary
    path = N8 / "alltoall_output.dat.3"
    assert "MPICH Slingshot" in path.read_text()
    assert len(parse_nccl_tests_file(path)) == 29


def test_ingest_directory_into_a_run(tmp_path):
    meta, tables = ingest_nccl_tests([NCCL], name="polaris-logs", system="polaris")
    s = tables["samples"]
    assert len(s) == 1566 and meta.kind == "nccl-tests" and meta.backend == "nccl"
    assert meta.devices == ("NVIDIA A100-SXM4-40GB",)
    assert len(meta.sources) == 54
    src = meta.sources[0]
    assert src.sha256 == hashlib.sha256(Path(src.path).read_bytes()).hexdigest()
    assert any("nodes.dat" in n and "not ingested" in n for n in meta.notes)  # reported, not silently dropped
    out = write_run(tmp_path / "polaris" / "runs" / "polaris-logs", meta, tables)
    back = read_run(out)
    assert back.meta.name == "polaris-logs" and back.meta.kind == "nccl-tests"
    pd.testing.assert_frame_equal(back.table("samples"), s, check_dtype=False)


def _copy(src: Path, dst: Path, text: str) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text)
    return dst


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda t: t[: t.index("   134217728") + 30], ":65: expected 13 columns"),  # cut mid-line
        (lambda t: t.replace("   134217728 ", "   1342x7728 ", 1), ":65: cannot parse"),
        (lambda t: t.replace("#  Rank", "# Rnk"), "no '#  Rank"),
        (lambda t: t[: t.index("           4             1")], "no measurement lines"),
    ],
)
def test_bad_logs_name_file_and_line(tmp_path, mutate, problem):
    text = (N8 / "all_reduce_output.dat.5").read_text()
    bad = _copy(N8, tmp_path / "all_reduce_output.dat.5", mutate(text))
    with pytest.raises(InputError) as exc:
        parse_nccl_tests_file(bad)
    assert str(bad) in exc.value.line() and problem in exc.value.line()


def test_library_log_lines_are_counted_not_parsed(tmp_path):
    text = (N8 / "all_reduce_output.dat.5").read_text()
    info = "x3006c0s1b1n0:31669:31669 [0] NCCL INFO comm 0x1234 rank 0 nranks 32 - Init COMPLETE\n"
    i = text.index("    67108864")
    path = _copy(N8, tmp_path / "logs" / "all_reduce_output.dat.5", text[:i] + info + text[i:])
    meta, tables = ingest_nccl_tests([path], name="x", system=None)
    assert len(tables["samples"]) == 29
    assert any("1 NCCL library log lines" in n for n in meta.notes)


def test_unknown_collective_and_binary_file(tmp_path):
    text = (N8 / "all_reduce_output.dat.5").read_text()
    with pytest.raises(InputError, match="cannot tell which collective"):
        parse_nccl_tests_file(_copy(N8, tmp_path / "results.txt", text))
    binary = tmp_path / "all_reduce_output.dat.2"
    binary.write_bytes(b"# nThread 1 nGpus 1 minBytes 4 \xff\xfe\n")
    with pytest.raises(InputError, match="not a text file"):
        parse_nccl_tests_file(binary)


def _calib(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CALIB_STORE": str(cwd / "store")}
    return subprocess.run(
        [sys.executable, "-m", "calib.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_calib_ingest_reads_logs_and_rejects_a_truncated_one(tmp_path):
    ok = _calib(
        "ingest", str(NCCL / "polaris-nccl2.21"), "--system", "polaris", "--name", "p221", cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    run = read_run(tmp_path / "store" / "polaris" / "runs" / "p221")
    assert len(run.table("samples")) == 24 * 29
    text = (N8 / "all_gather_output.dat.4").read_text()
    bad = _copy(N8, tmp_path / "logs" / "all_gather_output.dat.4", text[: text.index("   268435456") + 20])
    proc = _calib("ingest", str(bad.parent), "--system", "polaris", "--name", "bad", cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"calib: {bad}:") and "truncated or garbled" in lines[0]
    assert not (tmp_path / "store" / "polaris" / "runs" / "bad").exists()
