"""The closed loop (issue 7 item 4): trace, calibrate, predict an untraced run, run it, compare.

The slow tests run ``fixtures/closed_loop.py`` once, in a subprocess confined to one CPU
(``--cpus``), with real torch.distributed gloo ranks: the tiny GPT traced at widths
64/128/256 on 1 and 2 ranks, ``calib ingest``, ``calib bench collectives --nproc 2``,
``calib bench gemm``, ``calib fit --system cpu-gloo --gpus-per-node 1 --profiler-overhead
R`` (no peak given: the GEMM benchmark's best), ``calib predict --ranks-per-node N`` of
three configurations never traced -- 4 ranks at d=128 and at d=256, 2 ranks at d=384 (a
width never traced) -- and the real runs of those, measured unprofiled before and after
the calibration.  docs/closed-loop.md has the figures and the commands.

Why one CPU: the development machine is a 2-core VM shared with other sessions' jobs,
and the kernel splits CPU time between sessions (autogroup), so how much of the second
core the loop gets changes within seconds.  Unconfined, the compute slots the fit finds
from the 1- vs 2-rank traces ranged from 1.0 to 2.0 between loops and the errors from
-56 % to +41 % (16 loops, docs/closed-loop.md): the machine, not the model.  Confined to
one core, the node is one compute slot (2 ranks take twice, 4 ranks four times as long
per step), which is exactly the oversubscription the model has to get right, and it
holds whatever the other sessions do.

``BOUND_PCT``: |predicted / measured - 1| of every untraced configuration, and of the
traced reference (d=128, 2 ranks, measured with the targets: the in-sample check).  Over
10 confined loops on the development machine (40 errors) they ranged from -17.0 % to
+17.6 %, mean |error| 6.9 % (docs/closed-loop.md); 30 % is 1.7x the largest, a margin
for a CI machine that is not this one.  It fails when the time-sharing term is missing (the
4-rank predictions lose 75 %, asserted below), and it failed in development when the GEMM
curve pooled the isolated benchmark calls with the traced matmuls (up to +72 %).
The ratio target / reference (``rel_error_pct``) is printed but not asserted: confined,
the drift it divides out is small and the reference's own noise dominates it (-12.7 % to
+29.9 %).

The fast tests check the pieces on the committed generated traces and a real GEMM
benchmark: compute slots from per-rank slowdown, the profiler-overhead correction, the
benchmark's peak and efficiency curve, and a CPU calibration used without a hardware
preset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from calib.analytic.machine import compute_slots
from calib.analytic.specs import ModelSpec
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import evaluate
from calib.calibrate.calibration import FITTED, UNIDENTIFIABLE, Calibration
from calib.calibrate.compute import fit_compute_slots, node_points, run_points
from calib.calibrate.fit import fit_system
from calib.ingest.orchestrate import IngestOptions, ingest

from calib.core.rundir import read_run, write_run
from calib.core.store import list_runs, run_dir
from calib.resolve import resolve_system, system_runs
from tests.conftest import FIXTURES, ROOT

sys.path.insert(0, str(ROOT / "fixtures"))
import closed_loop as loop  # noqa: E402  (fixtures/closed_loop.py)

GEN = FIXTURES / "traces" / "generated"
BOUND_PCT = 30.0
LOOP_TIMEOUT_S = 480


# ---- the loop ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def closed(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    """One loop, confined to one CPU (the last this process may use), in a fresh process:
    its fork server and ranks inherit the affinity."""
    work = tmp_path_factory.mktemp("closed-loop")
    cpu = max(os.sched_getaffinity(0))
    csv = work / "loop.csv"
    cmd = [sys.executable, str(ROOT / "fixtures" / "closed_loop.py"), "--workdir", str(work), "--cpus", str(cpu),
           "--csv", str(csv)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LOOP_TIMEOUT_S, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(proc.stdout[proc.stdout.rfind("loop 1/1") :])
    return work / "loop0", pd.read_csv(csv)


@pytest.mark.slow
def test_predicted_iteration_time_of_untraced_configurations(closed) -> None:
    """The error of calib's prediction against the real, unprofiled runs (bounds: module docstring)."""
    _, df = closed
    targets = df[~df["traced"]].set_index("config")
    assert list(targets.index) == [t.name for t in loop.TARGETS]
    assert (targets["steps"] >= 2 * loop.MEASURE_WINDOW.after).all()
    assert (targets["predicted_s"] > 0).all() and (targets["measured_s"] > 0).all()
    assert df["error_pct"].abs().max() <= BOUND_PCT, df[["config", "predicted_s", "measured_s", "error_pct"]]


@pytest.mark.slow
def test_the_calibration_behind_the_predictions(closed) -> None:
    """calib fit took its peak and GEMM curve from the benchmark and its compute slots from the traces."""
    work, _ = closed
    cal = Calibration.load(work / "store" / loop.SYSTEM / f"{loop.SYSTEM}.calib.json")
    samples = pd.read_parquet(work / "store" / loop.SYSTEM / "runs" / "gemm-t1" / "gemm_samples.parquet")
    assert cal.peak_tflops == pytest.approx(samples["tflops"].max())  # the best sustained, stated so
    assert any("best sustained matmul throughput" in n for n in cal.notes)
    assert cal.gpus_per_node == 1  # the loop's node: one CPU, one thread per rank
    assert cal.device and cal.device != "cpu"  # the benchmark names the processor
    pts = pd.DataFrame(cal.provenance["gemm_points"])
    assert {"trace", "bench"} <= set(pts["source"])
    traced = pts[pts["source"] == "trace"]["x_flops"]
    bench = pts[pts["source"] == "bench"]["x_flops"]
    assert ((bench > traced.max()) | (bench < traced.min())).all()  # the benchmark only extends the curve
    slots = compute_slots(cal)
    assert slots is not None and slots.value == 1.0  # one core: bounded to the devices per node
    assert len(cal.provenance["node"]["slowdowns"]) == len(loop.CAL_WIDTHS)
    assert any("profiler overhead" in n for n in cal.notes)
    assert cal.k1_curve.y_max.status == FITTED and cal.k2_curve.y_max.status == FITTED


@pytest.mark.slow
def test_without_node_sharing_the_4_rank_prediction_fails(closed) -> None:
    """Placed one rank per core (four 1-rank nodes, no time-sharing), the 4-rank prediction
    loses about three quarters of its time: the node-sharing term is what the loop validates."""
    work, df = closed
    t = loop.TARGETS[0]
    m = loop.shape(t.d)
    out = loop.calib("predict", "--system", loop.SYSTEM, "--store", str(work / "store"), "--d", str(m.d),
                     "--l", str(m.l), "--a", str(m.a), "--s", str(m.s), "--V", str(m.V), "--gpus",
                     str(t.world_size), "--micro-batch", str(m.b), "--json")  # fmt: skip
    unshared = json.loads(out)["configs"][0]["iter_s"]
    shared = df.set_index("config").loc[t.name]
    assert unshared < 0.5 * shared["predicted_s"]
    assert unshared / shared["measured_s"] - 1.0 < -0.5  # far outside the bound, whatever the noise


# ---- the pieces, on committed traces ---------------------------------------------------------
@pytest.fixture(scope="module")
def committed_store(tmp_path_factory) -> Path:
    """The committed DDP traces of widths 64/128/256 at 1 and 2 ranks, and d=128 at 4 ranks."""
    root = tmp_path_factory.mktemp("committed")
    names = [f"ddp-d{d}-ws{w}" for d in (64, 128, 256) for w in (1, 2)] + ["ddp-d128-ws4"]
    for name in names:
        meta, tables = ingest(sorted((GEN / name).glob("rank*.pt.trace.json.gz")), IngestOptions(name=name))
        write_run(run_dir(root, "cpu-gloo", name), meta, tables)
    return root


def test_compute_slots_from_per_rank_slowdown(committed_store: Path) -> None:
    """S from the 1- vs 2-rank traces; the 4-rank trace (not used by the fit) checks it."""
    runs = tuple(list_runs(committed_store, "cpu-gloo"))
    pts = node_points(runs).set_index("run")
    assert (pts["ranks_per_node"] == [int(r[-1]) for r in pts.index]).all()
    two = pts[pts["ranks_per_node"] <= 2].reset_index()
    slots, table = fit_compute_slots(two, 2, where="test")
    assert len(table) == 3 and set(table["base_ranks"]) == {1}
    # each comparison implies S = 2 / slowdown inside [1, 2]; S is their median
    implied = np.clip(2.0 / table["slowdown"].to_numpy(), 1.0, 2.0)
    assert slots.value == pytest.approx(np.median(implied), rel=2e-3)
    assert 1.0 <= slots.value <= 2.0
    # the held-out 4-rank run: its slowdown over 1 rank, against the model's 4 / S
    measured = pts.loc["ddp-d128-ws4", "compute_s_per_gflop"] / pts.loc["ddp-d128-ws1", "compute_s_per_gflop"]
    predicted = 4.0 / slots.value
    print(
        f"compute slots {slots.value:.2f}: 4-rank slowdown predicted {predicted:.2f}, measured {measured:.2f}"
    )
    assert predicted / measured == pytest.approx(1.0, abs=0.35)
    # without a second ranks-per-node count there is nothing to fit: the stated devices per node
    alone, _ = fit_compute_slots(pts[pts["ranks_per_node"] == 1].reset_index(), 2, where="test")
    assert alone.value == 2.0 and alone.status == "default"


def test_profiler_overhead_comes_out_of_dispatch(committed_store: Path) -> None:
    """With overhead f the busy time of an iteration becomes busy / f (kernels untouched)."""
    run = read_run(run_dir(committed_store, "cpu-gloo", "ddp-d128-ws1"))
    plain, corrected = run_points((run,)), run_points((run,), profiler_overhead=1.2)
    b = run.table("buckets")
    busy = b["kernel_s"] + b["intra_op_s"] + b["inter_op_s"]
    assert ((b["intra_op_s"] + b["inter_op_s"]) > busy * (1 - 1 / 1.2)).all()  # dispatch covers the excess
    assert corrected["k1"].iloc[0] == pytest.approx(np.median(b["kernel_s"] / (busy / 1.2)))
    assert corrected["k1"].iloc[0] > plain["k1"].iloc[0]
    assert (
        corrected["x_flops"].iloc[0] == plain["x_flops"].iloc[0]
        and corrected["k2"].iloc[0] == plain["k2"].iloc[0]
    )
    assert (corrected["intra_per_op_s"] < plain["intra_per_op_s"]).all()


@pytest.fixture(scope="module")
def cpu_calibration(committed_store: Path, tmp_path_factory) -> Path:
    """Real `calib bench gemm` and `calib bench collectives` runs added to the committed
    traces, fitted without a peak."""
    from click.testing import CliRunner

    from calib.cli import cli

    res = CliRunner().invoke(
        cli,
        ["bench", "collectives", "--nproc", "2", "--system", "cpu-gloo", "--store", str(committed_store), "--name",
         "coll", "--collectives", "allreduce", "-b", "64K", "-e", "4M", "-f", "4", "-w", "1", "-n", "3"],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(
        cli,
        ["bench", "gemm", "--system", "cpu-gloo", "--store", str(committed_store), "--name", "gemm", "--threads",
         "1", "--sizes", "64,128,256,1024", "-r", "3"],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    cal = fit_system(system_runs(committed_store, "cpu-gloo"), "cpu-gloo", gpus_per_node=2)
    return cal.save(tmp_path_factory.mktemp("cal") / "cpu-gloo.calib.json")


def test_gemm_benchmark_gives_peak_and_curve(cpu_calibration: Path, committed_store: Path) -> None:
    cal = Calibration.load(cpu_calibration)
    samples = pd.read_parquet(run_dir(committed_store, "cpu-gloo", "gemm") / "gemm_samples.parquet")
    best = samples.loc[samples["tflops"].idxmax()]
    assert cal.peak_tflops == pytest.approx(best["tflops"])
    assert cal.provenance["peak"]["shape"].startswith(f"{best['m']}x{best['n']}x{best['k']}")
    assert cal.gemm_efficiency_curve.y_max.status in (FITTED, UNIDENTIFIABLE)
    pts = pd.DataFrame(cal.provenance["gemm_points"])
    assert (pts["eff"] <= 1.0 + 1e-12).all()
    bench = pts[pts["source"] == "bench"]
    # 64^3 and 1024^3 lie outside the traced work levels (2e6 .. 1e8 FLOP), 128^3 and 256^3 inside
    assert sorted(bench["x_flops"]) == [2.0 * 64**3, 2.0 * 1024**3]
    assert any("GEMM benchmark within the traced work levels" in n for n in cal.notes)


def test_cpu_calibration_predicts_without_a_hardware_preset(cpu_calibration: Path) -> None:
    system, notes = resolve_system(calibration=cpu_calibration, ranks_per_node=4)
    assert system.k2_covers_other_kernels and system.gpus_per_node == 4
    assert any("no out-of-memory verdict" in n for n in notes)
    slots = compute_slots(system.cal).value
    assert system.slots_per_node == slots
    model = ModelSpec("tiny", 128, 2, 4, 64, 1024)
    st = Strategies.of(
        tp=[1, 1, 1], pp=[1, 1, 1], dp=[1, 2, 4], micro_batch=[4, 4, 4], global_batch=[4, 8, 16]
    )
    r = evaluate(model, system, st)
    share = np.maximum(1.0, np.array([1.0, 2.0, 4.0]) / slots)
    # per-rank compute is the 1-rank compute times the node's time-sharing factor
    assert r["compute_s"] / r["compute_s"][0] == pytest.approx(share)
    assert r["optimizer_s"].max() == 0.0  # inside 1 - k2 (traced), not counted twice
    # the same calibration on one rank per core: 4 ranks are two nodes, nobody shares
    two_nodes, _ = resolve_system(calibration=cpu_calibration)
    r2 = evaluate(model, two_nodes, st)
    assert r2["compute_s"][2] == pytest.approx(r["compute_s"][0] * max(1.0, 2.0 / slots))


def test_gpu_systems_are_unchanged() -> None:
    """One rank per device: no time-sharing; default k2 keeps the memory-traffic and optimizer terms."""
    system, _ = resolve_system(hardware="dgx-h100")
    assert system.slots_per_node == system.gpus_per_node == 8 and not system.k2_covers_other_kernels
    st = Strategies.of(tp=[1, 8], pp=[1, 1], dp=[8, 64], micro_batch=[1, 1], global_batch=[8, 64])
    model = ModelSpec("gpt", 4096, 32, 32, 2048, 51200)
    assert np.all(system.node_share(st.gpus) == 1.0)
    r = evaluate(model, system, st)
    assert np.all(r["optimizer_s"] > 0)


def test_devices_per_node_is_this_hosts_cores() -> None:
    assert loop.devices_per_node() == max(1, len(os.sched_getaffinity(0)) // loop.THREADS_PER_RANK)
