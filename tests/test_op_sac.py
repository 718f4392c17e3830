"""torchtitan's op-level selective activation checkpointing (``--recompute op``): saves the
outputs of the matmuls and of SDPA "except every second mm" (torchtitan's ``_custom_policy``;
the order in a Llama block is wq, wk, wv, wo, w1, w3, w2) and recomputes everything else.
Hand-worked on Llama 3 8B (d 4096, 8 of 32 KV heads, ffn 14336, SwiGLU)."""

from __future__ import annotations

import pytest
from calib.analytic import formulas as F
from calib.analytic.specs import load_model
from calib.analytic.vtable import read_table

from tests.conftest import run

PUB = __import__("pathlib").Path(__file__).parents[1] / "fixtures" / "published"


def test_recomputed_flops_and_kept_bytes_by_hand():
    """Re-run per layer: wk (d x d/4), wo (d x d) and w3 (d x ffn), forward, 2 FLOPs per MAC:
    2 s (4096^2/4 + 4096^2 + 4096 x 14336) = 2 s x 79,691,776.  Kept per token: the block
    input, wq's output (d), wv's (d/4), the attention output (d), w1's (ffn) and w2's (d),
    2 bytes each: 2 (4 + 1/4 + 3.5) d = 15.5 d bytes -- against 34 d without recompute (8 replicated
    + 4 + 4/4 + 2 x 3 x 3.5 split, no dropout)."""
    s, d = 8192, 4096
    assert F.op_sac_recompute_flops(1, s, d, 14336, 0.25) == pytest.approx(
        2 * s * (d * d / 4 + d * d + d * 14336)
    )
    assert F.op_sac_kept_coeff(14336 / d, 0.25, 3.0) == pytest.approx(15.5)
    kept = F.activation_bytes_layer(1, s, d, 32, 1, False, F.OP, True, 14336 / d, 0.25, 3.0, False)
    none = F.activation_bytes_layer(1, s, d, 32, 1, False, F.NONE, True, 14336 / d, 0.25, 3.0, False)
    assert kept == pytest.approx(15.5 * s * d) and none == pytest.approx(34.0 * s * d)
    # the attention core is saved, not re-run: no extra attention FLOPs, unlike selective
    assert not F.attention_recomputed(F.OP) and F.attention_recomputed(F.SELECTIVE)
    m = load_model("llama3-8b")
    extra = F.training_flops_layers(1, s, d, 1, F.OP, m.ffn, 0.25, 3.0) - F.training_flops_layers(
        1, s, d, 1, F.NONE, m.ffn, 0.25, 3.0
    )
    assert extra == pytest.approx(F.op_sac_recompute_flops(1, s, d, m.ffn, 0.25))


def test_op_sits_between_none_and_full():
    """Llama 3 70B on 64 A100, FSDP: op-level SAC is slower than none and selective, faster
    than full; it keeps about half of none's activations and far more than full's."""
    args = ("predict", "--hardware", "dgx-a100-80gb", "--model", "llama3-70b", "--s", "4096", "--gpus", "64",
            "--zero", "3", "--zero-impl", "fsdp", "--dp-overlap", "--flash-attention", "--global-batch", "64",
            "--csv")  # fmt: skip
    res = {}
    for rc in ("none", "selective", "op", "full"):
        out = run(*args, "--recompute", rc).output.splitlines()
        row = dict(zip(out[0].split(","), out[1].split(",")))
        res[rc] = (float(row["iter_s"]), float(row["mem_activations_gb"]))
    assert res["selective"][0] < res["op"][0] < res["full"][0]
    assert res["full"][1] < res["op"][1] < 0.6 * res["none"][1]


def test_torchtitan_rows_run_as_op_level_sac():
    """The table's three "selective op" rows carry recompute op; none is predicted out of
    memory any more (the 70B one was, as selective)."""
    df, _ = read_table(PUB / "torchtitan_fsdp2_a100_llama.csv")
    sel = df["label"].str.endswith("-selop")
    assert (df.loc[sel, "recompute"] == "op").all() and sel.sum() == 3
    from calib.analytic.validate import validate

    v = validate(df, "torchtitan", fit_kind="none")
    assert v.summary["n_predicted_oom"] == 0


def test_bad_recompute_and_head_width_values_are_one_line(tmp_path):
    """A table's unknown recompute mode names every known one (op included); a head width that
    is not a non-negative integer names the row and column; predict refuses an unknown mode."""
    from tests.conftest import bad

    head = "label,hardware,d_model,n_layers,n_heads,seq_len,vocab,gpus,tp,pp,dp,micro_batch,global_batch"
    table = tmp_path / "t.csv"
    table.write_text(
        f"{head},recompute,measured_iter_s\nr1,dgx-h100,4096,32,32,2048,32000,8,1,1,8,1,8,opp,1.0\n"
    )
    err = bad("validate", str(table), "--fit", "none")
    assert "recompute must be one of none, selective, full, op, got 'opp'" in err.problem
    for v in ("abc", "-1", "1.5"):
        table.write_text(
            f"{head},qk_head_dim,measured_iter_s\nr1,dgx-h100,4096,32,32,2048,32000,8,1,1,8,1,8,{v},1.0\n"
        )
        assert "column 'qk_head_dim'" in bad("validate", str(table), "--fit", "none").problem
    assert bad("predict", "--hardware", "dgx-h100", "--model", "gpt-13b", "--gpus", "8", "--recompute", "opp")
