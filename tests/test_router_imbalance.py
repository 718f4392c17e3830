"""A learned router's load skew (ModelSpec.router_imbalance, analytic/moe.py): composed with the
statistical floor of balanced routing, it scales the busiest EP rank's expert GEMMs, all-to-all
bytes and kept routed activations; with a capacity factor it only drops tokens (a note).

Hand-worked on Mixtral 8x7B (Jiang et al. 2024, arXiv:2401.04088: d 4096, SwiGLU experts of
14336, 8 experts, top-2) at b 1, s 4096, TP 1: T = 4096 tokens per GPU, EP 8 inside a DGX H100
(the spec's stated defaults: 989 TFLOP/s, 3.35 TB/s HBM, 450 GB/s NVLink x 0.75 = 337.5 GB/s).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from calib.analytic import modern as X
from calib.analytic import moe as MOE
from calib.analytic.machine import default_calibration
from calib.analytic.specs import load_hardware, load_model
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, comm_times
from calib.analytic.validate import Table
from calib.analytic.vtable import normalise

from calib.core.errors import InputError
from tests.conftest import bad, run

ROOT = Path(__file__).parents[1]
H100 = load_hardware("dgx-h100")
SYS = System(default_calibration(H100), H100)
MX = replace(load_model("mixtral-8x7b"), seq_len=4096)
# Blom's z for the largest of 8 normals: Phi^-1((8 - 0.375) / 8.25) = 1.4338
FLOOR = 1 + 1.4338 * (0.875 / 8192) ** 0.5  # 1.0148 (analytic.moe.max_load_factor)
ST8 = Strategies.of(tp=1, pp=1, dp=64, micro_batch=1, global_batch=64, ep=8)


def test_load_factor_composes_skew_with_the_statistical_floor():
    """1.2 x 1.0148 = 1.2178; one EP rank has no busiest rank (1); a capacity factor pads (1);
    the default 1.0 is the floor itself, bit for bit."""
    assert round(FLOOR, 4) == 1.0148
    skewed = replace(MX, router_imbalance=1.2)
    assert float(MOE.load_factor(skewed, 4096, 8)) == pytest.approx(1.2 * FLOOR, rel=1e-5)
    assert round(float(MOE.load_factor(skewed, 4096, 8)), 4) == 1.2178
    assert float(MOE.load_factor(skewed, 4096, 1)) == 1.0
    assert float(MOE.load_factor(replace(skewed, capacity_factor=1.25), 4096, 8)) == 1.0
    assert float(MOE.load_factor(MX, 4096, 8)) == float(MOE.max_load_factor(4096, 2, 8))
    assert MX.router_imbalance == 1.0 and load_model("deepseek-v3").router_imbalance == 1.0


def test_all_to_all_scales_with_the_busiest_ranks_load():
    """Dispatch and combine buffers 4096 x 2 x 4096 x 2 = 67,108,864 bytes, 7/8 of them leave
    the GPU: alpha 20 us + r x 1.0148 x 67,108,864 x 7/8 / 337.5e9 s for r = 1.0 and 1.3."""
    for r in (1.0, 1.3):
        c = comm_times(replace(MX, router_imbalance=r), SYS, ST8)
        want = 20e-6 + r * FLOOR * 67_108_864 * 7 / 8 / 337.5e9
        assert float(c["ep_dispatch_s"]) == pytest.approx(want, rel=1e-5)
        assert float(c["ep_combine_s"]) == pytest.approx(want, rel=1e-5)
    c1, c3 = (comm_times(replace(MX, router_imbalance=r), SYS, ST8) for r in (1.0, 1.3))
    ratio = (float(c3["ep_dispatch_s"]) - 20e-6) / (float(c1["ep_dispatch_s"]) - 20e-6)
    assert ratio == pytest.approx(1.3, rel=1e-9)


def test_expert_gemm_seconds_scale_with_the_load_and_shared_work_does_not():
    """Routed training FLOPs per layer: 3 passes x 8192 routed tokens x 2 x 3 x 14336 x 4096;
    the per-expert GEMM 2 x 8192 x 4096 x 14336 = 962,072,674,304 FLOPs sets the efficiency;
    permutation traffic 8 passes x 8192 x 4096 x 2 bytes at 3.35 TB/s.  From r = 1.0 to 1.3
    the layer grows by 0.3 x 1.0148 x (routed GEMM + permutation) seconds; the router's
    GEMM (shared part) stays."""
    eff = float(SYS.cal.gemm_efficiency(962_072_674_304))
    routed_s = 3 * 8192 * 6 * 14336 * 4096 / (989e12 * eff)
    perm_s = 8 * 8192 * 4096 * 2 / 3.35e12
    st = Strategies.of(tp=1, pp=1, dp=8, micro_batch=1, global_batch=8, ep=8)

    def layer_s(r):
        m = replace(MX, router_imbalance=r)
        return float(
            X.moe_layer_s(m, SYS, st, 1.0, 4096.0, 4096.0, 1.0, 3.0, 0, SYS.cal.gemm_efficiency, 989e12)
        )

    assert layer_s(1.3) - layer_s(1.0) == pytest.approx(0.3 * FLOOR * (routed_s + perm_s), rel=1e-5)
    shared_s = layer_s(1.0) - FLOOR * (routed_s + perm_s)  # the router: 3 x 4096 x 2 x 8 x 4096 FLOPs
    assert 0 < shared_s < 3 * 4096 * 16 * 4096 / (989e12 * 0.05)


def test_routed_activations_on_the_busiest_rank():
    """838,860,800 bytes per MoE layer (tests/test_analytic_moe.py by hand) x r at EP > 1; the
    floor is not charged to memory, and EP 1 or a capacity factor keep the mean."""
    skewed = replace(MX, router_imbalance=1.25)
    assert MOE.activation_bytes_layer(skewed, 4096, 4096, 3.0, ep=8) == 1.25 * 838_860_800
    assert MOE.activation_bytes_layer(skewed, 4096, 4096, 3.0, ep=1) == 838_860_800
    assert MOE.activation_bytes_layer(MX, 4096, 4096, 3.0, ep=8) == 838_860_800
    padded = replace(skewed, capacity_factor=1.0)
    assert MOE.activation_bytes_layer(padded, 4096, 4096, 3.0, ep=8) == 838_860_800


def test_capacity_factor_drops_tokens_as_a_note():
    """C 1.25, r 1.5: the busiest expert group drops 1 - 1.25 / 1.5 = 16.7 % of its tokens;
    r 1.2 <= C drops none.  Said in `calib predict`'s notes; the time keeps C's padding."""
    assert MOE.dropped_fraction(replace(MX, capacity_factor=1.25, router_imbalance=1.5)) == pytest.approx(
        1 / 6
    )
    assert MOE.dropped_fraction(replace(MX, capacity_factor=1.25, router_imbalance=1.2)) == 0.0
    assert MOE.dropped_fraction(replace(MX, router_imbalance=1.5)) == 0.0  # dropless
    args = ["predict", "--hardware", "dgx-h100", "--model", "mixtral-8x7b", "--s", "4096", "--gpus", "64",
            "--ep", "8", "--global-batch", "64", "--flash-attention", "--zero", "1", "--json"]  # fmt: skip
    out = {r: json.loads(run(*args, "--capacity-factor", "1.25", "--router-imbalance", r).output)
           for r in ("1.0", "1.5")}  # fmt: skip
    assert any("drops 1 - C/r = 16.7% of its tokens" in n for n in out["1.5"]["notes"])
    assert not any("drops" in n for n in out["1.0"]["notes"])
    assert out["1.5"]["configs"][0]["iter_s"] == out["1.0"]["configs"][0]["iter_s"]


def test_cli_option_default_label_and_effect():
    args = ["predict", "--hardware", "dgx-h100", "--model", "mixtral-8x7b", "--s", "4096", "--gpus", "64",
            "--ep", "8", "--global-batch", "64", "--flash-attention", "--zero", "1", "--json"]  # fmt: skip
    base, skew = (json.loads(run(*args, *extra).output) for extra in ((), ("--router-imbalance", "1.3")))
    assert any("router_imbalance 1 (stated default: a balanced router)" in n for n in base["notes"])
    assert any("router_imbalance 1.3 (given)" in n for n in skew["notes"])
    assert skew["model"]["router_imbalance"] == 1.3
    b, s = base["configs"][0], skew["configs"][0]
    assert s["ep_cp_s"] > b["ep_cp_s"] and s["kernel_transformer_s"] > b["kernel_transformer_s"]
    assert s["mem_activations_gb"] > b["mem_activations_gb"]
    srch = run("search", "--hardware", "dgx-h100", "--model", "mixtral-8x7b", "--s", "4096", "--gpus", "64",
               "--global-batch", "64", "--ep", "8", "--router-imbalance", "1.3", "--json")  # fmt: skip
    assert any("router_imbalance 1.3 (given)" in n for n in json.loads(srch.output)["notes"])


@pytest.mark.parametrize("value", ["0.9", "nan", "inf", "abc"])
def test_cli_rejects_bad_values_in_one_line_exit_2(value, capsys):
    from calib.cli import main

    for cmd in ("predict", "search"):
        args = [cmd, "--hardware", "dgx-h100", "--model", "mixtral-8x7b", "--gpus", "64", "--global-batch",
                "64", "--router-imbalance", value]  # fmt: skip
        assert bad(*args).where == "--router-imbalance"
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--router-imbalance" in err


def test_model_file_and_dense_model_are_checked(tmp_path):
    e = bad(
        "predict",
        "--hardware",
        "dgx-h100",
        "--model",
        "llama3-8b",
        "--gpus",
        "8",
        "--router-imbalance",
        "1.2",
    )
    assert e.where == "--router-imbalance" and "n_experts" in e.problem
    for v in (0.5, float("nan"), "high"):
        with pytest.raises(InputError, match="router_imbalance must be a finite number >= 1"):
            replace(MX, router_imbalance=v)
    f = tmp_path / "m.json"
    f.write_text(
        json.dumps({**{k: v for k, v in MX.__dict__.items() if k != "name"}, "router_imbalance": 0.8})
    )
    e = bad("predict", "--hardware", "dgx-h100", "--model", str(f), "--gpus", "64")
    assert "router_imbalance" in e.problem and "\n" not in str(e)
    f.write_text(
        json.dumps({**{k: v for k, v in MX.__dict__.items() if k != "name"}, "router_imbalance": 1.2})
    )
    assert (
        run("predict", "--hardware", "dgx-h100", "--model", str(f), "--gpus", "64", "--ep", "8").exit_code
        == 0
    )


ROW = {"label": "r", "hardware": "dgx-h100", "model": "mixtral-8x7b", "seq_len": 4096, "gpus": 64, "tp": 1,
       "pp": 1, "ep": 8, "micro_batch": 1, "global_batch": 64, "flash_attention": True, "zero": 1,
       "measured_iter_s": 10.0}  # fmt: skip


def test_validate_table_column():
    df = normalise(pd.DataFrame([ROW, {**ROW, "router_imbalance": 1.3}]), "t.csv")
    assert list(df["router_imbalance"]) == [1.0, 1.3]
    it = Table.of(df).iter_s({"dgx-h100": SYS})[0]
    assert it[1] > it[0]
    for v in ("0.9", "x"):
        with pytest.raises(InputError, match=r"row 2: column 'router_imbalance' must be a number >= 1"):
            normalise(pd.DataFrame([ROW, {**ROW, "router_imbalance": v}]), "t.csv")
    dense = {**ROW, "model": "llama3-8b", "ep": 1, "router_imbalance": 1.2}
    with pytest.raises(InputError, match=r"row 1: model shape: router_imbalance .* needs n_experts > 0"):
        normalise(pd.DataFrame([dense]), "t.csv")


def test_default_leaves_the_published_deepseek_row_unchanged(tmp_path):
    """The DeepSeek-V3 pretraining row (fixtures/published) predicts the same with no
    router_imbalance column as with the stated default 1.0 written in it, and another value
    moves it."""
    src = ROOT / "fixtures" / "published" / "deepseek_v3_h800_pretraining.csv"
    raw = pd.read_csv(src)

    def predicted(r: float | None) -> float:
        path = tmp_path / f"t{r}.csv"
        (raw if r is None else raw.assign(router_imbalance=r)).to_csv(path, index=False)
        out = json.loads(run("validate", str(path), "--fit", "none", "--json").output)
        return out["per_row"][0]["predicted"]

    assert predicted(None) == predicted(1.0) > predicted(1.2)
