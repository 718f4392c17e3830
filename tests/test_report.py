"""calib report on real inputs: the numbers drawn are the runs' and the calibration's,
names from traces are escaped, bad input is one line and exit 2 with nothing written,
and a report with nothing to predict still renders what it has.

The store is built once per module from the shipped fixtures: the Polaris nccl-tests
logs (fitted as ``polaris``), a real 2-rank gloo DDP trace and a real A100 NCCL trace.
"""

from __future__ import annotations

import contextlib
import gzip
import html
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from calib.cli import main
from tests.conftest import CPU_TRACES, FIXTURES, GPU_TRACES

HOSTILE = '<script>alert("k")</script>$\\frac{1}{0}$ & <img src=x onerror=alert(1)>|*_'
SMALL_SPEC = """
scaling: {models: [gpt-125m, gpt-6.7b], gpus: [8, 32, 128], zero: [1, 3]}
maps: {model: gpt-6.7b, gpus: 64, tp: [1, 2, 4, 8], pp: [1, 2, 4], dp: [1, 4, 16], global_batch: 64}
search: {model: gpt-6.7b, gpus: 64, global_batch: 64, top: 5}
validate: [{table: megatron_sc21_table1_weak_scaling.csv, calibrate_on: "1,4,7,10"}]
"""


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def ingest(paths, store: Path, system: str, name: str) -> Path:
    from calib.ingest.orchestrate import IngestOptions
    from calib.ingest.orchestrate import ingest as run_ingest

    from calib.core.rundir import write_run
    from calib.core.store import run_dir

    meta, tables = run_ingest([Path(p) for p in paths], IngestOptions(system=system, name=name))
    return write_run(run_dir(store, system, name), meta, tables)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    from calib.calibrate.fit import fit_system

    from calib.core.store import calibration_path
    from calib.resolve import system_runs

    st = tmp_path_factory.mktemp("store")
    ingest([FIXTURES / "nccl-tests"], st, "polaris", "polaris-nccl-tests")
    fit_system(system_runs(st, "polaris"), "polaris").save(calibration_path(st, "polaris"))
    ingest([CPU_TRACES["ws2_ddp_rank0"], CPU_TRACES["ws2_ddp_rank1"]], st, "cpu", "ddp-ws2")
    ingest([GPU_TRACES["nccl_data"]], st, "gpu", "nccl-a100")
    return st


@pytest.fixture(scope="module")
def report(store: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rep") / "report"
    spec = out.parent / "spec.yaml"
    spec.write_text(SMALL_SPEC)
    code, stdout, err = cli("report", store / "cpu/runs/ddp-ws2", store / "gpu/runs/nccl-a100", "--system", "polaris",
                            "--store", store, "--predict", spec, "--out", out)  # fmt: skip
    assert code == 0, err
    assert stdout.strip() == f"report written to {out / 'report.html'}"
    assert err == "", "quiet when stderr is not a terminal"
    return out


def test_report_files_and_embedding(report: Path) -> None:
    text = (report / "report.html").read_text()
    pngs = sorted((report / "figures").glob("*.png"))
    assert len(pngs) >= 14
    assert text.count('src="data:image/png;base64,') == len(pngs)
    assert "<script" not in text.lower() and "http://" not in text and "https://" not in text
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (report / "data" / f"{p.stem}.csv").is_file()
    md = (report / "report.md").read_text()
    assert md.startswith("# calib report: polaris")
    assert "## Predicted ZeRO-1/2/3 scaling" in md and "](figures/predict-zero1.png)" in md
    assert not list(report.parent.glob(".report.*")), "no temporary directory left behind"


def test_bucket_bars_are_the_runs_buckets(store: Path, report: Path) -> None:
    from calib.reports import fig_runs
    from calib.reports import style as S

    from calib.core.rundir import read_run

    run = read_run(store / "cpu/runs/ddp-ws2")
    b = run.table("buckets").sort_values(["rank", "iteration"]).reset_index(drop=True)
    data = pd.read_csv(report / "data" / "run-ddp-ws2-buckets.csv")
    assert len(data) == len(b) == 6  # 2 ranks x 3 profiled steps
    np.testing.assert_allclose(data["wall_s"], b["wall_s"], rtol=1e-12)
    np.testing.assert_allclose(data["comm_exposed_s"] + data["comm_overlapped_s"], b["comm_s"], rtol=1e-12)
    np.testing.assert_allclose(data["compute_kernel_s"] + data["memcpy_s"], b["kernel_s"], rtol=1e-12)
    parts = data[list(S.MEASURED)].sum(axis=1)
    np.testing.assert_allclose(parts, b["wall_s"], rtol=1e-9)
    # the bars drawn: per bucket colour, the rectangles' heights are the table's column
    drawn = fig_runs.bucket_bars(run)
    ax = drawn.fig.axes[0]
    for col, bucket in S.MEASURED.items():
        if not b.get(col, data[col]).any():
            continue
        rects = [p for p in ax.patches if p.get_facecolor()[:3] == pytest.approx(_rgb(S.color(bucket)))]
        np.testing.assert_allclose([r.get_height() for r in rects], data[col], rtol=1e-12)
    tops = np.zeros(len(b))
    for p in ax.patches:
        i = int(round(p.get_x() + p.get_width() / 2))
        tops[i] = max(tops[i], p.get_y() + p.get_height())
    np.testing.assert_allclose(tops, b["wall_s"], rtol=1e-9)


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(hex_colour)


def test_kernel_classes_and_dissection_from_tables(store: Path, report: Path) -> None:
    from calib.core.rundir import read_run

    run = read_run(store / "gpu/runs/nccl-a100")
    k = run.table("kernels").groupby("kernel_class")["time_s"].sum()
    shares = pd.read_csv(report / "data" / "runs-kernel-classes.csv").set_index("run")
    assert shares.loc["nccl-a100", "gemm"] == pytest.approx(100 * k["gemm"] / k.sum())
    b = run.table("buckets")
    dis = pd.read_csv(report / "data" / "runs-compute-dissection.csv").set_index("run")
    busy = b["kernel_s"].sum() + b["intra_op_s"].sum() + b["inter_op_s"].sum()
    assert dis.loc["nccl-a100", "kernel_pct"] == pytest.approx(100 * b["kernel_s"].sum() / busy)


def test_busbw_points_are_the_measured_samples(store: Path, report: Path) -> None:
    """Measured points: the median time over every in- and out-of-place line of a size (the
    fit's target) as bus bandwidth, 2(n-1)/n * bytes / time for all-reduce."""
    from calib.core.rundir import read_run

    s = read_run(store / "polaris/runs/polaris-nccl-tests").table("samples")
    s = s[(s["setup"] == 5) & (s["bytes"] > 0) & (s["collective"] == "allreduce") & (s["nranks"] == 32)]
    s = s[s["nccl_version"].astype(str) == "2.21"]  # the default fit's population (versions never pooled)
    t_us = (
        s.melt(id_vars=["bytes"], value_vars=["time_oop_us", "time_ip_us"]).groupby("bytes")["value"].median()
    )
    ref = t_us.index.to_numpy() * 2 * 31 / 32 / (t_us.to_numpy() * 1e-6) / 1e9
    d = pd.read_csv(report / "data" / "calibration-busbw.csv")
    m = d[(d["kind"] == "measured") & (d["collective"] == "allreduce") & (d["n_gpus"] == 32)].sort_values(
        "bytes"
    )
    np.testing.assert_array_equal(m["bytes"].to_numpy(), t_us.index.to_numpy())
    np.testing.assert_allclose(m["busbw_gbps"].to_numpy(), ref, rtol=1e-12)
    assert m["busbw_gbps"].max() == pytest.approx(36.5, abs=0.5)  # Polaris: NIC-limited plateau
    assert set(d["kind"]) == {"measured", "fit", "model"}


def test_prediction_data_equals_analytic(store: Path, report: Path) -> None:
    from calib.analytic.predict import Plan, predict
    from calib.analytic.specs import load_model
    from calib.reports import style as S

    from calib.resolve import resolve_system

    system, _ = resolve_system("polaris", None, None, store)
    ref = predict(load_model("gpt-6.7b"), system, [8, 32, 128], Plan(zero=3)).table
    d = pd.read_csv(report / "data" / "predict-zero3.csv")
    d = d[d["model"] == "gpt-6.7b"].reset_index(drop=True)
    np.testing.assert_allclose(d["iter_s"], ref["iter_s"], rtol=1e-12)
    np.testing.assert_allclose(d[list(S.PREDICTED)].sum(axis=1), d["iter_s"], rtol=1e-9)
    mem = pd.read_csv(report / "data" / "predict-memory.csv")
    assert (mem["oom"] == (mem["mem_total_gb"] > mem["hbm_gb"])).all()
    assert mem["hbm_gb"].iloc[0] == pytest.approx(40 * 2**30 / 1e9)  # Polaris A100 40GB: 40 GiB
    maps = pd.read_csv(report / "data" / "predict-comm-maps.csv")
    tp_pp = maps[maps["map"] == "tp_pp"]
    assert (
        tp_pp.loc[tp_pp["valid"], "tp"] * tp_pp.loc[tp_pp["valid"], "pp"] * tp_pp.loc[tp_pp["valid"], "dp"]
        == 64
    ).all()
    val = pd.read_csv(report / "data" / "validate-sc21.csv")
    held = val[val["role"] == "held-out"]
    assert len(held) == 6 and held["err_pct"].abs().max() < 10


def test_hostile_names_are_escaped(tmp_path: Path) -> None:
    doc = json.loads(gzip.decompress(CPU_TRACES["ws2_ddp_rank0"].read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("name") in ("aten::copy_", "aten::view"):
            e["name"] = HOSTILE
    for pg in doc["distributedInfo"]["pg_config"]:
        pg["pg_desc"] = HOSTILE
    trace = tmp_path / "hostile_rank0.pt.trace.json.gz"
    trace.write_bytes(gzip.compress(json.dumps(doc).encode()))
    run = ingest([trace], tmp_path / "store", "cpu", "hostile")
    out = tmp_path / "rep"
    code, _, err = cli("report", run, "--out", out)
    assert code == 0, err
    text = (out / "report.html").read_text()
    assert (
        HOSTILE not in text
        and "<script" not in text
        and "onerror=alert" not in text.replace("onerror=alert(1)&gt;", "")
    )
    assert html.escape(HOSTILE) in text, "the name reached the page, escaped"
    md = (out / "report.md").read_text()
    assert "<script" not in md and "<img" not in md


def test_missing_run_is_one_line_and_writes_nothing(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    code, stdout, err = cli("report", tmp_path / "no-such-run", "--store", store, "--out", out)
    assert code == 2 and stdout == ""
    assert len(err.strip().splitlines()) == 1 and "no such run" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_newer_schema_is_refused(store: Path, tmp_path: Path) -> None:
    run = tmp_path / "future-run"
    shutil.copytree(store / "cpu/runs/ddp-ws2", run)
    meta = json.loads((run / "run.json").read_text())
    meta["schema_version"] = 99
    (run / "run.json").write_text(json.dumps(meta))
    out = tmp_path / "rep"
    code, _, err = cli("report", run, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert re.search(r"schema version 99 is newer", err)
    assert not out.exists()


def test_out_that_is_not_a_report_is_refused(store: Path, tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    code, _, err = cli("report", store / "cpu/runs/ddp-ws2", "--out", tmp_path)
    assert code == 2 and "refusing to replace it" in err
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_bad_spec_is_one_line(store: Path, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("scaling: {models: [gpt-125m], gpus: [8], zero: [5]}\n")
    code, _, err = cli(
        "report", "--system", "polaris", "--store", store, "--predict", spec, "--out", tmp_path / "r"
    )
    assert code == 2 and "ZeRO stages are 0-3" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("report", "--out", tmp_path / "r")
    assert code == 2 and "nothing to report" in err


def test_runs_only_report_renders_what_it_has(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    code, _, err = cli("report", store / "cpu/runs/ddp-ws2", "--out", out)
    assert code == 0, err
    text = (out / "report.html").read_text()
    assert "Nothing to predict" in text and "run-ddp-ws2-buckets" in text
    assert not (out / "figures" / "predict-zero1.png").exists()


def test_calibration_only_report(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    cal = store / "polaris" / "polaris.calib.json"
    code, _, err = cli("report", "--calibration", cal, "--store", store, "--predict", "none", "--out", out)
    assert code == 0, err
    figs = {p.stem for p in (out / "figures").glob("*.png")}
    assert figs == {"colour-key", "calibration-busbw", "calibration-eff"}
    eff = pd.read_csv(out / "data" / "calibration-eff.csv")
    measured = eff[(eff["kind"] == "measured") & (eff["collective"] == "allreduce")].set_index("n_gpus")[
        "eff"
    ]
    assert measured.loc[8] == 1.0 and 0.9 < measured.loc[32] <= 1.0


def test_progress_bar_only_when_asked_or_on_a_terminal(store: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("CALIB_PROGRESS", "1")  # as on a terminal
    code, _, err = cli("report", store / "cpu/runs/ddp-ws2", "--out", tmp_path / "a")
    assert code == 0 and "report" in err and "step" in err, "tqdm bar on stderr"
    monkeypatch.setenv("CALIB_PROGRESS", "0")
    code, _, err = cli("report", store / "cpu/runs/ddp-ws2", "--out", tmp_path / "b")
    assert code == 0 and err == ""


def test_report_dir_with_foreign_files_is_not_replaced(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "rep"
    assert cli("report", store / "cpu/runs/ddp-ws2", "--out", out)[0] == 0
    assert cli("report", store / "cpu/runs/ddp-ws2", "--out", out)[0] == 0, "an earlier report is replaced"
    (out / "my-notes.txt").write_text("mine")
    code, _, err = cli("report", store / "cpu/runs/ddp-ws2", "--out", out)
    assert code == 2 and "refusing to replace it" in err
    assert (out / "my-notes.txt").read_text() == "mine" and (out / "report.html").is_file()
