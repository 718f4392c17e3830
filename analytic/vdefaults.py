"""Stack settings a validation row (or a prediction) leaves unsaid: ``flash_attention``, ``dp_overlap``.

**flash_attention.**  Until stop 30 a blank was always the unfused attention of Megatron in
2021 (the s x s scores kept and moved).  That is what the GPT-3-era tables ran, and it is
wrong for every stack of the generation after FlashAttention: a Llama 3 70B row at s = 8192
on H100s came out 31 % slower unfused (251.7 against 362.5 TFLOP/s per GPU; TP 8, PP 4,
ZeRO-1, 512 GPUs).  A blank is now fused where the row says it belongs to that generation:

* the model has SwiGLU, grouped- or multi-query attention, experts or latent attention
  (Llama, Mistral / Mixtral, Falcon, Qwen, DeepSeek: trained with fused attention kernels);
* the sequence is 4,096 tokens or longer (unfused scores grow as s^2: at 32K one layer's
  scores for one sequence and 32 heads are 69 GB in bf16);
* the hardware has FP8 tensor cores (Hopper and later, H100 onwards: their stacks,
  Megatron-Core with Transformer Engine, NeMo, torchtitan, llm-foundry, run fused attention
  by default).

Otherwise a blank stays unfused.

**dp_overlap.**  A blank stays false (no overlap), except for ZeRO-3 rows: every ZeRO-3
implementation gathers the next module's parameters while the current one computes --
DeepSpeed's ``overlap_comm`` defaults to true for stage 3 only (``deepspeed/runtime/zero/
config.py``, ``overlap_comm_valid``: ``self.stage == ZeroStageEnum.weights``), and PyTorch
FSDP prefetches by default (``backward_prefetch=BACKWARD_PRE``).  How much of it hides is
``analytic.zero_overlap``'s fraction, not all of it.

These are stated defaults about software stacks, not fits: a table that knows gives the
column, and validation says how many rows were defaulted and how.  Stated values are never
changed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

LONG_SEQ = 4096


def modern_shape(df: pd.DataFrame) -> np.ndarray:
    """Rows whose model or sequence length belongs to the fused-attention generation."""
    kv = df["kv_heads"].to_numpy()
    return (
        (df["mlp"].to_numpy() == "swiglu")
        | ((kv > 0) & (kv < df["n_heads"].to_numpy()))
        | (df["n_experts"].to_numpy() > 0)
        | (df.get("kv_lora_rank", pd.Series(0, index=df.index)).to_numpy() > 0)
        | (df["seq_len"].to_numpy() >= LONG_SEQ)
    )


def fused_attention_reason(model, hw) -> str | None:
    """Why ``model`` on ``hw`` belongs to the fused-attention generation (module docstring), or
    None: the same rule for a prediction or a search that is not told as for a blank table column."""
    kv = model.kv_heads or model.n_heads
    why = [
        w
        for w, on in (
            ("SwiGLU", model.mlp == "swiglu"),
            ("grouped-query attention", kv < model.n_heads),
            ("experts", model.n_experts > 0),
            ("latent attention", bool(model.kv_lora_rank)),
            (f"s >= {LONG_SEQ:,}", model.seq_len >= LONG_SEQ),
            ("FP8-capable hardware", hw is not None and hw.peak_fp8_tflops is not None),
        )
        if on
    ]
    return ", ".join(why) or None


def settle(df: pd.DataFrame, systems: dict) -> tuple[pd.DataFrame, list[str]]:
    """``df`` with every blank ``flash_attention`` and ``dp_overlap`` decided (module
    docstring), and a note per column saying how many rows were defaulted each way;
    ``systems`` maps each hardware value to its System."""
    out, notes = df, []
    if "flash_attention_given" in df.columns and not df["flash_attention_given"].all():
        blank = ~df["flash_attention_given"].to_numpy(dtype=bool)
        fp8 = np.array([systems[h].hw.peak_fp8_tflops is not None for h in df["hardware"]], dtype=bool)
        on = blank & (modern_shape(df) | fp8)
        out = out.assign(flash_attention=out["flash_attention"].to_numpy(dtype=bool) | on)
        notes.append(
            f"flash_attention not given for {int(blank.sum())} row(s): fused for {int(on.sum())} (SwiGLU, grouped-"
            f"query, experts or latent attention, s >= {LONG_SEQ:,}, or FP8-capable hardware: the fused-attention "
            f"generation), unfused for {int((blank & ~on).sum())} (Megatron's 2021 attention); stated defaults, "
            "give the column where the table knows"
        )
    if "dp_overlap_given" in df.columns and not df["dp_overlap_given"].all():
        blank = ~df["dp_overlap_given"].to_numpy(dtype=bool)
        on = blank & (df["zero"].to_numpy() == 3)
        out = out.assign(dp_overlap=out["dp_overlap"].to_numpy(dtype=bool) | on)
        notes.append(
            f"dp_overlap not given for {int(blank.sum())} row(s): on for the {int(on.sum())} ZeRO-3 row(s) (DeepSpeed "
            "stage 3 and FSDP prefetch by default; the hidden share is analytic.zero_overlap's), off for "
            f"{int((blank & ~on).sum())}; stated defaults, give the column where the table knows"
        )
    return out, notes
