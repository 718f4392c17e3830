"""Other ways tables state a measurement: job tokens/s, sequences/s and MFU (analytic.vtable).

Checked on the real llm-foundry A100 table, which prints the same runs as tokens/s per
GPU, tokens/s and sequences/s of the job, and MFU in percent: each derived measurement
must equal the per-GPU one up to the table's own rounding, and MFU must become
mfu x the A100's 312 TFLOP/s dense bf16 peak in the ``model`` convention.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from calib.analytic.vtable import read_table

from calib.core.errors import InputError
from tests.conftest import run
from tests.test_validation_defects import MOSAIC

MEASURE_COLS = ("measured_iter_s", "measured_tflops_per_gpu", "measured_tokens_per_s_per_gpu")


def _canonical(tmp_path, n=6):
    raw = pd.read_csv(MOSAIC).head(n)
    df, _ = read_table(MOSAIC)
    df = df.head(n).drop(columns=[c for c in MEASURE_COLS if c in df.columns] + ["tflops_convention"])
    return raw, df


def _write(tmp_path, df, name):
    f = tmp_path / name
    df.to_csv(f, index=False)
    return f


def test_job_rates_equal_the_per_gpu_rate(tmp_path):
    raw, df = _canonical(tmp_path, 12)
    # the README prints integers, truncated (11962 T/s / 32 GPUs = 373.8 printed 373; S/s 12.x
    # printed 12): one unit of each column bounds the disagreement; S/s below 5 says too little
    keep = (raw["Throughput (S/s)"] >= 5).to_numpy()
    raw, df = raw[keep].reset_index(drop=True), df[keep].reset_index(drop=True)
    per_gpu = raw["Throughput (T/s/GPU)"].to_numpy(dtype=float)
    for col, src in (
        ("measured_tokens_per_s", "Throughput (T/s)"),
        ("measured_samples_per_s", "Throughput (S/s)"),
    ):
        got, _ = read_table(_write(tmp_path, df.assign(**{col: raw[src].to_numpy()}), f"{col}.csv"))
        ratio = got["measured_tokens_per_s_per_gpu"].to_numpy() / per_gpu
        tol = 1.0 / per_gpu + 1.0 / raw[src].to_numpy(dtype=float)
        assert len(ratio) >= 3 and np.all(np.abs(ratio - 1.0) <= tol), (col, ratio)


def test_mfu_becomes_model_tflops_at_the_hardware_peak(tmp_path):
    raw, df = _canonical(tmp_path)
    mfu = raw["MFU"].to_numpy(dtype=float) / 100.0  # the README prints percent
    got, _ = read_table(_write(tmp_path, df.assign(measured_mfu=mfu), "mfu.csv"))
    assert np.allclose(got["measured_tflops_per_gpu"], mfu * 312.0)  # dgx-a100-80gb: 312 TFLOP/s bf16
    assert set(got["tflops_convention"]) == {"model"}
    out = json.loads(run("validate", str(_write(tmp_path, df.assign(measured_mfu=mfu), "m.csv")), "--fit", "none",
                         "--json").output)  # fmt: skip
    assert {r["quantity"] for r in out["per_row"]} == {"tflops_per_gpu"}


def test_bad_mfu_is_one_line(tmp_path):
    raw, df = _canonical(tmp_path, 2)
    with pytest.raises(InputError) as e:
        read_table(_write(tmp_path, df.assign(measured_mfu=raw["MFU"].to_numpy()), "pct.csv"))
    assert "fraction of peak" in e.value.problem and e.value.where.endswith("pct.csv")
    with pytest.raises(InputError) as e:
        read_table(_write(tmp_path, df.assign(measured_mfu=0.5, hardware=""), "nohw.csv"))
    assert "needs the row's hardware" in e.value.problem
    with pytest.raises(InputError) as e:
        read_table(_write(tmp_path, df.assign(measured_tokens_per_s=["fast", 1.0]), "word.csv"))
    assert "'measured_tokens_per_s' must be a number" in e.value.problem


def test_recompute_as_activation_checkpointing_flags(tmp_path):
    _, df = _canonical(tmp_path, 3)
    df = df.assign(measured_tokens_per_s_per_gpu=[400.0, 370.0, 570.0])
    got, _ = read_table(_write(tmp_path, df.assign(recompute=["True", "no", "selective"]), "flags.csv"))
    assert got["recompute"].tolist() == ["full", "none", "selective"]
    with pytest.raises(InputError) as e:
        read_table(_write(tmp_path, df.assign(recompute=["1", "full", "full"]), "code.csv"))
    assert "recompute must be one of none, selective, full, op" in e.value.problem


def test_hardware_spec_next_to_the_table(tmp_path, monkeypatch):
    """A relative spec path in the hardware column is read next to the table."""
    import yaml
    from calib.analytic.specs import load_hardware

    hw = load_hardware("dgx-a100-80gb")
    keys = ("device", "peak_tflops", "hbm_gb", "hbm_tbps", "gpus_per_node", "scale_up_gbps", "node_nic_gbps")
    (tmp_path / "cluster.yaml").write_text(
        yaml.safe_dump({"name": "cluster", **{k: getattr(hw, k) for k in keys}})
    )
    _, df = _canonical(tmp_path, 2)
    df = df.assign(measured_tokens_per_s_per_gpu=[400.0, 370.0], hardware="cluster.yaml")
    monkeypatch.chdir(tmp_path.parent)  # the spec is not in the working directory
    got, _ = read_table(_write(tmp_path, df, "t.csv"))
    assert set(got["hardware"]) == {str(tmp_path / "cluster.yaml")}
