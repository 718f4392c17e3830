"""The device's measured maximum achievable matmul (``mamf_tflops``, stas00 ml-engineering via
../shared/data/published/hardware_accelerator_specs.csv): the default GEMM plateau, the ceiling
of a validation fit's GEMM efficiency, and the ratio a fitted efficiency carries to another
device with.  Hand-worked on the presets' numbers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from calib.analytic.machine import achievable_ratio, default_calibration, transfer
from calib.analytic.specs import load_hardware
from calib.analytic.validate import validate
from calib.analytic.vtable import read_table
from calib.calibrate.calibration import Param

from tests.conftest import bad

PUB = Path(__file__).parents[1] / "fixtures" / "published"


def test_default_plateau_is_the_measured_achievable_fraction():
    """A100 80GB 271.2 / 312 = 0.8692, H100 794.5 / 989 = 0.8033, MI300X 668.4 / 1300 = 0.5142;
    a preset without a measurement (Polaris, A100 40GB) keeps the generic 0.75, and the note
    says which."""
    for name, frac in (("dgx-a100-80gb", 271.2 / 312), ("dgx-h100", 794.5 / 989), ("mi300x", 668.4 / 1300)):
        y = default_calibration(load_hardware(name)).gemm_efficiency_curve.y_max
        assert y.value == pytest.approx(frac, rel=1e-12) and "max achievable matmul" in y.note
    y = default_calibration(load_hardware("polaris")).gemm_efficiency_curve.y_max
    assert y.value == 0.75 and "max achievable" not in y.note


def test_a_fitted_efficiency_carries_with_the_ratio_of_achievable_fractions():
    """A GEMM plateau of 0.60 of the H100's peak moves to the A100 as 0.60 x 0.8692 / 0.8033
    = 0.6492 (its standard error likewise), not as 0.60 of the A100's peak."""
    h100, a100 = load_hardware("dgx-h100"), load_hardware("dgx-a100-80gb")
    cal = default_calibration(h100)
    g = cal.gemm_efficiency_curve
    cal = replace(cal, gemm_efficiency_curve=replace(g, y_max=Param(0.60, stderr=0.02, unit="")))
    r = achievable_ratio(a100, h100)
    assert r == pytest.approx((271.2 / 312) / (794.5 / 989), rel=1e-12)
    y = transfer(cal, a100, h100).gemm_efficiency_curve.y_max
    assert y.value == pytest.approx(0.60 * r, rel=1e-12) and y.stderr == pytest.approx(0.02 * r, rel=1e-12)
    assert achievable_ratio(load_hardware("polaris"), h100) is None  # not measured: fraction kept
    assert transfer(cal, load_hardware("polaris"), h100).gemm_efficiency_curve.y_max.value == 0.60


def test_validation_fit_stops_at_the_achievable_matmul():
    """The llm-foundry A100 table's fit wants a GEMM plateau above the A100's measured 0.8692:
    it stops there and the output warns (no GEMM beats the device's best matmul)."""
    path = PUB / "mosaicml_llmfoundry_fsdp_a100.csv"
    df, _ = read_table(path)
    p = validate(df, str(path), calibrate_on="every-third").params
    assert p["gemm_y_max"] == pytest.approx(271.2 / 312, rel=1e-6)
    assert any(b.startswith("gemm_y_max = 0.8692 is at its upper bound") for b in p["at_bound"])


def test_a_spec_whose_achievable_matmul_beats_its_peak_is_refused(tmp_path):
    spec = {f: getattr(load_hardware("dgx-h100"), f) for f in ("device", "peak_tflops", "hbm_gb", "hbm_tbps",
                                                               "gpus_per_node", "scale_up_gbps", "node_nic_gbps")}  # fmt: skip
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump({**spec, "mamf_tflops": 1200.0}))
    err = bad("predict", "--hardware", str(path), "--model", "gpt-13b", "--gpus", "8")
    assert "mamf_tflops must be a number in (0, peak_tflops], got 1200" in err.problem
