"""`calib bench collectives` on real gloo ranks and `calib bench gemm`, recorded in the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from calib.ingest.capture.bench_collectives import CollectiveBenchConfig, element_count, message_sizes
from calib.ingest.capture.bench_gemm import square_shapes, transformer_shapes

from calib.cli import main
from calib.core.collective_names import busbw_factor
from calib.core.rundir import read_run
from calib.core.schema import GEMM_SAMPLES, KIND_BENCH, SAMPLES, conform
from calib.core.store import list_runs


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_message_sizes_follow_nccl_tests_b_e_f() -> None:
    cfg = CollectiveBenchConfig(min_bytes=1024, max_bytes=1 << 20, step_factor=4)
    assert message_sizes(cfg) == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert message_sizes(CollectiveBenchConfig(min_bytes=8, max_bytes=8)) == [8]
    # per-rank chunks: the element count is a multiple of the ranks (nccl-tests rounds down)
    assert element_count("allgather", 1000, 4, 3) == 249
    assert element_count("allreduce", 1000, 4, 3) == 250
    assert element_count("alltoall", 4, 4, 8) == 8  # at least one element per rank


@pytest.mark.slow
def test_collectives_on_two_gloo_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        [
            "bench",
            "collectives",
            "--nproc",
            "2",
            "--collectives",
            "allreduce,all_gather,reduce_scatter,alltoall,broadcast,reduce,sendrecv",
            "-b",
            "1K",
            "-e",
            "64K",
            "-f",
            "8",
            "-w",
            "1",
            "-n",
            "3",
            "--system",
            "cpu-gloo",
            "--name",
            "coll-test",
            "--store",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    run = read_run(tmp_path / "cpu-gloo" / "runs" / "coll-test")
    assert run.meta.kind == KIND_BENCH and run.meta.system == "cpu-gloo" and run.meta.world_size == 2
    assert run.meta.backend == "gloo" and run.meta.tables == ("samples",)
    df = run.table("samples")
    assert list(df.columns) == SAMPLES.names
    assert conform("samples", df).schema == SAMPLES
    assert sorted(df["collective"].unique()) == sorted(
        ["allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "reduce", "sendrecv"]
    )
    assert len(df) == 7 * 3 and sorted(df["bytes"].unique()) == [1024, 8192, 65536]  # 1K x8 up to 64K
    assert (df["source"] == "calib-bench").all() and (df["nranks"] == 2).all() and (df["nnodes"] == 1).all()
    assert (df["wrong"] == 0).all()  # every checked call delivered the right values
    assert (df["count"] * 4 == df["bytes"]).all()
    in_place = df["collective"].isin(["allreduce", "broadcast", "reduce"])
    t_us = np.where(in_place, df["time_ip_us"], df["time_oop_us"])
    algbw = np.where(in_place, df["algbw_ip_gbps"], df["algbw_oop_gbps"])
    busbw = np.where(in_place, df["busbw_ip_gbps"], df["busbw_oop_gbps"])
    assert np.isfinite(t_us).all() and (t_us > 0).all()
    np.testing.assert_allclose(algbw, df["bytes"] / (t_us * 1e-6) / 1e9, rtol=1e-12)
    np.testing.assert_allclose(busbw, algbw * busbw_factor(df["collective"].to_numpy(), 2), rtol=1e-12)
    # n = 2: all-reduce bus factor 2(n-1)/n = 1, all-gather (n-1)/n = 1/2
    ag = df["collective"] == "allgather"
    np.testing.assert_allclose(df.loc[ag, "busbw_oop_gbps"], df.loc[ag, "algbw_oop_gbps"] / 2)
    assert df.loc[in_place, "time_oop_us"].isna().all() and df.loc[~in_place, "time_ip_us"].isna().all()
    assert ("allreduce" in out) and ("mean over ranks" in out) and "wrote 21 samples" in out


def test_gemm_bench_flops_and_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        [
            "bench",
            "gemm",
            "--sizes",
            "16,48",
            "--batch",
            "3",
            "--dtype",
            "float32,bf16",
            "--threads",
            "1",
            "-w",
            "1",
            "-n",
            "2",
            "-r",
            "2",
            "--system",
            "cpu",
            "--name",
            "g1",
            "--store",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    run = read_run(tmp_path / "cpu" / "runs" / "g1")
    df = run.table("gemm_samples")
    assert list(df.columns) == GEMM_SAMPLES.names and len(df) == 4
    assert sorted(df["dtype"].unique()) == ["bfloat16", "float32"]
    assert (df["batch"] == 3).all() and (df["m"] == df["n"]).all() and (df["n"] == df["k"]).all()
    np.testing.assert_array_equal(df["flops"], 2.0 * df["m"] * df["n"] * df["k"] * df["batch"])
    np.testing.assert_allclose(df["tflops"], df["flops"] / df["time_s"] / 1e12, rtol=1e-12)
    assert (df["source"] == "calib-bench").all() and run.meta.kind == KIND_BENCH
    assert "wrote 4 GEMM samples" in out
    assert [r.meta.name for r in list_runs(tmp_path, "cpu")] == ["g1"]


def test_transformer_gemms_add_up_to_the_layer_flops() -> None:
    """Forward GEMMs of one layer = 24 b s d^2 + 4 b s^2 d (seed 004: 72 and 12 are 3x these)."""
    d, s, b, a = 512, 128, 2, 8
    shapes = transformer_shapes(d, s, b, a)
    assert sum(sh.flops for sh in shapes) == 24 * b * s * d * d + 4 * b * s * s * d
    # tensor parallelism splits every GEMM t ways
    assert sum(sh.flops for sh in transformer_shapes(d, s, b, a, t=4)) * 4 == sum(sh.flops for sh in shapes)
    assert [sh.flops for sh in square_shapes([10])] == [2000.0]


def test_gemm_model_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        [
            "bench",
            "gemm",
            "--model",
            "d=64,s=32,b=1,a=4",
            "--threads",
            "1",
            "-w",
            "0",
            "-n",
            "1",
            "-r",
            "1",
            "--name",
            "gm",
            "--store",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0
    df = read_run(tmp_path / "unassigned" / "runs" / "gm").table("gemm_samples")
    assert df["flops"].sum() == 24 * 32 * 64 * 64 + 4 * 32 * 32 * 64
    assert "attn scores" in out and "mlp down" in out


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["bench", "collectives"], "calib: --nproc: no process group: launch with torchrun"),
        (["bench", "collectives", "--nproc", "0"], "calib: --nproc: must be between 1 and 256, got 0"),
        (["bench", "collectives", "--nproc", "2", "-b", "1Q"], "calib: --min-bytes: '1Q' is not a size"),
        (
            ["bench", "collectives", "--nproc", "2", "-b", "1M", "-e", "1K"],
            "calib: --min-bytes: must be >= 1 and <=",
        ),
        (
            ["bench", "collectives", "--nproc", "2", "--collectives", "allreduce,gossip"],
            "calib: --collectives: unsupported ['gossip']",
        ),
        (["bench", "collectives", "--nproc", "2", "-d", "float8"], "calib: --dtype: unknown dtype 'float8'"),
        (["bench", "collectives", "--nproc", "2", "-f", "1"], "calib: --step-factor: must be a finite number > 1"),
        (
            ["bench", "collectives", "--nproc", "2", "--backend", "mpi"],
            "calib: --backend: 'mpi' is not nccl, gloo",
        ),
        (
            ["bench", "collectives", "--nproc", "2", "--system", "a/b"],
            "calib: --system: 'a/b' is not a valid",
        ),
        (["bench", "gemm", "--dtype", "int8"], "calib: --dtype: unsupported ['int8']"),
        (["bench", "gemm", "--shape", "3x4"], "calib: --shape: '3x4' is not a GEMM shape MxNxK"),
        (["bench", "gemm", "--sizes", "64,-1"], "calib: --sizes: '-1' is not a positive integer"),
        (["bench", "gemm", "--model", "d=64"], "calib: --model: needs at least d= and s="),
        (["bench", "gemm", "--model", "d=60,s=8,a=7"], "calib: --model: d=60, a=7, t=1: need d % a == 0"),
        (["bench", "gemm", "--device", "tpu"], "calib: --device: 'tpu' is not a torch device"),
        (["bench", "gemm", "-n", "0"], "calib: --iters: need warmup >= 0, iters >= 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli([*args, "--store", str(tmp_path)], capsys)
    assert code == 2
    assert err.startswith(line) and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())  # nothing written


def test_existing_run_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "bench",
        "gemm",
        "--sizes",
        "8",
        "-w",
        "0",
        "-n",
        "1",
        "-r",
        "1",
        "--name",
        "same",
        "--store",
        str(tmp_path),
    ]
    assert run_cli(args, capsys)[0] == 0
    code, _, err = run_cli(args, capsys)
    assert code == 2 and err.startswith("calib: --name: a run 'same' already exists")


def test_cuda_device_without_cuda_subprocess(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = subprocess.run(
        [sys.executable, "-m", "calib.cli", "bench", "gemm", "--device", "cuda", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr == "calib: --device: CUDA is not available on this machine\n"
