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


def _generation(mlp, kv_heads, n_heads, n_experts, kv_lora_rank, seq_len, fp8) -> dict[str, np.ndarray]:
    """The fused-attention generation's marks (module docstring), each a boolean array: the one
    rule for table rows and for a model on a machine."""
    kv = np.asarray(kv_heads)
    return {
        "SwiGLU": np.asarray(mlp) == "swiglu",
        "grouped-query attention": (kv > 0) & (kv < np.asarray(n_heads)),
        "experts": np.asarray(n_experts) > 0,
        "latent attention": np.asarray(kv_lora_rank) > 0,
        f"s >= {LONG_SEQ:,}": np.asarray(seq_len) >= LONG_SEQ,
        "FP8-capable hardware": np.asarray(fp8, dtype=bool),
    }


def zero3_overlaps(zero) -> np.ndarray:
    """Where a blank DP overlap is on: ZeRO-3 (DeepSpeed stage 3 and FSDP prefetch by default)."""
    return np.asarray(zero) == 3


def fused_attention_reason(model, hw) -> str | None:
    """Why ``model`` on ``hw`` belongs to the fused-attention generation, or None: the same rule
    for a prediction or a search that is not told as for a blank table column."""
    marks = _generation(model.mlp, model.kv_heads or 0, model.n_heads, model.n_experts, model.kv_lora_rank or 0,
                        model.seq_len, hw is not None and hw.peak_fp8_tflops is not None)  # fmt: skip
    return ", ".join(w for w, on in marks.items() if on) or None


def settle(df: pd.DataFrame, systems: dict) -> tuple[pd.DataFrame, list[str]]:
    """``df`` with every blank ``flash_attention`` and ``dp_overlap`` decided (module
    docstring), and a note per column saying how many rows were defaulted each way;
    ``systems`` maps each hardware value to its System."""
    out, notes = df, []
    if "flash_attention_given" in df.columns and not df["flash_attention_given"].all():
        blank = ~df["flash_attention_given"].to_numpy(dtype=bool)
        fp8 = df["hardware"].map({h: s.hw.peak_fp8_tflops is not None for h, s in systems.items()})
        marks = _generation(df["mlp"], df["kv_heads"], df["n_heads"], df["n_experts"],
                            df.get("kv_lora_rank", pd.Series(0, index=df.index)), df["seq_len"], fp8)  # fmt: skip
        on = blank & np.logical_or.reduce(list(marks.values()))
        out = out.assign(flash_attention=out["flash_attention"].to_numpy(dtype=bool) | on)
        notes.append(
            f"flash_attention not given for {int(blank.sum())} row(s): fused for {int(on.sum())} (SwiGLU, grouped-"
            f"query, experts or latent attention, s >= {LONG_SEQ:,}, or FP8-capable hardware: the fused-attention "
            f"generation), unfused for {int((blank & ~on).sum())} (Megatron's 2021 attention); stated defaults, "
            "give the column where the table knows"
        )
    if "dp_overlap_given" in df.columns and not df["dp_overlap_given"].all():
        blank = ~df["dp_overlap_given"].to_numpy(dtype=bool)
        on = blank & zero3_overlaps(df["zero"])
        out = out.assign(dp_overlap=out["dp_overlap"].to_numpy(dtype=bool) | on)
        notes.append(
            f"dp_overlap not given for {int(blank.sum())} row(s): on for the {int(on.sum())} ZeRO-3 row(s) (DeepSpeed "
            "stage 3 and FSDP prefetch by default; the hidden share is analytic.zero_overlap's), off for "
            f"{int((blank & ~on).sum())}; stated defaults, give the column where the table knows"
        )
    return out, notes
