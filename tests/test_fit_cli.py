"""``calib runs``, ``calib fit`` and ``calib show`` end to end on the real Polaris logs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from calib.calibrate.calibration import DEFAULT, Calibration
from calib.ingest.nccl_tests import ingest_nccl_tests
from click.testing import CliRunner

from calib.cli import cli
from calib.core.errors import InputError
from calib.core.rundir import write_run
from calib.core.store import calibration_path, run_dir
from tests.conftest import CPU_TRACES, FIXTURES


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store with the Polaris logs as one nccl-tests run of system 'polaris'."""
    root = tmp_path_factory.mktemp("store")
    meta, tables = ingest_nccl_tests([FIXTURES / "nccl-tests"], name="polaris-nccl", system="polaris")
    write_run(run_dir(root, "polaris", "polaris-nccl"), meta, tables)
    return root


def invoke(*args: str):
    """Run the CLI in-process; bad input surfaces as InputError (what main() turns into exit 2)."""
    return CliRunner().invoke(cli, list(args), standalone_mode=False, catch_exceptions=False)


def test_runs_lists_the_store(store):
    out = invoke("runs", "--store", str(store)).output
    assert (
        "polaris-nccl" in out and "nccl-tests" in out and "1566 samples" in out and "setups 1,2,3,4,5" in out
    )


def test_fit_and_show_polaris(store, tmp_path):
    out_file = tmp_path / "polaris.calib.json"
    res = invoke("fit", "--system", "polaris", "--store", str(store), "--out", str(out_file))
    assert "used setup 5" in res.output  # the best setup is chosen, and said so
    cal = Calibration.load(out_file)
    assert {c.collective for c in cal.collectives} == {"allreduce", "allgather", "alltoall"}
    assert {c.n_gpus for c in cal.collectives} == {8, 32} and cal.gpus_per_node == 4
    assert cal.k1_curve.y_max.status == DEFAULT and "no trace runs" in cal.k1_curve.y_max.note
    assert cal.dispatch["intra_op_s_per_op"].status == DEFAULT
    shown = invoke("show", str(out_file)).output
    for nodes in ("128 nodes", "256 nodes", "540 nodes"):
        assert nodes in shown
    assert "tau(c)" in shown and "held-out" in shown and "Provenance" in shown


def test_where_setup_and_same_inputs_same_calibration(store, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    invoke("fit", "--system", "polaris", "--store", str(store), "--where", "setup=4", "--out", str(a))
    invoke("fit", "--system", "polaris", "--store", str(store), "--where", "setup=4", "--out", str(b))
    ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    ja.pop("created"), jb.pop("created")
    assert ja == jb
    assert ja["provenance"]["where"] == {"setup": ["4"]}
    assert ja["collectives"][0]["source"].startswith("nccl-tests setup=4")
    c = tmp_path / "c.json"
    invoke("fit", "--system", "polaris", "--store", str(store), "--where", "setup=5", "--out", str(c))
    assert json.loads(c.read_text())["collectives"] != ja["collectives"]  # setups are fitted apart


def test_fit_writes_into_the_store_by_default(store):
    invoke("fit", "--system", "polaris", "--store", str(store), "--where", "nccl_version=2.21")
    path = calibration_path(store, "polaris")
    cal = Calibration.load(path)
    assert "nccl=2.21" in cal.collectives[0].source
    assert "polaris" in invoke("show", "polaris", "--store", str(store), "--brief").output


@pytest.mark.parametrize(
    ("args", "where", "problem"),
    [
        (["--system", "nosuch"], "--system nosuch", "what each factor needs"),
        (["--system", "polaris", "--where", "color=red"], "--where", "unknown key 'color'"),
        (["--system", "polaris", "--where", "setup"], "--where", "is not key=value"),
        (["--system", "polaris", "--where", "setup=9"], "--where", "matches none of the"),
        (["--system", "polaris", "--where", "setup=4,5"], "--where", "fit one at a time"),
        (["--system", "polaris", "--where", "nnodes=two"], "--where", "takes numbers"),
        (["--system", "polaris", "--peak-tflops", "-3"], "--peak-tflops", "must be positive"),
        (["--system", "../x"], "--system", "not a valid system name"),
    ],
)
def test_fit_bad_input(store, tmp_path, args, where, problem):
    out = tmp_path / "never.json"
    with pytest.raises(InputError) as exc:
        invoke("fit", "--store", str(store), "--out", str(out), *args)
    assert exc.value.where == where and problem in exc.value.problem.lower()
    assert not out.exists() and not list(tmp_path.iterdir())


def test_unwritable_out_is_bad_input(store):
    with pytest.raises(InputError) as exc:
        invoke("fit", "--system", "polaris", "--store", str(store), "--out", "/proc/no/such.calib.json")
    assert exc.value.where == "--out" and "cannot write" in exc.value.problem


def test_system_with_only_unusable_runs_says_what_each_factor_needs(tmp_path):
    from calib.core.schema import RunMeta

    write_run(run_dir(tmp_path, "empty", "r"), RunMeta(name="r", kind="bench", system="empty"), {})
    with pytest.raises(InputError) as exc:
        invoke("fit", "--system", "empty", "--store", str(tmp_path))
    for need in ("nccl-tests logs", ">= 2 node counts", "profiler traces", "peak_tflops"):
        assert need in exc.value.problem
    assert not calibration_path(tmp_path, "empty").exists()


def test_one_scale_marks_eff_unidentifiable(store, tmp_path):
    out = tmp_path / "one.json"
    invoke("fit", "--system", "polaris", "--store", str(store), "--where", "nnodes=8", "--out", str(out))
    cal = Calibration.load(out)
    ag = cal.network["allgather"]
    # one scale is enough for the NCCL-structured model: tau(c) comes from that scale's chunks
    assert ag.form == "nccl" and "allgather 8 nodes" in ag.params["derived"].note
    assert float(cal.collective_time_s("allgather", 2**30, 2160)) > 0


def test_show_bad_input(tmp_path):
    with pytest.raises(InputError, match="no calibration at"):
        invoke("show", "nosuch", "--store", str(tmp_path))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(InputError, match="not a calib calibration"):
        invoke("show", str(bad))
    with pytest.raises(InputError, match="node counts"):
        invoke("show", str(bad), "--nodes", "0,12")


def test_exit_code_and_single_line_through_the_console(store, tmp_path):
    env = {**os.environ, "CALIB_STORE": str(store)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "calib.cli",
            "fit",
            "--system",
            "polaris",
            "--where",
            "setup=42",
            "--out",
            str(tmp_path / "x.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("calib: --where: setup=42")
    assert not (tmp_path / "x.json").exists()


def test_trace_runs_feed_dispatch_and_k1(tmp_path):
    """Real CPU traces of one model: dispatch per op is fitted, k1 is anchored but unidentifiable."""
    from calib.ingest.orchestrate import IngestOptions, ingest

    for key in ("ws2_ddp_rank0", "ws2_fsdp_full_rank0"):
        meta, tables = ingest([CPU_TRACES[key]], IngestOptions(system="cpu", name=key))
        write_run(run_dir(tmp_path, "cpu", key), meta, tables)
    out = tmp_path / "cpu.json"
    invoke("fit", "--system", "cpu", "--store", str(tmp_path), "--out", str(out))
    cal = Calibration.load(out)
    d = cal.dispatch["intra_op_s_per_op"]
    assert d.status == "fitted" and 1e-6 < d.value < 1e-3
    assert cal.k1_curve.y_max.status == "unidentifiable" and "one work level" in cal.k1_curve.y_max.note
    # anchored: the curve passes through the measured k1 at the measured work level
    pts = cal.provenance["trace_points"]
    x0, k1 = np.median([p["x_flops"] for p in pts]), np.median([p["k1"] for p in pts])
    assert len(pts) == 2 and float(cal.k1(x0)) == pytest.approx(k1, rel=1e-6)
    assert cal.collectives == () and any("no nccl-tests samples" in n for n in cal.notes)
