"""Calibration-ready data from torch: a profiler capture API, the fixture generator's
engine, and collective and GEMM microbenchmarks.

Importing this package does not import torch; the functions import it when they run.

* :func:`capture` -- profile N steps of your own training loop (one trace per rank,
  shapes, ProfilerStep windows, system tag, ``run_config.json``).
* :func:`check_run` / :func:`collect` -- is a directory calibration-ready; gather traces
  written by Megatron-LM or ``tensorboard_trace_handler`` into one that is.
* :func:`run_collective_bench` / :func:`bench_collectives_local` -- nccl-tests-style
  busbw against message size on the current process group, or on N local gloo ranks.
* :func:`run_gemm_bench` -- matmul TFLOP/s against shape and dtype.
* :func:`generate_run` -- train a tiny GPT under DDP/FSDP/FSDP2/DeepSpeed on local gloo
  ranks and capture it (fixtures/generate.py).
"""

from calib.ingest.capture.bench_collectives import (
    CollectiveBenchConfig,
    bench_collectives_local,
    message_sizes,
    run_collective_bench,
)
from calib.ingest.capture.bench_gemm import (
    GemmBenchConfig,
    GemmShape,
    run_gemm_bench,
    square_shapes,
    transformer_shapes,
)
from calib.ingest.capture.check import CheckReport, Finding, TraceSummary, check_run
from calib.ingest.capture.collect import collect
from calib.ingest.capture.profile import Capture, CaptureSettings, capture
from calib.ingest.capture.runconfig import RUN_CONFIG_NAME, read_run_config, trace_name, write_run_config
from calib.ingest.capture.runspec import GPTShape, ProfileWindow, RunSpec
from calib.ingest.capture.train import generate_run

__all__ = [
    "RUN_CONFIG_NAME",
    "Capture",
    "CaptureSettings",
    "CheckReport",
    "CollectiveBenchConfig",
    "Finding",
    "GPTShape",
    "GemmBenchConfig",
    "GemmShape",
    "ProfileWindow",
    "RunSpec",
    "TraceSummary",
    "bench_collectives_local",
    "capture",
    "check_run",
    "collect",
    "generate_run",
    "message_sizes",
    "read_run_config",
    "run_collective_bench",
    "run_gemm_bench",
    "square_shapes",
    "trace_name",
    "transformer_shapes",
    "write_run_config",
]
