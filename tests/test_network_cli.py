"""The network model through the CLI on the real Polaris logs: ``calib show --sizes --json``
from a clean store, populations (NCCL version x setup) and refusing cut-off log directories."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from calib.cli import cli
from calib.core.collective_names import busbw_factor
from calib.core.errors import InputError
from calib.core.rundir import read_run
from calib.core.store import run_dir
from tests.conftest import FIXTURES

LOGS = FIXTURES / "nccl-tests"
NAMES = ("allreduce", "allgather", "alltoall", "reducescatter", "broadcast", "reduce", "sendrecv")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), standalone_mode=False, catch_exceptions=False)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store filled the way a user does it from a clean clone: two ``calib ingest`` calls."""
    root = tmp_path_factory.mktemp("store")
    for d in ("polaris", "polaris-nccl2.21"):
        invoke("ingest", str(LOGS / d), "--system", "polaris", "--store", str(root))
    res = invoke("fit", "--system", "polaris", "--store", str(root))
    assert "used setup 5" in res.output and "used 2.21" in res.output  # the default says which population
    return root


def _show(store: Path, *extra: str) -> dict:
    return json.loads(invoke("show", "polaris", "--store", str(store), "--json", *extra).output)


def test_show_predictions_json(store):
    doc = _show(store, "--nodes", "128,256,540", "--sizes", "1M,16M,64M,256M,1G")
    preds = doc["predictions"]
    assert [p["collective"] for p in preds[::15]] == list(NAMES)  # nccl-tests names and order
    assert len(preds) == 7 * 3 * 5
    for p in preds:
        assert {
            "collective",
            "nodes",
            "gpus",
            "bytes",
            "time_s",
            "busbw_gbps",
            "busbw_lo_gbps",
            "busbw_hi_gbps",
        } <= set(p)
        assert p["gpus"] == 4 * p["nodes"] and p["bytes"] in (2**20, 2**24, 2**26, 2**28, 2**30)
        f = float(busbw_factor(p["collective"], p["gpus"])) if p["collective"] != "sendrecv" else 1.0
        assert p["busbw_gbps"] == pytest.approx(p["bytes"] * f / p["time_s"] / 1e9, rel=1e-9)
        assert p["busbw_lo_gbps"] <= p["busbw_gbps"] <= p["busbw_hi_gbps"]
    measured = [p for p in preds if p["collective"] in ("allreduce", "allgather", "alltoall")]
    assert all(p["busbw_hi_gbps"] > p["busbw_lo_gbps"] for p in measured)  # every band has a width
    derived = [p for p in preds if p["collective"] in ("reducescatter", "broadcast", "reduce", "sendrecv")]
    assert all("derived" in p["note"] for p in derived)
    assert doc["network_source"] == "nccl-tests setup=5 nccl=2.21"


def test_show_at_a_measured_scale_matches_the_log(store):
    """8 nodes, 1 GiB: the model against the NCCL 2.21 setup-5 logs (median busbw of the
    out-of-place and in-place lines: all-gather 36.40, all-reduce 36.43, all-to-all 5.21 GB/s)."""
    preds = {p["collective"]: p for p in _show(store, "--nodes", "8", "--sizes", "1G")["predictions"]}
    assert preds["allgather"]["busbw_gbps"] == pytest.approx(36.40, rel=0.03)
    assert preds["allreduce"]["busbw_gbps"] == pytest.approx(36.43, rel=0.03)
    assert preds["alltoall"]["busbw_gbps"] == pytest.approx(5.21, rel=0.06)


def test_versions_are_separate_populations(store, tmp_path):
    out = tmp_path / "218.json"
    res = invoke(
        "fit",
        "--system",
        "polaris",
        "--store",
        str(store),
        "--where",
        "nccl_version=unrecorded",
        "--out",
        str(out),
    )
    doc = json.loads(out.read_text())
    assert "nccl=" not in doc["provenance"]["network_source"]  # the logs that do not name a version
    assert not any("used 2.21" in n for n in doc["notes"]) and "unrecorded" in res.output
    with pytest.raises(InputError) as exc:
        invoke("fit", "--system", "polaris", "--store", str(store), "--where", "nccl_version=2.21,unrecorded",
               "--out", str(tmp_path / "x.json"))  # fmt: skip
    assert "several NCCL versions" in exc.value.problem


def _copy_with_bad_file(tmp_path: Path, how: str) -> tuple[Path, Path]:
    src = LOGS / "polaris" / "n2.g4.2024-04-29-18-41-24"
    dst = tmp_path / "logs"
    shutil.copytree(src, dst)
    bad = dst / "all_reduce_output.dat.3"
    text = bad.read_text()
    bad.write_text("" if how == "empty" else text[: len(text) // 2])  # a failed job / a job cut off mid-line
    return dst, bad


@pytest.mark.parametrize("how", ["empty", "truncated"])
def test_bad_log_is_refused_in_one_line_and_skip_bad_ingests_the_rest(tmp_path, how):
    logs, bad = _copy_with_bad_file(tmp_path, how)
    st = tmp_path / "st"
    proc = subprocess.run(
        [sys.executable, "-m", "calib.cli", "ingest", str(logs), "--system", "polaris", "--store", str(st)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and str(bad) in lines[0] and "--skip-bad" in lines[0]
    assert not st.exists() or not any(st.rglob("run.json"))
    invoke("ingest", str(logs), "--system", "polaris", "--store", str(st), "--name", "ok", "--skip-bad")
    run = read_run(run_dir(st, "polaris", "ok"))
    skipped = [n for n in run.meta.notes if n.startswith("skipped bad file")]
    assert len(skipped) == 1 and str(bad) in skipped[0]
    files = set(run.table("samples")["file"].astype(str))
    assert len(files) == 14 and not any(f.endswith("all_reduce_output.dat.3") for f in files)
    n_ar = run.table("samples").query("collective == 'allreduce'")["setup"]
    assert sorted(np.unique(n_ar)) == [1, 2, 4, 5]


def test_analytic_model_times_every_collective_with_the_network_model(store):
    """group_time_s (what calib predict/search use) across 540 nodes is the fitted NCCL
    model's time, for the measured collectives and for the derived ones alike."""
    from calib.analytic.comm import group_time_s
    from calib.calibrate.calibration import Calibration

    cal = Calibration.load(store / "polaris" / "polaris.calib.json")
    S = np.array([2.0**20, 2.0**26, 2.0**30])
    for coll in NAMES:
        t = group_time_s(cal, coll, S, 2160, 4)
        np.testing.assert_allclose(t, cal.network[coll].model_time_s(S, 2160.0)[0], rtol=1e-12)
    # a DP all-reduce over 540 nodes with one rank per node puts a full node's bytes on the NICs
    t1 = group_time_s(cal, "allreduce", S, 540, 1)
    np.testing.assert_allclose(
        t1, cal.network["allreduce"].model_time_s(S * 4 * (539 / 540) / (2159 / 2160), 2160.0)[0]
    )
