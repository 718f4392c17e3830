"""`calib predict`, `calib search`, `calib validate`: outputs and bad input (one line, exit 2,
nothing half-written)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import bad, run

ROOT = Path(__file__).parents[1]
SC21 = ROOT / "fixtures" / "published" / "megatron_sc21_table1_weak_scaling.csv"


def test_predict_table_json_csv():
    text = run(
        "predict", "--hardware", "tg40", "--model", "gpt-6.7b", "--gpus", "8,16,64", "--zero", "2"
    ).output
    for section in ("time per iteration", "memory per GPU, GB", "throughput and scaling", "stated defaults"):
        assert section in text
    out = json.loads(
        run(
            "predict", "--hardware", "tg40", "--model", "gpt-6.7b", "--gpus", "64,8", "--zero", "2", "--json"
        ).output
    )
    assert [c["gpus"] for c in out["configs"]] == [8, 64]
    c8 = out["configs"][0]
    assert c8["speedup"] == 1.0 and c8["dp_reducescatter_s"] > 0 and c8["dp_allreduce_s"] == 0
    parts = sum(c8[k] for k in ("kernel_transformer_s", "kernel_other_s", "dispatch_intra_s", "dispatch_inter_s", "tp_s", "pp_s",
                                "dp_allreduce_exposed_s", "dp_allgather_exposed_s", "dp_reducescatter_exposed_s", "bubble_s",
                                "optimizer_s"))  # fmt: skip
    assert parts == pytest.approx(c8["iter_s"])
    csv = run(
        "predict",
        "--hardware",
        "tg40",
        "--d",
        "4096",
        "--l",
        "32",
        "--a",
        "32",
        "--s",
        "2048",
        "--gpus",
        "8,16",
        "--csv",
    ).output
    assert pd.read_csv(__import__("io").StringIO(csv))["gpus"].tolist() == [8, 16]


def test_predict_reports_oom_without_failing():
    out = json.loads(
        run(
            "predict",
            "--hardware",
            "polaris",
            "--model",
            "gpt-18.4b",
            "--gpus",
            "8,512",
            "--zero",
            "1",
            "--json",
        ).output
    )
    assert [c["oom"] for c in out["configs"]] == [True, True]
    assert any("OOM" in n for n in out["notes"])


def test_predict_out_file_is_atomic(tmp_path):
    target = tmp_path / "p.json"
    run("predict", "--hardware", "b200", "--model", "gpt-1.3b", "--gpus", "8", "--json", "-o", str(target))
    assert json.loads(target.read_text())["configs"][0]["gpus"] == 8
    assert not list(tmp_path.glob(".*tmp"))
    err = bad(
        "predict",
        "--hardware",
        "b200",
        "--model",
        "gpt-1.3b",
        "--gpus",
        "8",
        "-o",
        str(tmp_path / "nope" / "x.json"),
    )
    assert err.where == "--out" and "no such directory" in err.problem


@pytest.mark.parametrize(
    ("args", "where", "words"),
    [
        (["--tp", "3", "--gpus", "24"], "--tp", "TP=3 does not divide the 40 attention heads"),
        (
            ["--tp", "8", "--pp", "4", "--gpus", "48"],
            "--gpus",
            "48 GPUs are not divisible by TP x PP = 8 x 4",
        ),
        (
            ["--global-batch", "100", "--micro-batch", "2", "--gpus", "16"],
            "--global-batch",
            "not divisible by DP x micro-batch",
        ),
        (["--pp", "48", "--gpus", "48"], "--pp", "PP=48 exceeds the 40 layers"),
        (
            ["--pp", "3", "--interleave", "15", "--gpus", "24"],
            "--interleave",
            "v=15 exceeds the 14 layers of the largest pipeline stage",
        ),
        (
            ["--zero", "1", "--shard-group", "4", "--gpus", "16"],
            "--shard-group",
            "shards ZeRO-2/3 states",
        ),
        (["--seq-parallel"], "--seq-parallel", "needs TP > 1"),
        (["--interleave", "2"], "--interleave", "needs PP > 1"),
        (["--gpus", "8,x"], "--gpus", "comma-separated integers"),
        (["--zero", "4"], "--zero", "must be 0..3"),
        (["--tp", "two"], "--tp", "expected an integer"),
        (["--recompute", "some"], "--recompute", "not one of none, selective, full"),
    ],
)
def test_predict_bad_strategy(args, where, words):
    base = {"--hardware": "tg80", "--model": "gpt-13b", "--gpus": "8"}
    for k in args[::2]:
        base.pop(k, None)
    flat = [x for kv in base.items() for x in kv] + args
    err = bad("predict", *flat)
    assert err.where == where and words in err.problem


def test_bad_names_and_files(tmp_path):
    assert (
        "unknown model 'gpt-99b'"
        in bad("predict", "--hardware", "tg80", "--model", "gpt-99b", "--gpus", "8").problem
    )
    assert (
        "unknown hardware 'tpu9'"
        in bad("predict", "--hardware", "tpu9", "--model", "gpt-13b", "--gpus", "8").problem
    )
    spec = tmp_path / "hw.yaml"
    spec.write_text("device: [unclosed\n")
    err = bad("predict", "--hardware", str(spec), "--model", "gpt-13b", "--gpus", "8")
    assert err.where == str(spec) and "malformed YAML" in err.problem
    assert "say which machine" in bad("predict", "--model", "gpt-13b", "--gpus", "8").problem
    err = bad("predict", "--system", "nosuch", "--store", str(tmp_path), "--model", "gpt-13b", "--gpus", "8")
    assert "no calibration for system 'nosuch'" in err.problem
    assert "missing --l" in bad("predict", "--hardware", "tg80", "--d", "1024", "--gpus", "8").problem


def test_search_ranks_and_counts():
    out = json.loads(run("search", "--model", "megatron-1.7b", "--gpus", "32", "--global-batch", "64", "--hardware", "selene",
                         "--top", "4", "--json").output)  # fmt: skip
    assert out["strategies"] > 1000 and 0 < out["feasible"] <= out["strategies"]
    times = [r["iter_s"] for r in out["top"]]
    assert times == sorted(times) and len(times) == 4
    text = run(
        "search",
        "--model",
        "megatron-1.7b",
        "--gpus",
        "16-64:16",
        "--global-batch",
        "64",
        "--hardware",
        "selene",
    ).output
    assert "strategies/s" in text and "best strategy per GPU count" in text
    sweep = json.loads(run("search", "--model", "megatron-1.7b", "--gpus", "16,32", "--global-batch", "64",
                           "--hardware", "selene", "--json").output)  # fmt: skip
    assert [r["gpus"] for r in sweep["best_per_gpus"]] == [16, 32]
    assert {r["recompute"] for r in sweep["best_per_gpus"] + sweep["top"]} <= {"none", "selective", "full"}


@pytest.mark.parametrize(
    ("args", "where", "words"),
    [
        (["--gpus", "0"], "--gpus", "must be positive"),
        (["--gpus", "8-x"], "--gpus", "range START-STOP:STEP"),
        (["--zero", "5"], "--zero", "among 0,1,2,3"),
        (["--model", "gpt-13b"], "--global-batch", "no default global batch"),
    ],
)
def test_search_bad_input(args, where, words):
    base = {"--model": "megatron-1.7b", "--gpus": "32", "--hardware": "selene"}
    for k in args[::2]:
        base.pop(k, None)
    err = bad("search", *[x for kv in base.items() for x in kv], *args)
    assert err.where == where and words in err.problem


def test_validate_outputs():
    text = run("validate", str(SC21), "--calibrate-on", "1,4,7,10").output
    assert "held-out rows 6" in text and "sc21-530B" in text
    rows = pd.read_csv(__import__("io").StringIO(run("validate", str(SC21), "--fit", "none", "--csv").output))
    assert len(rows) == 10 and rows["measured"].iloc[-1] == 163


def test_validate_bad_tables(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("a,b\n1,2\n")
    assert "unrecognised table" in bad("validate", str(f)).problem
    f.write_text('d_model,n_layers\n"unterminated\n')
    assert bad("validate", str(f)).where == str(f)
    assert "no such file" in bad("validate", str(tmp_path / "missing.csv")).problem
    err = bad("validate", str(SC21), "--calibrate-on", "1,2", "--holdout", "0.5")
    assert "at most one of" in err.problem
    err = bad("validate", str(SC21), "--holdout", "1.5")
    assert err.where == "--holdout"


@pytest.mark.parametrize(
    "argv",
    [
        ["predict", "--hardware", "tg80", "--model", "gpt-13b", "--gpus", "8", "--tp", "3"],
        ["predict", "--hardware", "tg80", "--model", "gpt-13b", "--zero", "9"],
        ["predict", "--hardware", "tg80", "--model", "gpt-13b"],
        ["search", "--model", "nope", "--gpus", "8", "--hardware", "tg80"],
        ["validate", "README.md"],
    ],
)
def test_console_one_line_exit_2(argv, tmp_path):
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", "calib.cli", *argv, "-o", str(out)] if argv[0] != "validate" else
                          [sys.executable, "-m", "calib.cli", *argv], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("calib: ") and "Traceback" not in done.stderr
    assert not out.exists()
