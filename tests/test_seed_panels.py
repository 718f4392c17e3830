"""The seed panels of calib report --seeds: three figures with the numbers they draw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from calib.reports.fig_seeds import dvfs_data, placement_data
from click.testing import CliRunner

from calib.cli import cli
from calib.core.errors import InputError

ROOT = Path(__file__).parents[1]


def test_panel_data():
    d = dvfs_data()
    assert set(d["label"]) == {"GPT-350M layer, s=128", "GPT-350M layer, s=8192", "GPT-13B layer, s=1024"}
    assert d["f_mhz"].min() == pytest.approx(210) and d["f_mhz"].max() == pytest.approx(1440)
    _, _, comm = placement_data()
    c = comm.set_index(["order", "domain"])["comm_s"]
    assert c[("dp>tp>pp", 8)] < c[("tp>dp>pp", 8)] and c[("tp>dp>pp", 72)] < c[("tp>dp>pp", 8)]


def test_report_seeds(tmp_path: Path):
    res = {"family": [{"model": "1T", "gpus": 4096, "hbm_gb": 65.0, "offload_gib": 56.0}],
           "bandwidth": [{"gbps": 100, "relative_efficiency": 0.6}]}  # fmt: skip
    f = tmp_path / "off.json"
    f.write_text(json.dumps(res))
    out = tmp_path / "rep"
    r = CliRunner().invoke(cli, ["report", "--seeds", "--offload-results", str(f), "--out", str(out)],
                           standalone_mode=False, catch_exceptions=False)  # fmt: skip
    assert "report written" in r.output
    for k in ("seed003-dvfs", "seed002-placement", "seed001-offload"):
        assert (out / "figures" / f"{k}.png").stat().st_size > 1000
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(InputError, match="not a seed001_offload.py JSON"):
        CliRunner().invoke(cli, ["report", "--seeds", "--offload-results", str(bad), "--out", str(out)],
                           standalone_mode=False, catch_exceptions=False)  # fmt: skip
