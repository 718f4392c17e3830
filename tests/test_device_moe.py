"""Mixture-of-experts routing measured from the real H200 Mixtral trace (calibrate/device_moe.py).

One MoE run exists (fixtures/traces/h200: HF transformers' MixtralForCausalLM, 8 experts,
top-2, grouped expert GEMMs), so its terms are measured on it and its in-sample error is a
floor, not a validation; what the run says without its own trace (the hand-counted
default) is checked too.  Bounds are the observed values rounded up (observed figures in
each docstring).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calib.api import SystemModel, load_runs
from tests.test_h200_device import _store  # ingest runs + the GEMM bench into a store

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "h200"
MEASURED = json.loads((H200 / "measured_steps.json").read_text())["runs"]
MIXTRAL = "mixtral-d1024-e8"
DENSE = ("g125m-b8", "g760m-b8", "g2p7b-b4", "g1p3b-s2k-b2", "llama-d1024-l16", "llama-bf16-d4096-s2k",
         "llama-d1024-s16k", "llama-d2048-s32k", "llama-gqa-d2048-s4k")  # fmt: skip


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    store = _store(tmp_path_factory.mktemp("h200moe"), H200, "h200-hf", [*DENSE, MIXTRAL])
    return store, SystemModel().fit(load_runs(system="h200-hf", store=store))


def _facts(store):
    from calib.calibrate import device_facts

    (run,) = load_runs([MIXTRAL], system="h200-hf", store=store, kind="trace")
    return run, device_facts.facts(run)


def _spec():
    from calib.analytic.specs import ModelSpec

    sh = MEASURED[MIXTRAL]["shape"]
    return ModelSpec(MIXTRAL, sh["d"], sh["l"], sh["a"], sh["s"], sh["V"], ffn=sh["ffn"], kv_heads=sh["kv"],
                     mlp="swiglu", tied_embeddings=False, n_experts=sh["E"], top_k=sh["topk"],
                     expert_ffn=sh["ffn"], dropout=False)  # fmt: skip


def _err(model) -> float:
    sh = MEASURED[MIXTRAL]["shape"]
    it = model.predict(_spec(), gpus=[1], micro_batch=sh["b"], flash_attention=True).table["iter_s"].iloc[0]
    return it / MEASURED[MIXTRAL]["step_s_unprofiled_median"] - 1.0


def test_the_terms_are_the_runs_own_excess_over_the_dense_family(fitted):
    """Top-k 2 from the run's sidecar and, independently, from the grouped GEMMs' rows
    (16,384 = 2 x 8,192 tokens).  Expert-width bytes per routed token per unit of f_e are the
    run's ffn-wide kernels' bytes over k T f_e L (observed 26.0, above the dense SwiGLU
    family's 18 per token: the same element-wise work plus masks over the grouped GEMMs'
    2 f_e-wide outputs); d-wide bytes beyond the dense family 102.8 per routed token per d,
    6.4x the hand count's 16 (eight 2-byte passes); grouped expert GEMMs 1.28x the dense
    roofline of the same shapes, recomputed here from the raw GEMM table."""
    from calib.analytic.moe import DISPATCH_PASSES
    from calib.calibrate.device_facts import _top_k
    from calib.calibrate.device_moe import traced_grouping

    store, model = fitted
    dm = model.device_model_
    mt = dm.moe
    assert mt is not None and mt.runs == (MIXTRAL,)
    run, f = _facts(store)
    g = run.table("gemms")
    g = g[(g["device"] == "gpu") & (g["iteration"] == g["iteration"].max())]
    assert f.top_k == 2 == run.meta.model["topk"] == _top_k(g, f.T)
    want = f.groups.loc["ffn", "bytes"] / (f.T * 2 * f.ffn * f.L)
    assert mt.bytes_ffn.value == pytest.approx(want, rel=1e-12)
    fam, _ = dm.family("swiglu", "bf16", compiled=False)
    assert 24.0 < mt.bytes_ffn.value < 28.0 and mt.bytes_ffn.value > fam.bytes_ffn.value
    assert 95.0 < mt.bytes_d.value < 110.0 and mt.bytes_d.value > 6 * DISPATCH_PASSES * 2.0
    grouped = g[g["op"] == "aten::_grouped_mm"]
    roof = dm.gemm.time_s(grouped["m"], grouped["n"], grouped["k"], grouped["batch"])
    ratio = grouped["dur_s"].sum() / roof.sum()  # over one GEMM of the rows: 1.30
    assert 1.25 < ratio < 1.35
    # beyond the grouping law (calibrate.grouped_gemm; stop 33): 8 experts of 2,048 rows lose
    # little to it (every expert's weights, half a tile of rows each), so 1.25 is left
    law = (roof * traced_grouping(grouped, f, dm)).sum()
    assert mt.grouping_law
    assert mt.grouped_gemm_scale.value == pytest.approx(
        grouped["dur_s"].sum() / law, rel=0.05
    )  # medians per shape vs every op
    assert 1.2 < mt.grouped_gemm_scale.value < 1.3 and mt.grouped_gemm_scale.value < ratio
    assert mt.bytes_d.stderr is None and "one run" in mt.bytes_d.note  # no spread from one run


def _without_moe_terms(model, tmp_path):
    """The same calibration as a file without the MoE terms (one from before stop 25)."""
    d = json.loads(Path(model.save(tmp_path / "h200.calib.json")).read_text())
    del d["device_model"]["moe"]
    old = tmp_path / "old.calib.json"
    old.write_text(json.dumps(d))
    return SystemModel.load(old)


def test_mixtral_in_sample_and_with_the_hand_count(fitted, tmp_path):
    """In-sample (a floor: the terms come from this run): -3.3 % (-20.9 % at stop 24, when
    the routing work was the hand count at the datasheet bandwidth and the experts' GEMMs
    ran at the dense layer's average efficiency).  Without the run's MoE terms (the hand
    count, the roofline as one GEMM): -25.3 %, i.e. HF's grouped experts stream about 6x
    what an implementation with a fused permutation would; that is the stated default's
    error on this stack, kept visible here."""
    _, model = fitted
    assert abs(_err(model)) < 0.05
    hand = _without_moe_terms(model, tmp_path)
    assert hand.device_model_.moe is None
    assert -0.30 < _err(hand) < -0.20


def test_moe_terms_survive_save_and_an_older_file_loads(fitted, tmp_path):
    _, model = fitted
    again = SystemModel.load(model.save(tmp_path / "again.calib.json"))
    assert again.device_model_.moe == model.device_model_.moe
    assert _without_moe_terms(model, tmp_path).device_model_.moe is None


def test_host_issue_counts_the_routing_operators(fitted):
    """The run issued 7,681 host operators a step; the dense family's count for its 8 layers
    is 5,422 and the measured MoE excess, 282 per layer, makes up the rest (by construction),
    and the predicted host time is those operators at the fitted cost per operator (all
    layers route: MoE share 1; a dense model adds nothing)."""
    from calib.analytic.device_path import host_s

    store, model = fitted
    _, f = _facts(store)
    dm = model.device_model_
    fam, _ = dm.family("swiglu", "bf16", compiled=False)
    ops = fam.host_ops_layer.value * f.L + fam.host_ops_step.value + dm.moe.host_ops_layer.value * f.L
    assert ops == pytest.approx(f.host_ops, rel=1e-9) and 250 < dm.moe.host_ops_layer.value < 300
    per_op = (fam.host_s_per_op or dm.host_s_per_op).value
    assert float(host_s(dm, fam, f.L, 1.0, 1.0)) == pytest.approx(ops * per_op, rel=1e-9)
    dense_ops = fam.host_ops_layer.value * f.L + fam.host_ops_step.value
    assert float(host_s(dm, fam, f.L, 1.0, 0.0)) == pytest.approx(dense_ops * per_op, rel=1e-9)


def test_fit_text_names_the_moe_terms(fitted, tmp_path):
    from tests.conftest import run

    store, _ = fitted
    out = run("fit", "--system", "h200-hf", "--store", str(store)).output
    line = next(ln for ln in out.splitlines() if "MoE routing" in ln)
    assert "B x d" in line and "grouped expert GEMMs x1.2" in line and MIXTRAL in line
    assert f"measured on {MIXTRAL} (top-2, f_e 1792)" in line  # the structure the terms were read with
    # the per-run table lists the MoE run apart, predicted by the analytic device path:
    # in-sample with its own terms, held out with the hand count (no other MoE run)
    res = run("validate", "--runs", "h200-hf", "--store", str(store), "--json")
    doc = json.loads(res.output)
    assert MIXTRAL not in {r["run"] for r in doc["runs"]}
    (row,) = [r for r in doc["variant_runs"] if r["run"] == MIXTRAL]
    assert row["variant"] == "moe"
    assert row["measured_ms"] == pytest.approx(MEASURED[MIXTRAL]["step_s_unprofiled_median"] * 1e3, rel=1e-9)
    assert abs(row["insample_err"]) < 0.05 and -0.30 < row["heldout_err"] < -0.20
    assert "MoE routing: stated default (no other run)" in row["heldout_from"]
    text = run("validate", "--runs", "h200-hf", "--store", str(store)).output
    assert "FP8, MoE and MLA runs" in text and MIXTRAL in text.split("FP8, MoE and MLA runs")[1]


def test_moe_memory_is_the_familys_own_count_on_the_routed_rows(fitted):
    """No fitted term: the routed rows keep their permuted input and expert output (2 d
    values) and HF's eager SwiGLU intermediates at the dense family's own 8 bytes per unit
    of width (device_model.ACT_COUNT): 4 d + 8 f_e = 18,432 bytes per routed token-layer.
    The run's peak less the dense part (states in its bf16 precision, the dense family's
    attention-side activations, the logits) leaves 18,315 (observed).  With the experts'
    states in the family's precision (4 bytes of Adam moments, not the spec path's 12) and
    the device model's peak rule, the predicted peak is -0.3 % (+18.3 % at stop 24)."""
    from calib.calibrate import device_step as D

    store, model = fitted
    _, f = _facts(store)
    dm = model.device_model_
    fam, _ = dm.family(f.mlp, f.weights, compiled=False)
    w_b, o_b, _ = D.state_bytes_per_param(f.weights)
    dense = float(D.act_layer_bytes(fam, f.d, f.kv / f.a, 0.0)) * f.T * f.L + dm.logit_bytes.value * f.T * f.V
    per_routed = (f.peak_mem_bytes - (w_b + o_b) * f.params - dense) / (f.T * f.top_k * f.L)
    count = 4 * f.d + 8 * f.ffn
    assert count == 18432 and abs(per_routed / count - 1) < 0.02
    sh = MEASURED[MIXTRAL]["shape"]
    pred = model.predict(_spec(), gpus=[1], micro_batch=sh["b"], flash_attention=True).table
    assert abs(pred["mem_total_gb"].iloc[0] / MEASURED[MIXTRAL]["peak_mem_gb"] - 1) < 0.02


def test_an_moe_without_grouped_gemms_is_still_an_moe_run(fitted):
    """An MoE layer that loops over its experts with plain matmuls (older HF Mixtral) shows
    no grouped GEMM; its router's top-k beside a token scatter, or the capture's stated
    expert count, still tags it (it must not enter the dense fit).  Checked on the real
    run's device ops with the grouped GEMMs taken away, and on a dense run's."""
    from calib.calibrate.device_facts import variant

    store, _ = fitted
    run, f = _facts(store)
    ops = run.table("device_ops")
    names = set(ops.loc[ops["op"] != "aten::_grouped_mm", "op"].astype(str))
    plain = f.gemms.assign(op="aten::mm", fp8=False)
    assert "aten::topk" in names and variant(names, plain) == "moe"
    (dense,) = load_runs(["llama-d1024-l16"], system="h200-hf", store=store, kind="trace")
    dense_names = set(dense.table("device_ops")["op"].astype(str))
    assert variant(dense_names, plain) == "" and variant(dense_names, plain, experts=8) == "moe"
    # with no grouped kernel to measure, the roofline stands for the expert GEMMs (scale None)
    from dataclasses import replace

    from calib.calibrate.device_moe import fit_moe

    dm = fitted[1].device_model_
    looped = fit_moe([replace(f, gemms=f.gemms.assign(grouped=False))], dm)
    assert looped.grouped_gemm_scale is None and looped.bytes_d == dm.moe.bytes_d


def test_a_negative_measured_excess_is_held_at_none(fitted):
    """Measured against a dense family that already streams as much (noise, or a system whose
    only traced runs are MoE ones, fitted on themselves), an excess below zero must not
    shorten the layer: it counts as none."""
    from dataclasses import replace

    from calib.analytic.device_path import moe_routed_s
    from calib.calibrate.params import Param

    dm = fitted[1].device_model_
    fam, _ = dm.family("swiglu", "bf16", compiled=False)
    neg = replace(dm, moe=replace(dm.moe, bytes_d=Param(-500.0, unit="B"), bytes_ffn=Param(0.0, unit="B"),
                                  kernels_layer=Param(-50.0)))  # fmt: skip
    zero = replace(dm, moe=replace(neg.moe, bytes_d=Param(0.0, unit="B"), kernels_layer=Param(0.0)))
    args = (16384.0, 1024.0, 1792.0, 3.0, 1.0)
    assert float(moe_routed_s(neg, fam, *args)) == pytest.approx(float(moe_routed_s(zero, fam, *args)))


def test_validate_runs_names_an_moe_run_it_cannot_predict(fitted, tmp_path):
    """A calibration whose MoE run did not state its number of experts (the capture's ``E``):
    the row stays, unpredicted, and says why instead of failing the whole table."""
    import shutil

    from tests.conftest import run

    store, _ = fitted
    copy = tmp_path / "store"
    shutil.copytree(store / "h200-hf", copy / "h200-hf")
    # its own fit (the module's other tests may run in another worker)
    assert run("fit", "--system", "h200-hf", "--store", str(copy)).exit_code == 0
    shutil.rmtree(copy / "h200-hf" / "runs")
    path = copy / "h200-hf" / "h200-hf.calib.json"
    doc = json.loads(path.read_text())
    for r in doc["device_model"]["variant_runs"]:
        r["shape"]["experts"] = 0
    path.write_text(json.dumps(doc))
    res = run("validate", "--runs", "h200-hf", "--store", str(copy), "--json")
    (row,) = [r for r in json.loads(res.output)["variant_runs"] if r["run"] == MIXTRAL]
    assert row["insample_ms"] is None and row["measured_ms"] > 0
    assert row["heldout_from"] == "not predicted: the capture did not state the number of experts"


def test_a_calibration_from_before_the_grouping_law_keeps_its_scale(fitted, tmp_path):
    """A calibration saved before stop 33 measured its grouped scale over the one-GEMM
    roofline, so the grouping law (calibrate.grouped_gemm) must not be applied on top of it:
    its file has no ``grouping_law``, which loads as false, and the experts' count then does
    not change the layer's time; a current fit applies the law (8 groups of 2,048 rows: a
    little slower than one GEMM of 16,384)."""
    from calib.analytic.device_path import moe_routed_s

    _, model = fitted
    d = json.loads(Path(model.save(tmp_path / "h200.calib.json")).read_text())
    assert d["device_model"]["moe"].pop("grouping_law") is True
    old = tmp_path / "old.calib.json"
    old.write_text(json.dumps(d))
    dm_old, dm_new = SystemModel.load(old).device_model_, model.device_model_
    assert dm_old.moe.grouping_law is False
    fam, _ = dm_new.family("swiglu", "bf16", compiled=False)
    args = (16384.0, 1024.0, 1792.0, 3.0, 1.0)
    old8, old1 = (float(moe_routed_s(dm_old, fam, *args, experts=e)) for e in (8.0, 1.0))
    new8, new1 = (float(moe_routed_s(dm_new, fam, *args, experts=e)) for e in (8.0, 1.0))
    assert old8 == old1
    assert 1.0 < new8 / new1 < 1.1
