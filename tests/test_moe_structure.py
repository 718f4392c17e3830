"""The MoE terms measured with the layer structure the capture states (stop 29): the expert
width (``effn``), shared experts (``shared`` / ``shffn``) and leading dense layers
(``dense``), on the real HF Mixtral, Qwen2-MoE and DeepSeek-V3 runs of a second H100
(fixtures/traces/h100b).  calibrate.device_moe until stop 28 measured every run as if each
layer routed, no expert were shared and the experts were as wide as ``ffn``.  Also the device
path's count of multi-head latent attention's kept tensors, on the same fitted family."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from calib.api import SystemModel, ingest_run, load_runs

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
DENSE = ("llama-d1024-l16-repeat", "g350m-b16", "llama-bf16-d4096-s2k", "llama-d1024-s8k-b2", "llama-d3072-s2k",
         "llama-gqa-d2048-s4k")  # fmt: skip
MIXTRAL, QWEN, DSV3 = "mixtral-d1024-e8", "qwen2moe-d1024-e60-top4", "dsv3-d1024-e64-top6"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Facts of the three MoE runs and the eager dense device model of the same machine."""
    from calib.calibrate import device_facts

    store = tmp_path_factory.mktemp("moe-structure")
    for name in (*DENSE, MIXTRAL, QWEN, DSV3):
        ingest_run(FIX / "h100b" / "runs" / name, system="h100-hf", store=store)
    for b in (FIX / "h100" / "gemm-bench").iterdir():
        shutil.copytree(b, store / "h100-hf" / "runs" / b.name)
    runs = load_runs(system="h100-hf", store=store)
    facts = {r.meta.name: device_facts.facts(r) for r in runs if r.meta.name in (MIXTRAL, QWEN, DSV3)}
    dense = [r for r in runs if r.meta.name not in (QWEN, DSV3)]
    return facts, SystemModel().fit(dense).device_model_


def test_the_capture_states_the_moe_layer_structure(setup):
    """The sidecar's effn, shared, shffn and dense reach the run's facts."""
    facts, _ = setup
    m, q, d = facts[MIXTRAL], facts[QWEN], facts[DSV3]
    assert (m.top_k, m.expert_ffn, m.shared_ffn, m.dense_layers) == (2, 0, 0, 0)
    assert (q.top_k, q.expert_ffn, q.shared_ffn, q.dense_layers) == (4, 704, 2816, 0)  # one gated shared MLP
    assert (d.top_k, d.expert_ffn, d.shared_ffn, d.dense_layers) == (6, 512, 1024, 1)  # 2 shared x 512


def test_routed_rows_of_the_expert_width_form_their_own_group(setup):
    """Qwen2-MoE's k T routed rows of width 704 or 1408 (a multiple of f_e, not of d) are the
    "expert" group; before, k f_e = 4 x 704 = 2816 = ffn put them in the ffn group by
    coincidence.  Mixtral's experts are ffn wide: no expert group."""
    facts, _ = setup
    q, m = facts[QWEN].groups, facts[MIXTRAL].groups
    assert q.loc["expert", "bytes"] > 1e9 and q.loc["expert", "kernels"] > 0
    assert m.loc["expert", "bytes"] == 0.0


def test_grouped_experts_stream_the_same_bytes_per_unit_of_expert_width(setup):
    """HF transformers' grouped experts run the same code in Mixtral and Qwen2-MoE, so their
    element-wise bytes per routed token per unit of expert width must agree once the shared
    expert (a dense MLP of width 2816) is taken out: observed 26.00 (Mixtral, f_e 1792) and
    26.00 (Qwen2-MoE, f_e 704); 11.0 when Qwen's bytes were counted per unit of ffn with its
    shared expert in them."""
    from calib.calibrate.device_moe import excess

    facts, dm = setup
    mix, qwen = excess(facts[MIXTRAL], dm), excess(facts[QWEN], dm)
    assert qwen["bytes_ffn"] == pytest.approx(mix["bytes_ffn"], rel=0.03)
    assert 20.0 < mix["bytes_ffn"] < 32.0


def test_per_moe_layer_terms_count_only_the_routing_layers(setup):
    """DeepSeek-V3's first layer is dense: the kernels beyond the dense family spread over the
    five MoE layers of six (the same total as counted over all six)."""
    from calib.calibrate.device_moe import excess

    facts, dm = setup
    f = facts[DSV3]
    ours, flat = excess(f, dm), excess(replace(f, dense_layers=0, shared_ffn=0), dm)
    assert ours["kernels_layer"] * (f.L - 1) == pytest.approx(flat["kernels_layer"] * f.L)
    assert ours["host_ops_layer"] * (f.L - 1) == pytest.approx(flat["host_ops_layer"] * f.L)


def test_shared_experts_stream_the_dense_family_ffn_bytes(setup):
    """A shared expert is a dense MLP: its element-wise work is the family's bytes per token per
    unit of width, (passes + 2) / 3 of the training step's, at the family's bandwidth."""
    from calib.analytic.device_path import moe_routed_s
    from calib.calibrate import device_step as D

    _, dm = setup
    fam, _ = dm.family("swiglu", "bf16", compiled=False)
    args, tw = (8192.0 * 2, 1024.0, 1792.0, 3.0, 1.0), 8192.0 * 2816
    extra = float(moe_routed_s(dm, fam, *args, shared_tw=tw) - moe_routed_s(dm, fam, *args))
    assert extra == pytest.approx(fam.bytes_ffn.value * tw / (D._bw(dm, fam) * 1e12))
    assert extra > 0


def test_the_fit_says_which_structure_it_measured(setup):
    """`calib fit` prints each MoE term with the runs and the layer structure it read."""
    from calib.calibrate.device_moe import fit_moe

    facts, dm = setup
    terms = fit_moe([facts[DSV3]], dm)
    assert (
        "dsv3-d1024-e64-top6 (top-6, f_e 512, shared experts 1024 wide, 1 of 6 layers dense)"
        in terms.bytes_ffn.note
    )
    assert terms.runs == (DSV3,)


def test_the_device_path_counts_mla_kept_tensors(setup):
    """The trace-fitted device model's activation count holds full heads (q and output 4 d, k and
    v 4 d kv / a bytes per token); MLA keeps its latents and up-projected heads instead.  The HF
    DeepSeek-V3 run of fixtures/traces/h100b (d 1024, 16 heads, q rank 384, kv rank 256, rope 32,
    nope 64, v head 64): q = k = 16 x 96 = 1536, v = o = 1024 -> split 2 x 5120 = 10,240 bytes;
    latents 2 (2 x 384 + 2 x 256 + 32) = 2,624; full heads 8 x 1024 = 8,192: 4,672 bytes per token
    and layer more.  Stop 32 adds what HF's DeepseekV3Attention keeps beyond that count
    (device_path.hf_mla_kept_extra, read from its code): the latents' RMSNorm fp32 inputs and
    bf16 casts 4 (384 + 256) = 2,560, the rotary key kept by nothing -2 x 32 = -64, kv_b's whole
    output behind the value view 2 x 16 x 64 = 2,048: 9,216 bytes per token and layer, x the
    fitted family's scale.  At TP 2 with SP all halve: 4,608.  A model without MLA adds nothing."""
    from calib.analytic.device_path import mla_act_bytes_layer
    from calib.analytic.specs import ModelSpec

    m = ModelSpec("dsv3-d1024", 1024, 6, 16, 2048, 32000, ffn=2816, mlp="swiglu", n_experts=64, top_k=6,
                  expert_ffn=512, shared_experts=2, dense_layers=1, qk_head_dim=96, v_head_dim=64,
                  q_lora_rank=384, kv_lora_rank=256, qk_rope_head_dim=32)  # fmt: skip
    from calib.analytic.specs import load_model

    fam, _ = setup[1].family("swiglu", "bf16", compiled=False)
    k = fam.act_scale.value
    assert 0.5 < k < 2.0
    assert float(mla_act_bytes_layer(m, fam, 8192, 1024, 1, False)) == pytest.approx(k * 9216 * 8192)
    assert float(mla_act_bytes_layer(m, fam, 8192, 1024, 2, True)) == pytest.approx(k * 4608 * 8192)
    assert float(mla_act_bytes_layer(load_model("llama3-8b"), fam, 8192, 4096, 1, False)) == 0.0


def _bad_copy(tmp_path, change):
    """The real DeepSeek-V3 run with ``change`` made to its sidecar's shape."""
    import json

    src = FIX / "h100b" / "runs" / DSV3
    bad = tmp_path / DSV3
    shutil.copytree(src, bad)
    cfg = json.loads((src / "run_config.json").read_text())
    cfg["shape_full"].update(change)
    (bad / "run_config.json").write_text(json.dumps(cfg))
    return bad


@pytest.mark.parametrize(
    "change, says",
    [({"dense": 6}, "dense=6 leading dense layers of l=6: none would route"),
     ({"effn": -512}, "model effn must be a non-negative integer, got -512"),
     ({"l": 0}, "model l must be a positive integer, got 0"),
     ({"topk": 65}, "model topk=65 experts per token but only E=64"),
     ({"shared": -1}, "model shared must be a non-negative integer, got -1")],
)  # fmt: skip
def test_a_nonsense_moe_shape_in_the_sidecar_is_refused(tmp_path, change, says):
    """One impossible value in a real run's sidecar: ingest names the file and the value and
    leaves no run in the store."""
    from tests.conftest import bad

    run_dir, store = _bad_copy(tmp_path, change), tmp_path / "store"
    err = bad("ingest", str(run_dir), "--system", "h100-hf", "--store", str(store))
    assert str(err.where) == str(run_dir / "run_config.json") and says in str(err)
    assert not (store / "h100-hf" / "runs" / DSV3).exists()


def test_a_nonsense_moe_shape_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys

    run_dir = _bad_copy(tmp_path, {"dense": 9})
    proc = subprocess.run([sys.executable, "-m", "calib.cli", "ingest", str(run_dir), "--system", "h100-hf",
                           "--store", str(tmp_path / "store")], capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"calib: {run_dir / 'run_config.json'}: model dense=9 leading dense layers of l=6: none would route"
    ]


def test_the_moe_structure_can_be_stated_on_the_command_line(tmp_path):
    """A trace without a sidecar shape: ``calib ingest --model`` states the same structure (and
    overrides single keys of a sidecar, keeping the rest, such as its precision)."""
    import json

    from calib.calibrate import device_facts

    from tests.conftest import bad, run

    run_dir = _bad_copy(tmp_path, {})
    cfg = json.loads((run_dir / "run_config.json").read_text())
    del cfg["shape_full"]
    (run_dir / "run_config.json").write_text(json.dumps(cfg))
    store = tmp_path / "store"
    spec = "d=1024,l=6,a=16,s=2048,V=32000,b=4,ffn=2816,E=64,topk=6,effn=512,shared=2,dense=1"
    assert (
        run("ingest", str(run_dir), "--system", "h100-hf", "--store", str(store), "--model", spec).exit_code
        == 0
    )
    (r,) = load_runs([DSV3], system="h100-hf", store=store, kind="trace")
    f = device_facts.facts(r)
    assert (f.top_k, f.expert_ffn, f.shared_ffn, f.dense_layers, f.weights) == (6, 512, 1024, 1, "bf16")
    err = bad(
        "ingest",
        str(run_dir),
        "--system",
        "h100-hf",
        "--store",
        str(tmp_path / "s2"),
        "--model",
        "E=8,topk=9",
    )
    assert str(err.where) == "--model" and "topk=9 experts per token but only E=8" in str(err)


def test_the_shared_experts_leave_the_group_their_tensors_land_in(setup):
    """Qwen2-MoE's shared MLP (2816 = ffn) streams in the ffn group, DeepSeek-V3's (2 x 512 =
    1024 = d) in the d group; with top-1 routing (Llama 4's) the routed rows are the token rows,
    so a shared expert of the expert width lands in the expert group, as device_facts._groups
    puts it."""
    from calib.calibrate.device_facts import _groups
    from calib.calibrate.device_moe import shared_group

    facts, _ = setup
    assert shared_group(facts[QWEN]) == "ffn" and shared_group(facts[DSV3]) == "d"
    assert shared_group(facts[MIXTRAL]) is None
    top1 = replace(facts[QWEN], top_k=1, shared_ffn=704)
    assert shared_group(top1) == "expert"
    T = top1.T
    row = pd.DataFrame({"kernel_class": ["elementwise"], "numel": [T * 704], "lead": [T], "in_bytes": [2.0 * T * 704],
                        "count": [1.0], "dur_s": [1e-4]})  # fmt: skip
    g = _groups(row, T, top1.d, top1.ffn, top1.V, top1.params, top1.top_k * T, top1.expert_ffn)
    assert g.loc["expert", "bytes"] == 2.0 * T * 704
