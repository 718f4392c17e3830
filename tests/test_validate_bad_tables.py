"""Bad published tables through `calib validate`: one line naming the file, row and column,
exit 2 -- found by mutating the shipped tables one cell or column at a time (stop 31).

Each case starts from a real table in fixtures/published and changes one thing; before
stop 31 the first two ended in a pandas traceback, and an infinite measurement, an
unknown system (run on an A100) and an unreadable checkpointing flag (taken as off) were
read silently.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

PUB = Path(__file__).parents[1] / "fixtures" / "published"


def _calib(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "calib.cli", *args], capture_output=True, text=True, timeout=300
    )


def _mutate(src: str, tmp: Path, column: str, row: int | None, value: str | None) -> Path:
    """``src`` with column ``column`` of data row ``row`` (1-based) set to ``value``;
    ``row`` None: keep the header only."""
    rows = list(csv.reader((PUB / src).open()))
    if row is None:
        rows = rows[:1]
    else:
        rows[row][rows[0].index(column)] = value
    out = tmp / f"bad-{src}"
    with out.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return out


CASES = [
    # an adapter's arithmetic on a header-only table (was: TypeError in the sc21 adapter)
    ("megatron_sc21_table1_weak_scaling.csv", "num_gpus", None, None, "the table has no rows"),
    # an infinite integer (was: IntCastingNaNError)
    ("megatron_sc21_table2_ptdp_vs_zero3.csv", "micro_batch", 12, "inf",
     "row 12: column 'micro_batch' must be a non-negative integer, got 'inf'"),
    # an adapter's arithmetic column that is not a number (was: a numpy/pandas TypeError)
    ("megatron_sc21_table1_weak_scaling.csv", "pipeline_parallel", 3, "x",
     "row 3: column 'pipeline_parallel' must be a positive number, got 'x'"),
    # a measurement that is not finite (was: predicted against, a RuntimeWarning)
    ("torchtitan_fsdp2_a100_llama.csv", "measured_tokens_per_s_per_gpu", 2, "inf",
     "row 2: column 'measured_tokens_per_s_per_gpu' must be a number in 1e-09..1e+12, got 'inf'"),
    # a measurement that is text (was: 'no positive measured value', the text not named)
    ("torchtitan_fsdp2_a100_llama.csv", "measured_tokens_per_s_per_gpu", 1, "fast",
     "row 1: column 'measured_tokens_per_s_per_gpu' must be a number in 1e-09..1e+12, got 'fast'"),
    # an unknown system (was: run as an A100 40GB)
    ("megatron_readme_2020_tp_dp_scaling_iteration_times.csv", "system", 10, "TPU v4",
     "column 'system': unknown value 'TPU v4'"),
    # an empty model name in an llm-foundry row (was: AttributeError on a float, stop 31's corpus)
    ("mosaicml_llmfoundry_fsdp_h100_fp8.csv", "Model", 1, "", "unknown model 'mpt-'"),
    # a model name too long for a file name (was: OSError from the file-name check)
    ("mosaicml_llmfoundry_fsdp_h100_fp8.csv", "Model", 2, "a" * 300, "unknown model 'mpt-aaaa"),
    # an unreadable flag (was: read as no checkpointing)
    ("mosaicml_llmfoundry_fsdp_a100.csv", "Activation Checkpointing", 19, "maybe",
     "column 'Activation Checkpointing': unknown value 'maybe'"),
]  # fmt: skip


@pytest.mark.parametrize(("src", "column", "row", "value", "message"), CASES)
def test_bad_cell_is_one_line_exit_2(tmp_path, src, column, row, value, message):
    table = _mutate(src, tmp_path, column, row, value)
    out = tmp_path / "report.csv"
    res = _calib("validate", str(table), "--fit", "none", "--csv", "-o", str(out))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"calib: {table}: "), res.stderr
    assert message in lines[0]
    assert not out.exists()  # nothing half-written


def test_the_unmutated_tables_still_read(tmp_path):
    """The checks reject only what is bad: every shipped table validates as before."""
    for src in ("megatron_sc21_table1_weak_scaling.csv", "torchtitan_fsdp2_a100_llama.csv",
                "megatron_readme_2020_tp_dp_scaling_iteration_times.csv", "mosaicml_llmfoundry_fsdp_a100.csv"):  # fmt: skip
        res = _calib("validate", str(PUB / src), "--fit", "none")
        assert res.returncode == 0, (src, res.stderr)


def test_a_fit_through_an_absurd_measurement_is_refused(tmp_path):
    """A denormal measurement made the fit's residuals infinite (was: scipy's ValueError);
    measurements must lie in analytic.vtable.MEASURE_RANGE, and a table cut to one row
    cannot hold one out (the error names the table, not only the option)."""
    table = _mutate("torchtitan_fsdp2_a100_llama.csv", tmp_path, "measured_tokens_per_s_per_gpu", 1, "1e-320")
    res = _calib("validate", str(table), "--calibrate-on", "every-third")
    assert res.returncode == 2 and "must be a number in 1e-09..1e+12, got '1e-320'" in res.stderr, res.stderr
    one = tmp_path / "one.csv"
    one.write_text("\n".join((PUB / "torchtitan_fsdp2_a100_llama.csv").read_text().splitlines()[:2]) + "\n")
    res = _calib("validate", str(one), "--calibrate-on", "every-third")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"calib: {one}: "), res.stderr
    assert "nothing is held out" in lines[0]


def test_a_spec_files_fp8_rate_is_checked(tmp_path):
    """The new hardware field (stop 31) through `calib predict --hardware FILE`: one line, exit 2."""
    import yaml

    entry = yaml.safe_load((PUB.parents[1] / "analytic" / "data" / "hardware.yaml").read_text())["systems"][
        "dgx-h100"
    ]
    spec = tmp_path / "h100-bad.yaml"
    spec.write_text(yaml.safe_dump({**entry, "fp8_gemm_speedup": -2}))
    res = _calib("predict", "--hardware", str(spec), "--model", "gpt-125m", "--gpus", "8")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"calib: {spec}: "), res.stderr
    assert "fp8_gemm_speedup needs peak_fp8_tflops, a number > 0: -2" in lines[0]
