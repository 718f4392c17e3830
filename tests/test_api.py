"""The whole pipeline through the public Python API (no CLI), on real fixtures.

Polaris nccl-tests logs and real CPU/gloo traces are ingested, the polaris system is
fitted, saved and loaded, then predicted, searched, validated on a published table and
reported.  Values are checked against the log lines themselves and against the CLI on
the same inputs.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from calib.reports.spec import PredictSpec, ScalingSpec, ValidateSpec
from click.testing import CliRunner

import calib
from calib.cli import cli
from calib.core.errors import InputError
from tests.conftest import FIXTURES

POLARIS = FIXTURES / "nccl-tests" / "polaris"
N8_ALLREDUCE_SETUP5 = POLARIS / "n8.g4.2024-04-29-18-14-00" / "all_reduce_output.dat.5"
SC21 = FIXTURES / "published" / "megatron_sc21_table1_weak_scaling.csv"


def log_rows(path) -> dict[int, tuple[float, float]]:
    """size in bytes -> (out-of-place busbw, in-place busbw) in GB/s, read straight from the log lines."""
    rows = {}
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) == 13 and re.fullmatch(r"\d+", f[0]):
            rows[int(f[0])] = (float(f[7]), float(f[11]))
    return rows


def cli_run(*args: str) -> str:
    return CliRunner().invoke(cli, list(args), standalone_mode=False, catch_exceptions=False).output


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("api-store")
    calib.ingest_run(POLARIS, system="polaris", name="polaris-nccl", store=root)
    calib.ingest_run(
        sorted((FIXTURES / "traces" / "cpu").glob("ws2_ddp_rank*.json.gz")),
        system="cpu-gloo",
        name="ddp-ws2",
        store=root,
    )
    return root


@pytest.fixture(scope="module")
def model(store):
    runs = calib.load_runs(system="polaris", store=store)
    return calib.SystemModel(where={"setup": 5}).fit(runs)


def test_ingest_and_load_runs_keep_the_log_values(store):
    (run,) = calib.load_runs(system="polaris", store=store)
    assert run.meta.kind == "nccl-tests" and run.meta.name == "polaris-nccl"
    s = run.table("samples")
    row = s[
        (s["collective"] == "allreduce") & (s["nranks"] == 32) & (s["setup"] == 5) & (s["bytes"] == 2**30)
    ]
    assert len(row) == 1
    oop, ip = log_rows(N8_ALLREDUCE_SETUP5)[2**30]
    assert (
        (float(row["busbw_oop_gbps"].iloc[0]), float(row["busbw_ip_gbps"].iloc[0]))
        == (oop, ip)
        == (36.53, 36.60)
    )
    (trace,) = calib.load_runs(system="cpu-gloo", store=store, kind="trace")
    b = trace.table("buckets")
    assert sorted(b["rank"].unique()) == [0, 1] and trace.meta.world_size == 2
    parts = b[["comm_s", "kernel_s", "intra_op_s", "inter_op_s", "other_s"]].sum(axis=1)
    assert np.allclose(parts, b["wall_s"], rtol=1e-9, atol=1e-9)  # buckets sum to the iteration


def test_fitted_attributes_carry_uncertainty(model):
    assert model.system_ == "polaris" and model.gpus_per_node_ == 4
    busbw = model.busbw("allreduce", 32)
    oop, ip = log_rows(N8_ALLREDUCE_SETUP5)[2**30]
    # the fitted large-message plateau is the busbw of the largest messages in the log
    assert busbw.value == pytest.approx(np.median([oop, ip]), rel=0.03)
    assert busbw.status == "fitted" and 0 < busbw.stderr < 0.1 * busbw.value
    assert {c.collective for c in model.collectives_} == {"allreduce", "allgather", "alltoall"}
    rho = model.network_["allreduce"].params["ring_step_ratio"]  # NCCL-structured network model
    assert model.network_["allreduce"].form == "nccl" and rho.status == "fitted" and rho.stderr is not None
    assert model.k1_.y_max.status == "default" and "no trace runs" in model.k1_.y_max.note
    assert any("setup" in n for n in model.notes_) or model.calibration_.provenance["where"] == {
        "setup": ["5"]
    }
    with pytest.raises(InputError, match="no fitted allreduce curve at 7 GPUs"):
        model.busbw("allreduce", 7)


def test_unfitted_model_says_so():
    m = calib.SystemModel(peak_tflops=312.0)
    assert m.get_params()["peak_tflops"] == 312.0
    with pytest.raises(calib.NotFittedError):
        m.k1_  # noqa: B018
    assert not hasattr(m, "calibration_")


def test_fit_equals_the_cli_fit(model, store, tmp_path):
    out = tmp_path / "cli.calib.json"
    cli_run("fit", "--system", "polaris", "--store", str(store), "--where", "setup=5", "--out", str(out))
    cli_doc = json.loads(out.read_text())
    api_doc = model.calibration_.to_json()
    for doc in (cli_doc, api_doc):
        doc.pop("created", None)
        doc["provenance"]["versions"].pop("calib", None)
    assert json.loads(json.dumps(api_doc)) == cli_doc


def test_save_load_and_predict_equal_the_cli(model, store, tmp_path, capsys):
    path = model.save(store=store)
    assert path == store / "polaris" / "polaris.calib.json"
    loaded = calib.SystemModel.load(path)
    assert loaded.busbw("allreduce", 32) == model.busbw("allreduce", 32)
    pred = loaded.predict("gpt-13b", gpus=[8, 64, 512], zero=3)
    assert capsys.readouterr().out == ""  # the API prints nothing
    from_cli = json.loads(cli_run("predict", "--system", "polaris", "--store", str(store), "--model", "gpt-13b",
                             "--gpus", "8,64,512", "--zero", "3", "--json"))  # fmt: skip
    rows = pred.table.to_dict(orient="records")
    assert [r["gpus"] for r in rows] == [8, 64, 512]
    for mine, theirs in zip(rows, from_cli["configs"], strict=True):
        for key in ("iter_s", "tokens_per_s", "mem_total_gb", "dp_allgather_exposed_s", "speedup_comm_model"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-12), key
    assert pred.notes == from_cli["notes"]
    assert (pred.table["dp_allgather_exposed_s"] > 0).all()


def test_search_and_hardware_transfer(model):
    found = model.search("gpt-13b", gpus=64, global_batch=64, top=3)
    assert len(found.top) == 3 and found.n_feasible > 0
    assert found.top["iter_s"].is_monotonic_increasing
    assert set(found.top["recompute"]) <= {"none", "selective", "full"}
    h100 = model.predict("gpt-13b", gpus=[64], zero=1, hardware="dgx-h100")
    a100 = model.predict("gpt-13b", gpus=[64], zero=1)
    assert h100.table["iter_s"].iloc[0] < a100.table["iter_s"].iloc[0]
    assert any("transferred to hardware spec" in n for n in h100.notes)


def test_field_errors_name_fields_not_options(model):
    with pytest.raises(InputError) as exc:
        model.predict("gpt-13b", gpus=[12], tp=8)
    assert exc.value.where == "gpus" and "not divisible by TP x PP" in exc.value.problem
    with pytest.raises(InputError) as exc:
        model.predict("gpt-13b", gpus=[8], micro_batch=0)
    assert exc.value.where == "micro_batch"


def test_validate_equals_the_cli():
    res = calib.validate(SC21, calibrate_on="1,4,7,10")
    from_cli = json.loads(cli_run("validate", str(SC21), "--calibrate-on", "1,4,7,10", "--json"))
    assert res.summary["n_heldout"] == from_cli["summary"]["n_heldout"] == len(res.rows) - 4
    assert res.summary["median_abs_pct"] == pytest.approx(from_cli["summary"]["median_abs_pct"], rel=1e-12)
    assert res.summary["median_abs_pct"] < 10


def test_hardware_only_model_and_report(model, store, tmp_path):
    spec = PredictSpec(
        scaling=ScalingSpec(models=("gpt-1.3b",), gpus=(8, 64), zero=(1, 3)),
        validate=(ValidateSpec(SC21.name, "1,4,7,10"),),
        source="test",
    )
    trace = calib.load_runs("ddp-ws2", store=store)
    html = model.report(tmp_path / "report", runs=trace, predict=spec, store=store, title="api report")
    assert html.name == "report.html" and html.is_file()
    text = html.read_text()
    assert "api report" in text and "gpt-1.3b" in text and "ddp-ws2" in text
    data = {p.name for p in (html.parent / "data").iterdir()}
    assert {"calibration-busbw.csv", "predict-zero1.csv", "predict-zero3.csv"} <= data
    assert len(list((html.parent / "figures").glob("*.png"))) == len(data)
    stated = calib.SystemModel.from_hardware("dgx-h100")
    res = stated.predict("gpt-1.3b", gpus=[8])
    assert any("stated defaults" in n for n in res.notes)


def test_readme_example_runs(tmp_path):
    """The README's Python API section, run as written (from a directory with the fixtures)."""
    import subprocess
    import sys
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = re.search(r"## Python API.*?```python\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "fixtures").symlink_to(FIXTURES)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "status='fitted'" in proc.stdout and "speedup_comm_model" in proc.stdout
    assert (tmp_path / "polaris.calib.json").is_file() and (tmp_path / "api-report" / "report.html").is_file()
