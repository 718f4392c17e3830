"""NVML power samples: the capture's absence note, and calib fit --power on a hand-built file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calib.core.errors import InputError
from tests.conftest import run

ROOT = Path(__file__).parents[1]
SAMPLES = ROOT / "fixtures" / "power" / "nvml_samples_a100.csv"  # static 60 W, dynamic 300 W (README.md)


def test_fit_power_recovers_the_documented_values(tmp_path: Path) -> None:
    text = run("fit", "--system", "lab", "--store", str(tmp_path), "--power", str(SAMPLES)).output
    assert "fitted" in text
    fit = json.loads((tmp_path / "lab" / "lab.power.json").read_text())
    st, dy = fit["static_w"], fit["dynamic_w"]
    assert abs(st["value"] - 60.0) < 3 * st["stderr"] and 0 < st["stderr"] < 2
    assert abs(dy["value"] - 300.0) < 3 * dy["stderr"] and 0 < dy["stderr"] < 5
    assert fit["n_samples"] == 16 and fit["r2"] > 0.99


def test_fitted_power_replaces_the_datasheet_values(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    run("fit", "--system", "lab", "--store", str(tmp_path), "--power", str(SAMPLES), "--out", str(out))
    args = [
        "predict",
        "--hardware",
        "polaris",
        "--model",
        "gpt-13b",
        "--gpus",
        "8",
        "--zero",
        "3",
        "--energy",
    ]
    dflt = run(*args).output
    fitted = run(*args, "--power", str(out)).output
    assert "static_w 80 (default)" in dflt
    assert "static_w 60.53 +- 0.56 (fitted)" in fitted and "power fitted from 16 samples" in fitted
    assert "fit band" in fitted and "fit band" not in dflt
    js = json.loads(run(*args, "--power", str(out), "--json").output)["configs"][0]
    assert js["energy_kj_per_iter_lo"] < js["energy_kj_per_iter"] < js["energy_kj_per_iter_hi"]


def test_bad_power_files(tmp_path: Path) -> None:
    junk = tmp_path / "junk.csv"
    junk.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="not a power samples file"):
        run("fit", "--system", "lab", "--store", str(tmp_path), "--power", str(junk))
    flat = tmp_path / "flat.csv"
    lines = SAMPLES.read_text().splitlines()[:2] + ["0.0,0,100,1410,1215,50,30"] * 4
    flat.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match="unidentifiable"):
        run("fit", "--system", "lab", "--store", str(tmp_path), "--power", str(flat))


def test_capture_without_nvml_says_so(tmp_path: Path) -> None:
    """No pynvml / no GPU on this machine: the capture records why there are no samples."""
    pytest.importorskip("torch")
    from calib.ingest.capture import CaptureSettings, capture, read_run_config
    from calib.ingest.capture.power import nvml_status

    ok, why = nvml_status()
    if ok:  # pragma: no cover - a GPU machine samples instead
        pytest.skip("NVML present: the sampled path runs")
    with capture(tmp_path / "run", system="x", settings=CaptureSettings(wait=0, warmup=0, active=1)) as cap:
        cap.step()
    power = read_run_config(tmp_path / "run")["power"]
    assert power["status"] == "absent" and power["note"] == why
    assert not list((tmp_path / "run").glob("power_rank*.csv"))
    from calib.ingest.capture import check_run

    from calib.commands.capture import format_report

    assert f"power: absent ({why})" in format_report(check_run(tmp_path / "run"))


def test_api_fit_power(tmp_path: Path) -> None:
    from calib.api import fit_power

    fit = fit_power(SAMPLES, tmp_path / "p.json")
    assert fit["static_w"]["status"] == "fitted" and abs(fit["static_w"]["value"] - 60) < 2


def test_sampler_file_format_round_trips(tmp_path: Path) -> None:
    """What the NVML sampler writes is what calib fit --power reads (same rows, same fit)."""
    from calib.calibrate.power import read_power_samples
    from calib.ingest.capture.power import write_samples

    df, meta = read_power_samples(SAMPLES)
    path = tmp_path / "power_rank0.csv"
    write_samples(path, [tuple(r) for r in df.itertuples(index=False)], meta["device"], 0.02)
    back, meta2 = read_power_samples(path)
    assert meta2["device"] == "NVIDIA A100-SXM4-40GB" and meta2["interval_ms"] == "20"
    assert back["power_w"].tolist() == pytest.approx(df["power_w"].tolist())
