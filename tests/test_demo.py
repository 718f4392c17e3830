"""`calib demo`: the whole pipeline on the bundled fixtures, in under two minutes, into a
store of its own; the report it writes holds every panel the issue lists.

The demo runs once per test session (:func:`demo_once`); the browser test reuses it.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.test_report import cli


def demo_once() -> tuple[Path, str, float]:
    """(report path, stdout, seconds) of one `calib demo` run through the real CLI.

    The result is kept in a per-process directory (not a module global: pytest may import
    this module twice, as ``test_demo`` and as ``tests.test_demo``), removed at exit.
    """
    root = Path(tempfile.gettempdir()) / f"calib-demo-test-{os.getpid()}"
    done = root / "result.json"
    if not done.is_file():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir()
        atexit.register(shutil.rmtree, root, True)
        t0 = time.perf_counter()
        code, out, err = cli("demo", "--out", root / "demo-out")
        seconds = time.perf_counter() - t0
        assert code == 0, err
        path = out.strip().splitlines()[-2].removeprefix("report: ")
        done.write_text(json.dumps({"path": path, "out": out, "seconds": seconds}))
    r = json.loads(done.read_text())
    return Path(r["path"]), r["out"], r["seconds"]


def test_demo_runs_the_pipeline_in_under_two_minutes(capsys) -> None:
    path, out, seconds = demo_once()
    with capsys.disabled():
        print(f"\ncalib demo took {seconds:.1f} s")
    assert seconds < 120
    lines = out.strip().splitlines()
    assert lines[0].startswith("[1/11] ingest polaris/polaris-nccl-tests")
    assert any(
        line.startswith("[10/11] fit polaris: curves for allgather, allreduce, alltoall") for line in lines
    )
    assert lines[-2] == f"report: {path}" and path.is_file()
    demo_dir = path.parent.parent
    assert (demo_dir / ".calib-demo").is_file()
    assert (demo_dir / "store" / "polaris" / "polaris.calib.json").is_file()


def test_demo_report_has_every_panel() -> None:
    path, _, _ = demo_once()
    figs = {p.stem for p in (path.parent / "figures").glob("*.png")}
    for want in ("predict-zero1", "predict-zero2", "predict-zero3", "predict-memory", "predict-comm-maps",
                 "predict-search", "predict-efficiency", "calibration-busbw", "calibration-eff",
                 "runs-compute-dissection", "runs-kernel-classes", "validate-sc21", "validate-korthikanti",
                 "run-nccl-ddp-a100-hta", "run-two-ranks-of-128-hta", "run-ddp-d64-ws2-buckets"):  # fmt: skip
        assert want in figs, want
    import pandas as pd

    z1 = pd.read_csv(path.parent / "data" / "predict-zero1.csv")
    assert sorted(z1["gpus"].unique()) == [8, 16, 32, 64, 128, 256, 512]
    assert set(z1["model"]) == {"gpt-125m", "gpt-1.3b", "gpt-2.7b", "gpt-6.7b", "gpt-13b", "gpt-18.4b"}
    text = path.read_text()
    assert "Summary" in text and "Validation, sc21: held-out median" in text


def test_demo_out_must_be_new_or_a_demo(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    code, _, err = cli("demo", "--out", tmp_path)
    assert code == 2 and "not empty and was not made by `calib demo`" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("missing", ["fixtures-that-do-not-exist"])
def test_demo_without_fixtures_is_one_line(tmp_path: Path, missing: str) -> None:
    code, _, err = cli("demo", "--out", tmp_path / "d", "--fixtures", tmp_path / missing)
    assert code == 2 and "demo fixtures missing" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()
