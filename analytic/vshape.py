"""Optional model-shape and stack columns of the validation table (analytic.vtable).

Every column below is optional; a blank cell takes the default (or the ``model`` preset's
value).  An unknown value is a one-line error naming the row, the column and the value.

=======================  ===============================================================
column                   meaning (default)
=======================  ===============================================================
model                    a model preset (analytic/data/models.yaml): fills d_model,
                         n_layers, n_heads, vocab, seq_len and every shape column below
                         that the row leaves blank (none: the row's own shape)
ffn                      MLP hidden size (4 d_model)
kv_heads                 key/value heads, must divide n_heads (n_heads)
mlp                      gelu | swiglu (gelu)
tied_embeddings          true/false: the LM head shares the embedding (true)
dropout                  true/false: the model trains with dropout, whose masks are kept
                         activations (true; Llama/Mixtral/DeepSeek presets: false)
qk_head_dim, v_head_dim  per-head query/key and value widths where not d / a (multi-head
                         latent attention); they set the attention core's FLOPs (d / a)
q_lora_rank,             multi-head latent attention (analytic.mla): query and key/value
kv_lora_rank,            compression ranks and the decoupled RoPE key width; they set the
qk_rope_head_dim         attention projections' weights (blank or 0: none, (2 + 2 kv/a) d^2)
mtp_layers               multi-token-prediction depths on the last stage (0)
n_experts, top_k,        mixture of experts (analytic.moe): routed experts (0 = dense),
expert_ffn,              experts per token, expert MLP width (ffn), shared experts,
shared_experts,          leading dense layers, capacity factor (blank = dropless),
dense_layers,            a learned router's load skew: the busiest EP rank's load over
capacity_factor,         the mean beyond the statistical floor, >= 1 (analytic.moe;
router_imbalance         blank: 1.0, the stated default of a balanced router)
cp, cp_kind              context-parallel size (1) and ring | ulysses | allgather (ring)
ep                       expert-parallel size (1)
precision                bf16 | fp8 (bf16)
master_weights           fp32 | bf16 (fp32)
schedule                 1f1b | zb-h1 | dualpipe (1f1b; interleaved with interleave > 1)
distributed_optimizer    true/false: Megatron's distributed optimizer, needs zero = 1 (false)
tp_comm_overlap          true/false: TP collectives overlapped with GEMMs (false)
zero_impl                deepspeed | fsdp: ZeRO as DeepSpeed or PyTorch FSDP runs it
                         (analytic.dp_exposure) (deepspeed)
shard_group              hybrid sharding (FSDP HYBRID_SHARD, MiCS): ZeRO-2/3 states
                         sharded over this many DP ranks (0 = the whole DP group)
=======================  ===============================================================

Layers not divisible by the pipeline stages are accepted as they are (analytic.uneven),
with or without interleaving.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from calib.analytic.specs import MLP_KINDS, ModelColumns, ModelSpec, load_model

from calib.core.errors import InputError

SHAPE_INTS = ("ffn", "kv_heads", "n_experts", "top_k", "expert_ffn", "shared_experts", "dense_layers")
MLA_COLS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "mtp_layers")
MOE_FIELDS = ("n_experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "capacity_factor",
              "router_imbalance")  # fmt: skip
PRESET_FIELDS = ("d_model", "n_layers", "n_heads", "seq_len", "vocab", "ffn", "kv_heads", "mlp",
                 "tied_embeddings", "dropout", "qk_head_dim", "v_head_dim", *MLA_COLS) + MOE_FIELDS  # fmt: skip
#: text columns -> (allowed values, default)
CHOICES = {
    "mlp": (MLP_KINDS, "gelu"),
    "cp_kind": (("ring", "ulysses", "allgather"), "ring"),
    "precision": (("bf16", "fp8"), "bf16"),
    "master_weights": (("fp32", "bf16"), "fp32"),
    "schedule": (("1f1b", "zb-h1", "dualpipe"), "1f1b"),
    "zero_impl": (("deepspeed", "fsdp"), "deepspeed"),
}
STACK_INTS = {"cp": 1, "ep": 1}
BOOLS = {"tied_embeddings": True, "dropout": True, "distributed_optimizer": False, "tp_comm_overlap": False}


def _blank(col: pd.Series) -> pd.Series:
    return col.isna() | (col.astype(str).str.strip().isin(("", "nan", "None")))


def _row_error(where: str, i: int, text: str) -> InputError:
    return InputError(where, f"row {i + 1}: {text}")


def fill_presets(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """Fill blank shape cells from the row's ``model`` preset (an unknown preset is an error)."""
    if "model" not in df.columns:
        return df
    out = df.copy()
    names = out["model"].where(~_blank(out["model"]), "").astype(str).str.strip()
    for i, name in enumerate(names):
        if not name:
            continue
        try:
            spec = load_model(name)
        except InputError:
            raise _row_error(where, i, f"column 'model': unknown model preset '{name}'") from None
        for f in PRESET_FIELDS:
            v = getattr(spec, f)
            if f not in out.columns:
                out[f] = None
            out[f] = out[f].astype(object)
            if _blank(out[f].iloc[[i]]).iloc[0] and v is not None:
                out.iat[i, out.columns.get_loc(f)] = v
    out["model"] = names
    return out


def normalise_stack(out: pd.DataFrame, where: str, ints, bools) -> pd.DataFrame:
    """Check and default the optional shape/stack columns (``ints``/``bools``: vtable's parsers)."""
    for col, (allowed, default) in CHOICES.items():
        text = out[col].where(~_blank(out[col]), default) if col in out.columns else default
        out[col] = pd.Series(text, index=out.index).astype(str).str.strip().str.lower()
        bad = ~out[col].isin(allowed)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise _row_error(where, i, f"column '{col}': unknown value '{out[col].iloc[i]}' "
                                       f"(known: {', '.join(allowed)})")  # fmt: skip
    for col, default in {
        **STACK_INTS,
        "n_experts": 0,
        "top_k": 0,
        "shared_experts": 0,
        "dense_layers": 0,
    }.items():
        if col not in out.columns:
            out[col] = default
        out[col] = out[col].where(~_blank(out[col]), default)
        out[col] = ints(out, col, where)
    for col in STACK_INTS:
        if (out[col] < 1).any():
            i = int(np.flatnonzero((out[col] < 1).to_numpy())[0])
            raise _row_error(where, i, f"column '{col}' must be at least 1")
    if "shard_group" not in out.columns:  # blank = 0, the whole DP group
        out["shard_group"] = 0
    out["shard_group"] = out["shard_group"].where(~_blank(out["shard_group"]), 0)
    out["shard_group"] = ints(out, "shard_group", where)
    for col in (
        "ffn",
        "kv_heads",
        "expert_ffn",
        "qk_head_dim",
        "v_head_dim",
        *MLA_COLS,
    ):  # blank = the default
        if col not in out.columns:
            out[col] = 0
        out[col] = out[col].where(~_blank(out[col]), 0)
        out[col] = ints(out, col, where)
    cf = pd.to_numeric(out.get("capacity_factor", pd.Series(np.nan, index=out.index)), errors="coerce")
    raw = out.get("capacity_factor", pd.Series("", index=out.index))
    bad = (cf.isna() & ~_blank(raw)) | (cf < 1.0)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise _row_error(
            where, i, f"column 'capacity_factor' must be a number >= 1 or blank, got {raw.iloc[i]!r}"
        )
    out["capacity_factor"] = cf
    raw = out.get("router_imbalance", pd.Series("", index=out.index))
    ri = pd.to_numeric(raw, errors="coerce").where(~_blank(raw), 1.0)
    bad = ri.isna() | ~(ri >= 1.0) | (ri == np.inf)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise _row_error(where, i, f"column 'router_imbalance' must be a number >= 1 or blank (1.0, "
                                   f"the default), got {raw.iloc[i]!r}")  # fmt: skip
    out["router_imbalance"] = ri.astype(float)
    for col, default in BOOLS.items():
        if col not in out.columns:
            out[col] = default
        out[col] = out[col].where(~_blank(out[col]), str(default).lower())
        out[col] = bools(out, col, where)
    if "model" not in out.columns:
        out["model"] = ""
    _check_shapes(out, where)
    return out


def spec_of(r: pd.Series) -> ModelSpec:
    """The ModelSpec of one normalised row (raises InputError on an inconsistent shape)."""
    cf = r["capacity_factor"]
    return ModelSpec(
        str(r.get("model") or r.get("label") or "table row"), int(r["d_model"]), int(r["n_layers"]), int(r["n_heads"]),
        int(r["seq_len"]), int(r["vocab"]), ffn=int(r["ffn"]) or None, kv_heads=int(r["kv_heads"]) or None,
        mlp=str(r["mlp"]), tied_embeddings=bool(r["tied_embeddings"]), dropout=bool(r["dropout"]),
        **{f: int(r[f]) for f in ("n_experts", "top_k", "shared_experts", "dense_layers")},
        expert_ffn=int(r["expert_ffn"]) or None, capacity_factor=None if pd.isna(cf) else float(cf),
        router_imbalance=float(r["router_imbalance"]),
        qk_head_dim=int(r["qk_head_dim"]) or None, v_head_dim=int(r["v_head_dim"]) or None,
        **{f: int(r[f]) or None for f in MLA_COLS[:3]}, mtp_layers=int(r["mtp_layers"]),
    )  # fmt: skip


def _shape_key(df: pd.DataFrame) -> pd.Series:
    cols = ["d_model", "n_layers", "n_heads", "seq_len", "vocab", "ffn", "kv_heads", "mlp", "tied_embeddings",
            "dropout", "qk_head_dim", "v_head_dim", *MLA_COLS, *MOE_FIELDS]  # fmt: skip
    return df[cols].apply(lambda c: c.map(str)).agg("|".join, axis=1)


def _check_shapes(df: pd.DataFrame, where: str) -> None:
    key = _shape_key(df)
    for k in key.unique():
        i = int(np.flatnonzero((key == k).to_numpy())[0])
        try:
            spec_of(df.iloc[i])
        except InputError as exc:
            raise _row_error(where, i, f"model shape: {exc.problem}") from None


def row_models(df: pd.DataFrame) -> list[tuple[np.ndarray, ModelColumns | ModelSpec]]:
    """(row indices, model) groups for the vectorised time model: dense rows of one MLP kind,
    embedding tying and dropout share one ModelColumns; a MoE, MLA or MTP shape is one ModelSpec."""
    out = []
    moe = ((df["n_experts"] > 0) | (df[list(MLA_COLS)] != 0).any(axis=1)).to_numpy()
    dense = df.loc[~moe]
    for (mlp, tied, drop), sub in dense.groupby(["mlp", "tied_embeddings", "dropout"], sort=False):
        idx = sub.index.to_numpy()
        out.append((idx, columns_of(sub, str(mlp), bool(tied), bool(drop))))
    key = _shape_key(df)
    for k in key[moe].unique():
        idx = np.flatnonzero(((key == k) & moe).to_numpy())
        out.append((idx, spec_of(df.iloc[idx[0]])))
    return out


def columns_of(sub: pd.DataFrame, mlp: str = "gelu", tied: bool = True, dropout: bool = True) -> ModelColumns:
    d = sub["d_model"].to_numpy(dtype=float)
    a = sub["n_heads"].to_numpy(dtype=float)
    ffn = sub["ffn"].to_numpy(dtype=float) if "ffn" in sub else np.zeros_like(d)
    kv = sub["kv_heads"].to_numpy(dtype=float) if "kv_heads" in sub else np.zeros_like(d)
    return ModelColumns(
        *(sub[c].to_numpy(dtype=float) for c in ("d_model", "n_layers", "n_heads", "seq_len", "vocab")),
        ffn=np.where(ffn > 0, ffn, 4.0 * d), kv_heads=np.where(kv > 0, kv, a), mlp=mlp, tied_embeddings=tied,
        dropout=dropout,
    )  # fmt: skip
