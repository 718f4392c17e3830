"""The fixture generator: real multi-process gloo training, and the committed set it made."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from calib.ingest.capture.check import check_run
from calib.ingest.capture.runconfig import read_run_config, trace_name
from calib.ingest.capture.runspec import GPTShape, ProfileWindow, RunSpec

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "fixtures" / "traces" / "generated"
sys.path.insert(0, str(ROOT / "fixtures"))
import generate  # noqa: E402  (fixtures/generate.py: the committed run list)


def load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def ops(trace: dict, name: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("name") == name]


def step_windows(trace: dict) -> dict[int, tuple[float, float]]:
    return {
        int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"])
        for e in trace["traceEvents"]
        if e.get("name", "").startswith("ProfilerStep#")
    }


def allreduce_elems_per_step(trace: dict) -> dict[int, int]:
    """Elements all-reduced by gloo in each ProfilerStep window (from Input Dims)."""
    out: dict[int, int] = {}
    for step, (t0, t1) in step_windows(trace).items():
        out[step] = sum(
            e["args"]["Input Dims"][0][0] for e in ops(trace, "gloo:all_reduce") if t0 <= e["ts"] < t1
        )
    return out


@pytest.mark.slow
def test_generate_tiny_ddp_run_on_two_gloo_ranks(tmp_path: Path) -> None:
    from calib.ingest.capture.train import generate_run

    shape = GPTShape(d=32, l=1, a=2, s=16, V=64, b=2)
    spec = RunSpec("tiny", "ddp", 2, shape, window=ProfileWindow(wait=0, warmup=1, active=2, after=1))
    cfg = generate_run(spec, tmp_path / "tiny", system="test-sys")

    files = sorted(p.name for p in (tmp_path / "tiny").iterdir())
    assert files == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "run_config.json"]
    for rank in (0, 1):
        trace = load(tmp_path / "tiny" / trace_name(rank))
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
        assert trace["distributedInfo"]["backend"] == "gloo"
        assert trace["calib"]["system"] == "test-sys" and trace["calib"]["rank"] == rank
        assert sorted(step_windows(trace)) == [1, 2]  # warmup step 0 dropped, active 1..2
        # the QKV projection with its shapes: bias [3d], input [b*s, d], weight^T [d, 3d]
        dims = [e["args"]["Input Dims"][:3] for e in ops(trace, "aten::addmm")]
        assert [[96], [32, 32], [32, 96]] in dims
        # DDP all-reduces every gradient once per step: the elements sum to the parameters
        assert set(allreduce_elems_per_step(trace).values()) == {shape.params}

    assert cfg["world_size"] == 2 and cfg["system"] == "test-sys"
    assert cfg["framework"] == {"name": "ddp", "zero_stage": 0, "sharding_strategy": None}
    assert cfg["model"]["d"] == 32 and cfg["model"]["params"] == shape.params
    assert cfg["step_phases"] == ["warmup", "active", "active", "after"]
    assert sorted(cfg["step_times_s"]) == ["0", "1"] and all(
        len(v) == 4 for v in cfg["step_times_s"].values()
    )
    assert check_run(tmp_path / "tiny").ready


def test_committed_set_is_what_the_generator_lists() -> None:
    specs = generate.committed_set()
    assert {p.name for p in GENERATED.iterdir() if p.is_dir()} == {s.name for s in specs}
    widths = {s.model.d for s in specs if s.framework == "ddp" and s.world_size == 2}
    assert widths >= {64, 128, 256}
    assert {s.world_size for s in specs} == {1, 2, 4}
    kinds = {(s.framework, s.effective_zero_stage) for s in specs}
    assert kinds >= {
        ("ddp", 0),
        ("fsdp", 3),
        ("fsdp", 2),
        ("fsdp2", 3),
        ("deepspeed", 1),
        ("deepspeed", 2),
        ("deepspeed", 3),
    }
    for spec in specs:
        cfg = read_run_config(GENERATED / spec.name)
        assert cfg is not None, spec.name
        assert cfg["world_size"] == spec.world_size
        assert cfg["framework"] == spec.framework_json()
        assert {k: cfg["model"][k] for k in ("d", "l", "a", "s", "V", "b", "attention")} == {
            "d": spec.model.d,
            "l": spec.model.l,
            "a": spec.model.a,
            "s": spec.model.s,
            "V": spec.model.V,
            "b": spec.model.b,
            "attention": spec.model.attention,
        }
        assert cfg["complete"] is True and cfg["system"] == "cpu-gloo"
        assert sorted(cfg["files"].values()) == sorted(trace_name(r) for r in range(spec.world_size))


def test_committed_files_match_source_txt() -> None:
    rows = [
        ln.split(" | ") for ln in (GENERATED / "SOURCE.txt").read_text().splitlines() if ln.count(" | ") == 6
    ]
    listed = {(r[0], r[4]): r[6] for r in rows[1:]}  # skip the header row
    on_disk = {(p.parent.name, p.name): p for p in GENERATED.glob("*/*") if p.is_file()}
    assert set(listed) == set(on_disk)
    for key, path in on_disk.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == listed[key], key
    total = sum(p.stat().st_size for p in on_disk.values())
    assert total < 6 * 2**20  # "a few MB"


@pytest.mark.parametrize("run", [s.name for s in generate.committed_set()])
def test_committed_run_is_calibration_ready(run: str) -> None:
    report = check_run(GENERATED / run)
    assert report.ready, [f.message for f in report.findings]
    assert all(t.steps == (2, 3, 4) and t.shapes and t.system == "cpu-gloo" for t in report.traces)
    if report.config["world_size"] > 1:
        assert all(t.n_comm > 0 and t.comm_sized > 0 for t in report.traces)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_committed_ddp_allreduces_all_parameters_each_step(d: int) -> None:
    """Gloo all-reduce sizes in the real traces add up to the model's parameter count."""
    run = GENERATED / f"ddp-d{d}-ws2"
    params = read_run_config(run)["model"]["params"]
    assert params == generate.shape(d).params
    for rank in (0, 1):
        assert allreduce_elems_per_step(load(run / trace_name(rank))) == {2: params, 3: params, 4: params}


def test_committed_sdpa_run_has_fused_attention_and_math_runs_bmm() -> None:
    sdpa = load(GENERATED / "ddp-sdpa-d128-ws2" / trace_name(0))
    math = load(GENERATED / "ddp-d128-ws2" / trace_name(0))
    assert any(re.match(r"aten::_scaled_dot_product", e.get("name", "")) for e in sdpa["traceEvents"])
    # math attention: per layer and step, scores and context bmm of (b*a, s, d/a) in forward
    bmm_dims = [e["args"]["Input Dims"] for e in ops(math, "aten::bmm")]
    assert [[16, 64, 32], [16, 32, 64]] in bmm_dims  # q @ k^T: b*a = 16, s = 64, d/a = 32


def test_generator_cli_lists_and_rejects_unknown_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "fixtures" / "generate.py"), "--list"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(out.splitlines()) == len(generate.committed_set())
    assert "ds-z2-d128-ws2" in out and "zero=2" in out
    bad = subprocess.run(
        [sys.executable, str(ROOT / "fixtures" / "generate.py"), "--only", "nope*"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0 and "matches no run" in bad.stderr
