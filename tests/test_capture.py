"""The capture API on a real torch loop, and `calib capture recipe/check/collect`."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from calib.ingest.capture.check import check_run
from calib.ingest.capture.runconfig import read_run_config, trace_name

from calib.cli import main

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "fixtures" / "traces" / "generated"
DDP = GENERATED / "ddp-d128-ws2"


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """calib's console entry point in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def tiny_loop(out: Path, steps: int, **kwargs) -> object:
    import torch
    from calib.ingest.capture.model import TinyGPT, batch
    from calib.ingest.capture.profile import CaptureSettings, capture
    from calib.ingest.capture.runspec import GPTShape

    torch.manual_seed(0)
    shape = GPTShape(d=32, l=1, a=2, s=16, V=64, b=2)
    model = TinyGPT(shape)
    opt = torch.optim.AdamW(model.parameters())
    x, y = batch(shape, 0)
    with capture(
        out,
        system="laptop",
        model=shape.to_json(),
        framework="pytorch",
        settings=CaptureSettings(wait=1, warmup=1, active=2),
        **kwargs,
    ) as cap:
        for _ in range(steps):
            model(x, y).backward()
            opt.step()
            opt.zero_grad()
            cap.step()
    return cap


def test_capture_profiles_a_plain_loop(tmp_path: Path) -> None:
    cap = tiny_loop(tmp_path / "run", steps=6)
    assert cap.done and cap.trace_path == tmp_path / "run" / "rank0.pt.trace.json.gz"
    trace = json.loads(gzip.decompress(cap.trace_path.read_bytes()))
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # wait 1 + warmup 1, then 2 active
    assert trace["calib"]["system"] == "laptop" and trace["calib"]["rank"] == 0
    assert trace["calib"]["profiler"]["profiled_steps"] == [2, 3]
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"] if e.get("cat") == "cpu_op")
    cfg = read_run_config(tmp_path / "run")
    assert cfg["world_size"] == 1 and cfg["complete"] is True and cfg["model"]["d"] == 32
    assert cfg["step_phases"] == ["wait", "warmup", "active", "active", "after", "after"]
    assert len(cfg["step_times_s"]["0"]) == 6 and min(cfg["step_times_s"]["0"]) > 0
    assert [
        p.name for p in (tmp_path / "run").iterdir() if p.name.startswith(".")
    ] == []  # no temp files left
    assert check_run(tmp_path / "run").ready


def test_capture_warns_when_the_loop_ends_before_the_window(tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cap = tiny_loop(tmp_path / "short", steps=2)
    assert not cap.done
    assert any("fewer than the 4 the window needs" in str(w.message) for w in caught)
    assert read_run_config(tmp_path / "short")["complete"] is False


def test_importing_calib_capture_does_not_import_torch() -> None:
    code = "import sys, calib.ingest, calib.capture; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_check_ready_directory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["capture", "check", str(DDP)], capsys)
    assert code == 0 and err == ""
    assert "calibration-ready" in out
    assert "run_config: world size 2, framework ddp (ZeRO 0), model d=128, l=2, a=4, s=64, V=1024, b=4" in out
    report = json.loads(run_cli(["capture", "check", str(DDP), "--json"], capsys)[1])
    assert report["ready"] and [t["rank"] for t in report["traces"]] == [0, 1]


def _strip(src: Path, dst: Path, drop_steps: bool = False, drop_shapes: bool = False) -> None:
    trace = json.loads(gzip.decompress(src.read_bytes()))
    events = trace["traceEvents"]
    if drop_steps:
        events = [e for e in events if not e.get("name", "").startswith("ProfilerStep#")]
    if drop_shapes:
        for e in events:
            e.get("args", {}).pop("Input Dims", None)
    trace["traceEvents"] = events
    dst.write_bytes(gzip.compress(json.dumps(trace).encode()))


def test_check_reports_missing_steps_and_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    _strip(DDP / trace_name(0), bad / trace_name(0), drop_steps=True)
    _strip(DDP / trace_name(1), bad / trace_name(1), drop_shapes=True)
    code, out, err = run_cli(["capture", "check", str(bad)], capsys)
    assert code == 2
    assert err == f"calib: {bad}: not calibration-ready (2 problem(s) listed above)\n"
    assert "MISSING" in out and "no ProfilerStep#N" in out and "no operator shapes" in out
    assert "no run_config.json" in out  # a warning, not a problem


def test_check_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["capture", "check", str(tmp_path / "absent")], capsys)
    assert (code, err) == (2, f"calib: {tmp_path / 'absent'}: no such directory\n")
    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(DDP / trace_name(0), two / "a_rank0.pt.trace.json.gz")
    shutil.copy(DDP / trace_name(0), two / "b_rank0.pt.trace.json.gz")
    (two / "junk.json").write_text("{not json")
    code, out, err = run_cli(["capture", "check", str(two)], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert "several files for rank(s) [0]" in out and "not a Kineto trace (invalid JSON" in out
    bad_cfg = tmp_path / "cfg"
    shutil.copytree(DDP, bad_cfg)
    (bad_cfg / "run_config.json").write_text('{"format": "calib.run_config", "version": 99, "world_size": 2}')
    code, out, _ = run_cli(["capture", "check", str(bad_cfg)], capsys)
    assert code == 2 and "newer than this calib understands" in out


def test_check_subprocess_one_line_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "calib.cli", "capture", "check", str(tmp_path)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr == f"calib: {tmp_path}: not calibration-ready (1 problem(s) listed above)\n"
    assert "no trace files" in proc.stdout


def test_collect_megatron_style_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tb = tmp_path / "tb"
    tb.mkdir()
    for rank in (0, 1):  # tensorboard_trace_handler names, plain JSON
        raw = gzip.decompress((DDP / trace_name(rank)).read_bytes())
        (tb / f"node{rank}_{4242 + rank}.1790000000{rank}.pt.trace.json").write_bytes(raw)
    out = tmp_path / "run"
    code, text, err = run_cli(
        [
            "capture",
            "collect",
            str(tb),
            "--out",
            str(out),
            "--system",
            "polaris",
            "--model",
            "d=128,l=2,a=4,s=64,V=1024,b=4,ffn=256,E=8,topk=2,effn=64,shared=1,dense=1",
            "--framework",
            "megatron",
            "--tp",
            "1",
            "--pp",
            "1",
        ],
        capsys,
    )
    assert (code, err) == (0, "")
    assert sorted(p.name for p in out.iterdir()) == [
        "rank0.pt.trace.json.gz",
        "rank1.pt.trace.json.gz",
        "run_config.json",
    ]
    for rank in (0, 1):  # same events, now gzipped under the rank name
        assert gzip.decompress((out / trace_name(rank)).read_bytes()) == gzip.decompress(
            (DDP / trace_name(rank)).read_bytes()
        )
    cfg = read_run_config(out)
    assert cfg["system"] == "polaris" and cfg["world_size"] == 2 and cfg["parallel"] == {"tp": 1, "pp": 1}
    assert cfg["model"] == {"d": 128, "l": 2, "a": 4, "s": 64, "V": 1024, "b": 4, "ffn": 256, "E": 8, "topk": 2,
                            "effn": 64, "shared": 1, "dense": 1}  # fmt: skip
    assert "calibration-ready" in text


def test_collect_bad_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    cases = [
        (
            ["--model", "d=128,x=3"],
            "--model: 'x=3' is not KEY=VALUE with KEY one of d, l, a, s, V, b, kv, ffn, E, topk, effn, shared, "
            "shffn, dense",
        ),
        (["--model", "d=128,E=8,topk=9"], "--model: model topk=9 experts per token but only E=8"),
        (
            ["--framework", "jax"],
            "--framework: 'jax' is not one of pytorch, ddp, fsdp, fsdp2, deepspeed, megatron",
        ),
        (["--zero-stage", "4"], "--zero-stage: must be 0, 1, 2 or 3, got 4"),
        (["--system", "bad/name"], "--system: 'bad/name' is not a valid system name"),
    ]
    for extra, msg in cases:
        code, _, err = run_cli(["capture", "collect", str(DDP), "--out", str(out), *extra], capsys)
        assert code == 2 and err.startswith(f"calib: {msg}") and len(err.splitlines()) == 1, err
    dup = tmp_path / "dup"
    dup.mkdir()
    shutil.copy(DDP / trace_name(0), dup / "x_rank0.pt.trace.json.gz")
    shutil.copy(DDP / trace_name(0), dup / "y_rank0.pt.trace.json.gz")
    code, _, err = run_cli(["capture", "collect", str(dup), "--out", str(out)], capsys)
    assert code == 2 and "a second trace of rank 0" in err
    assert not out.exists() and [p for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    out.mkdir()
    (out / "x").write_text("keep")
    code, _, err = run_cli(["capture", "collect", str(DDP), "--out", str(out)], capsys)
    assert (code, err) == (2, f"calib: {out}: exists and is not empty; collect into a new directory\n")


@pytest.mark.parametrize("framework", ["pytorch", "torch-only", "deepspeed", "megatron"])
def test_recipe(framework: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["capture", "recipe", "--framework", framework], capsys)
    assert code == 0
    assert {
        "pytorch": "cap.step()",
        "torch-only": "record_shapes=True",
        "deepspeed": "engine.step()",
        "megatron": "--use-pytorch-profiler",
    }[framework] in out


def test_recipe_code_compiles(capsys: pytest.CaptureFixture[str]) -> None:
    for fw in ("pytorch", "torch-only", "deepspeed"):
        compile(run_cli(["capture", "recipe", "--framework", fw], capsys)[1], f"<recipe {fw}>", "exec")
    code, _, err = run_cli(["capture", "recipe", "--framework", "jax"], capsys)
    assert code == 2 and err.startswith("calib: --framework: 'jax' has no recipe")


def test_check_warns_about_absent_ranks_and_refuses_a_wrong_world_size(tmp_path: Path) -> None:
    half = tmp_path / "half"
    half.mkdir()
    shutil.copy(DDP / trace_name(1), half / trace_name(1))
    shutil.copy(DDP / "run_config.json", half / "run_config.json")
    report = check_run(half)
    assert report.ready  # usable: the buckets of rank 1 are still right
    assert [f.message for f in report.findings if f.level == "warn"] == [
        "1 of 2 ranks have no trace ([0]); per-rank buckets and imbalance cover only the ranks present"
    ]
    cfg = json.loads((DDP / "run_config.json").read_text())
    (half / "run_config.json").write_text(json.dumps({**cfg, "world_size": 4}))
    report = check_run(half)
    assert not report.ready
    assert any(
        f.level == "error" and "world_size 4 does not match the traces' [2]" in f.message
        for f in report.findings
    )
