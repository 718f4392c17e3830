"""Ingest's physics checks (ingest/orchestrate._physics_checks) on real GPU traces: a GEMM
class faster than the device's datasheet peak is flagged and left out of calibration, with
FP8 operands held to the FP8 peak.  Until stop 23 every GEMM was held to the BF16 peak, so
the real H200 FP8 run (1261 TFLOP/s over its GEMMs) was flagged and a fit from FP8 runs
alone lost its GEMM class."""

from __future__ import annotations

from pathlib import Path

import pytest
from calib.ingest.orchestrate import _physics_checks

from calib.api import ingest_run, load_runs

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "h200" / "runs"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    store = tmp_path_factory.mktemp("s")
    for name in ("llama-fp8-d2048-s4k", "llama-gqa-d2048-s4k"):
        ingest_run(H200 / name, system="h200-hf", store=store)
    return {r.meta.name: r for r in load_runs(system="h200-hf", store=store, kind="trace")}


def _tables(run) -> dict:
    return {"gemms": run.table("gemms"), "device_ops": run.table("device_ops")}


def test_fp8_gemms_are_held_to_the_fp8_peak(runs):
    fp8 = runs["llama-fp8-d2048-s4k"]
    assert fp8.meta.devices == ("NVIDIA H200",)
    assert not any("physics warning" in n for n in fp8.meta.notes)
    # the same FP8 GEMMs on a device without FP8 units are impossible
    warns = _physics_checks(_tables(fp8), ("NVIDIA A100-SXM4-80GB",))
    (warn,) = (w for w in warns if "kernel class gemm" in w)
    assert warn.startswith("physics warning: kernel class gemm: matmuls run at") and "312 TFLOP/s" in warn


def test_bf16_gemms_above_the_peak_are_flagged(runs):
    """The BF16 run's GEMMs (about 700 TFLOP/s) fit the H200's 989 but not an A100's 312
    (the check a mislabelled device name would trip)."""
    bf16 = runs["llama-gqa-d2048-s4k"]
    assert _physics_checks(_tables(bf16), ("NVIDIA H200",)) == []
    warns = _physics_checks(_tables(bf16), ("NVIDIA A100-SXM4-40GB",))
    (warn,) = (w for w in warns if "kernel class gemm" in w)
    assert "(left out of calibration)" in warn
