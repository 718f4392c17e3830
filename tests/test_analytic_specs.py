"""Spec data files: every preset sourced, and the numbers equal the published spec tables."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from calib.analytic.specs import (
    HARDWARE_FILE,
    MODELS_FILE,
    hardware_names,
    load_hardware,
    load_model,
    model_names,
)

from calib.core.errors import InputError

PUBLISHED = Path(__file__).parents[1] / "fixtures" / "published"


def _num(text) -> float:
    return float(re.match(r"\s*([0-9.]+)", str(text)).group(1))


def test_every_preset_has_a_source():
    raw_models = yaml.safe_load(MODELS_FILE.read_text())
    fams = raw_models["families"]
    for name, entry in raw_models["models"].items():
        assert fams[entry["family"]]["source"], name
        assert load_model(name).source
    raw_hw = yaml.safe_load(HARDWARE_FILE.read_text())
    assert raw_hw["defaults"]["source"]
    for name in raw_hw["systems"]:
        assert load_hardware(name).source, name


def test_required_presets_exist():
    models = set(model_names())
    for need in (
        "gpt-125m",
        "gpt-18.4b",
        "gpt3-175b",
        "megatron-1.7b",
        "megatron-1t",
        "megatron-22b",
        "calculon-128t",
    ):
        assert need in models
    hw = set(hardware_names())
    for need in ("polaris", "tg40", "tg80", "dgx-a100-80gb", "dgx-h100", "h200", "b200", "mi300x"):
        assert need in hw
    assert load_hardware("selene").name == "dgx-a100-80gb"


def test_hardware_names_as_tables_write_them():
    # device names as published tables print them: spaces and underscores read as hyphens
    for name, preset in (("A100 80GB", "dgx-a100-80gb"), ("a100_40gb", "tg40"), ("H100 SXM5 80GB", "dgx-h100"),
                         ("hgx_h100", "dgx-h100"), ("h100-80gb", "dgx-h100")):  # fmt: skip
        hw = load_hardware(name)
        assert hw.name == preset and hw.hbm_gb == (40 if "40" in name else 80)
    with pytest.raises(InputError):
        load_hardware("A100")  # 40 GB or 80 GB: ambiguous, no alias
    # stop 25: the H200 and V100 with their memory, as tables print them
    for name, preset, gb in (
        ("H200 SXM 141GB", "h200", 141),
        ("h200_141gb", "h200", 141),
        ("V100 32GB", "dgx-2", 32),
    ):
        hw = load_hardware(name)
        assert hw.name == preset and hw.hbm_gb == gb
    for other in ("H100 PCIe", "GH200", "A800"):  # other devices stay unknown, not a near match
        with pytest.raises(InputError):
            load_hardware(other)


@pytest.mark.parametrize(
    ("preset", "row"),
    [
        ("tg40", "NVIDIA A100 SXM4 40GB"),
        ("dgx-a100-80gb", "NVIDIA A100 SXM4 80GB"),
        ("dgx-h100", "NVIDIA H100 SXM5 80GB"),
        ("h200", "NVIDIA H200 SXM 141GB"),
        ("b200", "NVIDIA B200 SXM"),
        ("mi300x", "AMD MI300X (OAM)"),
    ],
)
def test_hardware_presets_equal_accelerator_table(preset, row):
    table = pd.read_csv(PUBLISHED / "hardware_accelerator_specs.csv").set_index("accelerator")
    r = table.loc[row]
    hw = load_hardware(preset)
    assert hw.peak_tflops == _num(r["peak_dense_bf16_tflops"])
    assert hw.hbm_gb == _num(r["hbm_capacity_GB"])
    assert hw.hbm_tbps == pytest.approx(_num(r["hbm_bandwidth_TBps"]))
    assert hw.scale_up_gbps == _num(r["scale_up_bw_unidirectional_GBps"])


@pytest.mark.parametrize(
    ("preset", "row"),
    [("polaris", "ALCF Polaris"), ("dgx-a100-80gb", "NVIDIA Selene / DGX A100 SuperPOD"), ("dgx-h100", "NVIDIA Eos / DGX H100 SuperPOD"),
     ("perlmutter", "NERSC Perlmutter GPU partition")],
)  # fmt: skip
def test_node_presets_equal_node_table(preset, row):
    table = pd.read_csv(PUBLISHED / "system_node_specs.csv").set_index("system")
    hw = load_hardware(preset)
    assert hw.gpus_per_node == int(table.loc[row, "gpus_per_node"])
    cell = str(table.loc[row, "inter_node_bw_per_gpu_GBps_uni"])  # Polaris: "2x25 GB/s / 4 GPUs = 12.5 ..."
    per_gpu = float(re.search(r"=\s*([0-9.]+)", cell).group(1)) if "=" in cell else _num(cell)
    assert hw.node_nic_gbps == pytest.approx(per_gpu * hw.gpus_per_node)


def test_sc21_presets_equal_table1():
    t1 = pd.read_csv(PUBLISHED / "megatron_sc21_table1_weak_scaling.csv")
    for _, r in t1.iterrows():  # ten rows of a spec table
        m = load_model(f"megatron-{r['model_label'].lower()}")
        assert (m.d_model, m.n_layers, m.n_heads, m.seq_len, m.vocab) == (
            r["hidden_size"], r["num_layers"], r["attention_heads"], r["seq_len"], r["vocab_size"])  # fmt: skip
        assert m.global_batch == r["global_batch_size"]


def test_default_busbw_reproduces_polaris_nccl_tests():
    # inter-node default: node NIC bandwidth x 0.73 = the 36.5 GB/s all-reduce plateau of
    # fixtures/nccl-tests/polaris (2 nodes, setup 5, 1 GiB: busbw 36.81 / 36.73)
    hw = load_hardware("polaris")
    assert hw.inter_busbw_gbps == pytest.approx(36.5, rel=0.01)


def test_unknown_names_and_bad_files(tmp_path):
    with pytest.raises(InputError, match="unknown model 'gpt-7'"):
        load_model("gpt-7")
    with pytest.raises(InputError, match="unknown hardware 'dgx-z'"):
        load_hardware("dgx-z")
    bad = tmp_path / "hw.yaml"
    bad.write_text("name: x\npeak_tflops: [1, 2\n")
    with pytest.raises(InputError, match="malformed YAML"):
        load_hardware(str(bad))
    missing = tmp_path / "m.yaml"
    missing.write_text("d_model: 1024\nn_layers: 4\n")
    with pytest.raises(InputError, match="missing field"):
        load_model(str(missing))
    neg = tmp_path / "neg.json"
    neg.write_text('{"device": "x", "peak_tflops": -1, "hbm_gb": 1, "hbm_tbps": 1, "gpus_per_node": 4, '
                   '"scale_up_gbps": 1, "node_nic_gbps": 1}')  # fmt: skip
    with pytest.raises(InputError, match="peak_tflops must be a positive number"):
        load_hardware(str(neg))


def test_user_spec_file(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("device: Test GPU\npeak_tflops: 500\nhbm_gb: 96\nhbm_tbps: 4\ngpus_per_node: 4\n"
                 "scale_up_gbps: 400\nnode_nic_gbps: 100\nsource: test\n")  # fmt: skip
    hw = load_hardware(str(f))
    assert (hw.name, hw.gpus_per_node, hw.inter_busbw_gbps) == ("mine", 4, pytest.approx(73.0))
