"""The calibration contract: typed compute slots, schema versions, strict readers.

The calibration is fitted from committed CPU traces (fixtures/traces/generated, tiny GPT
d=64 and d=128 at 1 and 2 gloo ranks on one node), so the compute slots are a real fit.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from calib.analytic.machine import build_system, compute_slots
from calib.calibrate.calibration import CALIBRATION_SCHEMA_VERSION, Calibration
from calib.calibrate.device_model import DeviceModel, Family, GemmModel
from calib.calibrate.params import Param

from calib.api import SystemModel, ingest_run, load_runs
from calib.core.errors import InputError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
GEN = FIXTURES / "traces" / "generated"
RUNS = [f"ddp-d{d}-ws{w}" for d in (64, 128) for w in (1, 2)]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Calibration, Path]:
    store = tmp_path_factory.mktemp("store")
    for name in RUNS:
        ingest_run(GEN / name, system="cpu-gloo", name=name, store=store)
    model = SystemModel().fit(load_runs(system="cpu-gloo", store=store), system="cpu-gloo")
    path = model.save(tmp_path_factory.mktemp("cal") / "cpu.calib.json")
    return model.calibration_, path


def test_compute_slots_are_a_typed_field(fitted) -> None:
    cal, path = fitted
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == CALIBRATION_SCHEMA_VERSION == 2
    slots = cal.compute_slots_per_node
    assert isinstance(slots, Param) and 1.0 <= slots.value <= 2.0  # S <= devices (ranks) per node
    # the evidence stays in provenance, the value only in the field (one owner)
    assert "compute_slots_per_node" not in doc["provenance"]["node"]
    assert len(doc["provenance"]["node"]["slowdowns"]) == 2  # d=64 and d=128: 2 ranks over 1
    assert Calibration.load(path) == cal
    assert compute_slots(cal) == slots
    system, _ = build_system(Calibration.load(path), None, ranks_per_node=2)
    assert system.slots_per_node == slots.value


def test_schema_version_1_files_are_migrated(fitted, tmp_path) -> None:
    """Version 1 kept the slots in provenance["node"]; they are read into the field."""
    cal, path = fitted
    doc = json.loads(path.read_text())
    slots = doc.pop("compute_slots_per_node")
    doc["schema_version"] = 1
    doc["provenance"]["node"]["compute_slots_per_node"] = slots
    old = tmp_path / "v1.calib.json"
    old.write_text(json.dumps(doc))
    back = Calibration.load(old)
    assert back.compute_slots_per_node == cal.compute_slots_per_node
    assert back.schema_version == CALIBRATION_SCHEMA_VERSION


@pytest.mark.parametrize("version", [0, 3, "2", True, None])
def test_unknown_schema_versions_are_refused(fitted, tmp_path, version) -> None:
    _, path = fitted
    doc = json.loads(path.read_text())
    doc["schema_version"] = version
    bad = tmp_path / "bad.calib.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="schema version") as exc:
        Calibration.load(bad)
    assert exc.value.where == str(bad)


@pytest.fixture(scope="module")
def polaris(tmp_path_factory) -> dict:
    """A calibration fitted from the Polaris nccl-tests logs (curves with segments, network)."""
    store = tmp_path_factory.mktemp("polaris")
    ingest_run(FIXTURES / "nccl-tests" / "polaris", system="polaris", store=store)
    return SystemModel().fit(load_runs(system="polaris", store=store)).calibration_.to_json()


def _device_model_json() -> dict:
    p = Param(1.0, 0.1, "", "fitted")
    fam = Family("gelu", "bf16", *([p] * 10))
    dm = DeviceModel("H100", 989.0, 3.35, "datasheet", GemmModel(*([p] * 6)), *([p] * 9), families=(fam,))
    return json.loads(json.dumps(asdict(dm)))


#: every object a hand-written from_json reads, as a path into the calibration JSON
NESTED = [
    (),
    ("compute_slots_per_node",),
    ("gemm_efficiency_curve",),
    ("gemm_efficiency_curve", "y_max"),
    ("collectives", 0, "quality"),
    ("collectives", 0),
    ("collectives", 0, "segments", 0),
    ("collectives", 0, "alpha_s"),
    ("network", "allreduce"),
    ("network", "allreduce", "segments", 0),
    ("dispatch", "intra_op_s_per_op"),
    ("device_model",),
    ("device_model", "gemm"),
    ("device_model", "families", 0),
    ("device_model", "stream_tbps"),
]


@pytest.mark.parametrize("where", NESTED, ids=lambda w: ".".join(map(str, w)) or "top")
def test_unknown_keys_are_one_line_naming_file_and_key(fitted, polaris, tmp_path, where) -> None:
    cal, _ = fitted
    doc = json.loads(json.dumps(polaris))
    doc["device_model"] = _device_model_json()
    doc["compute_slots_per_node"] = asdict(cal.compute_slots_per_node)
    good = tmp_path / "good.calib.json"
    good.write_text(json.dumps(doc))
    Calibration.load(good)  # the document is valid before the key is added
    obj = doc
    for k in where:
        obj = obj[k]
    obj["speed_of_light_mps"] = 3e8
    bad = tmp_path / "bad.calib.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(InputError) as exc:
        Calibration.load(bad)
    line = exc.value.line()
    assert "\n" not in line and line.startswith(str(bad)) and "'speed_of_light_mps'" in line


def test_show_prints_the_compute_slots(fitted) -> None:
    from calib.commands.show import render

    cal, _ = fitted
    s = cal.compute_slots_per_node
    line = next(x for x in render(cal).splitlines() if "compute slots/node" in x)
    expected = f"{s.value:.3g}" + (f" ± {s.stderr:.3g}" if s.stderr is not None else "")
    assert expected in line, line
