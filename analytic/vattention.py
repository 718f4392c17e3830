"""Which attention kernel a validation row ran when its table does not say (``flash_attention`` blank).

Until stop 30 a blank was always the unfused attention of Megatron in 2021 (the s x s scores
kept and moved).  That is what the GPT-3-era tables ran, and it is wrong for every stack of
the generation after FlashAttention: a Llama 3 70B row at s = 8192 on H100s came out 31 %
slower unfused (251.7 against 362.5 TFLOP/s per GPU, ``calib predict``).  A blank is now
fused where the row says it belongs to that generation:

* the model has SwiGLU, grouped- or multi-query attention, experts or latent attention
  (Llama, Mistral / Mixtral, Falcon, Qwen, DeepSeek: trained with fused attention kernels);
* the sequence is 4,096 tokens or longer (unfused scores grow as s^2: at 32K one layer's
  scores for one sequence and 32 heads are 69 GB in bf16);
* the hardware has FP8 tensor cores (Hopper and later, H100 onwards: their stacks,
  Megatron-Core with Transformer Engine, NeMo, torchtitan, llm-foundry, run fused attention
  by default).

Otherwise a blank stays unfused.  These are stated defaults about software stacks, not fits:
a table that knows gives the column, and validation says how many rows were defaulted and
how.  Rows with a value are never changed.
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


def settle(df: pd.DataFrame, systems: dict) -> tuple[pd.DataFrame, list[str]]:
    """``df`` with every blank ``flash_attention`` decided (module docstring), and a note saying
    how many rows were defaulted each way; ``systems`` maps each hardware value to its System."""
    if "flash_attention_given" not in df.columns:
        return df, []
    blank = ~df["flash_attention_given"].to_numpy(dtype=bool)
    if not blank.any():
        return df, []
    fp8 = np.array([systems[h].hw.peak_fp8_tflops is not None for h in df["hardware"]], dtype=bool)
    fused = blank & (modern_shape(df) | fp8)
    out = df.copy()
    out["flash_attention"] = out["flash_attention"].to_numpy(dtype=bool) | fused
    note = (
        f"flash_attention not given for {int(blank.sum())} row(s): fused for {int(fused.sum())} (SwiGLU, grouped-"
        f"query, experts or latent attention, s >= {LONG_SEQ:,}, or FP8-capable hardware: the fused-attention "
        f"generation), unfused for {int((blank & ~fused).sum())} (Megatron's 2021 attention); stated defaults, "
        "give the column where the table knows"
    )
    return out, [note]
