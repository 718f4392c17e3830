"""The device model is one GPU's physics: a traced run of several ranks is left out by name.

Until stop 29 a multi-rank GPU run with a model shape fed the fit: its kernel tables hold
every rank's kernels, so its kernel seconds, streamed bytes and GEMM counts came in N times
(2x for the two-rank copy below), and its step includes communication."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from calib.api import SystemModel, ingest_run, load_runs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
DENSE = ("llama-d1024-l16-repeat", "g350m-b16", "llama-d3072-s2k")


def _two_ranks(src: Path, dst: Path) -> Path:
    """A real single-GPU run made a two-rank one: rank 1 is rank 0's trace under rank 1."""
    shutil.copytree(src, dst)
    t = json.loads(gzip.decompress((src / "rank0.pt.trace.json.gz").read_bytes()))
    for rank in (0, 1):
        t["calib"].update(rank=rank, world_size=2)
        (dst / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(t).encode(), 1))
    cfg = json.loads((src / "run_config.json").read_text())
    cfg.update(world_size=2, files={"0": "rank0.pt.trace.json.gz", "1": "rank1.pt.trace.json.gz"})
    (dst / "run_config.json").write_text(json.dumps(cfg))
    return dst


def _fit(store: Path) -> SystemModel:
    for b in (FIX / "h100" / "gemm-bench").iterdir():
        shutil.copytree(b, store / "h100-hf" / "runs" / b.name, dirs_exist_ok=True)
    return SystemModel().fit(load_runs(system="h100-hf", store=store))


def test_a_multi_rank_run_is_left_out_of_the_device_model_by_name(tmp_path):
    from calib.calibrate import device_facts

    base, more = tmp_path / "base", tmp_path / "more"
    for store in (base, more):
        for n in DENSE:
            ingest_run(FIX / "h100b" / "runs" / n, system="h100-hf", store=store)
    two = _two_ranks(FIX / "h100b" / "runs" / "llama-d3072-s2k", tmp_path / "two")
    ingest_run(two, system="h100-hf", store=more, name="d3072-two-ranks")
    (run,) = load_runs(["d3072-two-ranks"], system="h100-hf", store=more, kind="trace")
    (one,) = load_runs(["llama-d3072-s2k"], system="h100-hf", store=more, kind="trace")
    # why: the run's kernel table holds both ranks' kernels
    assert device_facts.facts(run).class_s["gemm"] == pytest.approx(
        2 * device_facts.facts(one).class_s["gemm"]
    )
    m0, m1 = _fit(base), _fit(more)
    assert any(
        "d3072-two-ranks (2 ranks: its step includes communication)" in n for n in m1.calibration_.notes
    )
    fam0, _ = m0.device_model_.family("swiglu", "bf16")
    fam1, _ = m1.device_model_.family("swiglu", "bf16")
    assert fam1.bytes_d.value == fam0.bytes_d.value and fam1.runs == fam0.runs
