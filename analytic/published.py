"""Adapters: the four published tables in ../shared/data/published -> the validation schema.

Each adapter states what the table does not say and where the missing knob comes from.
The three Megatron tables (2020-2022) ran Megatron's own unfused attention (scaled masked
softmax kernels; FlashAttention is of May 2022, and Korthikanti et al.'s selective
recompute exists because the s x s scores are kept): ``flash_attention`` false, stated.

* ``sc21``  Megatron SC21 Table 1.  Micro-batch, interleaving (layers per virtual stage)
  and the DDP implementation per model from NVIDIA/Megatron-LM examples/sc21/
  run_table_1.sh (commit 79a3bb6b): torch DDP (PP = 1 rows) overlaps the gradient
  all-reduce with backward, Megatron's "local" DDP does not.  All rows use full activation
  recomputation and count FLOPs with eq. 3.
* ``korthikanti``  Korthikanti et al. 2022 Table 5: each model gives two rows, group
  ``full`` (full recompute, no SP) and ``seqsel`` (sequence parallelism + selective
  recompute).  Interleaving 3 for 175B/530B and 1 for 22B/1T as in Calculon's
  reproduction inputs (calculon-ai/calculon validation/seqsel/tab5/*.json).
* ``megatron2020``  Megatron-LM README 2020 TP/DP table: tp = model-parallel partitions,
  dp = gpus / tp, one micro-batch per iteration (no gradient accumulation in 2020
  Megatron), full activation checkpointing (assumed: the 2020 GPT-2 example scripts set
  --checkpoint-activations); DGX-2 rows on the ``dgx-2`` spec, DGX-A100 rows on ``tg40``
  (A100 40GB, the only A100 of 2020).
* ``mosaicml``  llm-foundry FSDP benchmark: each row's own ``Sharding Strategy``
  (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, NO_SHARD = DDP, i.e. ZeRO-0; PyTorch
  FSDP docs; HYBRID_SHARD / _HYBRID_SHARD_ZERO2 = ZeRO-3 / ZeRO-2 sharded inside a node
  and replicated across nodes, analytic.hybrid) with prefetch / bucketed overlap
  (dp_overlap), activation checkpointing = full recompute, triton flash attention (the mpt
  yamls' attn_impl), model shapes of the mpt-* presets, and the ``GPU`` column mapped by
  exact name (``_MOSAIC_GPU``).  An unknown GPU or sharding strategy, or CPU-offloaded
  activations, is an error naming the value.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from calib.analytic.specs import load_hardware, load_model

from calib.core.errors import InputError

FORMATS = ("canonical", "sc21", "korthikanti", "megatron2020", "mosaicml")

_SIGNATURES = {
    "sc21": {"model_label", "achieved_tflops_per_gpu", "tensor_parallel", "pipeline_parallel"},
    "korthikanti": {"iter_time_full_recompute_s", "iter_time_seqpar_selective_s", "microbatch_size"},
    "megatron2020": {"iteration_time_ms", "model_parallel_partitions", "num_gpus"},
    "mosaicml": {"Throughput (T/s/GPU)", "MicroBatchSize", "GradAccum", "Model"},
    "canonical": {"d_model", "n_layers", "gpus", "tp", "pp"},
}

# examples/sc21/run_table_1.sh: label -> (micro-batch, layers per virtual stage or 0, torch DDP)
_SC21_RUN = {
    "1.7B": (16, 0, True), "3.6B": (16, 0, True), "7.5B": (16, 0, True), "18B": (8, 0, True),
    "39B": (4, 0, False), "76B": (2, 5, False), "145B": (2, 5, False), "310B": (1, 3, False),
    "530B": (1, 1, False), "1T": (1, 0, False),
}  # fmt: skip
_KORTHIKANTI_INTERLEAVE = {"22B": 1, "175B (GPT-3)": 3, "530B (MT-NLG)": 3, "1T": 1}


def detect(df: pd.DataFrame) -> str:
    cols = set(df.columns)
    for name, need in _SIGNATURES.items():
        if need <= cols:
            return name
    if {"model", "gpus", "tp", "pp"} <= cols:  # the schema with a model preset column (analytic.vshape)
        return "canonical"
    raise InputError(
        None,
        "unrecognised table: neither the validation schema (d_model, n_layers, gpus, tp, pp, ...) "
        "nor a published table (" + ", ".join(FORMATS[1:]) + ")",
    )


def adapt(name: str, df: pd.DataFrame, where: str | Path) -> pd.DataFrame:
    if name not in _ADAPTERS:
        raise InputError("format", f"unknown table format '{name}' (known: {', '.join(FORMATS)})")
    missing = sorted(_SIGNATURES[name] - set(df.columns))
    if missing:
        raise InputError(where, f"not a '{name}' table: missing column(s) {', '.join(missing)}")
    if df.empty:
        raise InputError(where, "the table has no rows")
    try:
        return _ADAPTERS[name](_numeric(df, _NUMERIC.get(name, ())))
    except InputError as exc:  # an adapter's verdict on a value, said of this file
        raise InputError(where, exc.problem) from None
    except KeyError as exc:
        raise InputError(where, f"'{name}' table: missing column or unknown row key {exc}") from None


#: columns an adapter does arithmetic on: checked as positive finite numbers first, so a bad
#: value is named by row and column rather than failing inside the arithmetic
_NUMERIC = {
    "sc21": ("num_layers", "pipeline_parallel", "tensor_parallel", "num_gpus", "global_batch_size"),
    "megatron2020": ("num_gpus", "model_parallel_partitions", "global_batch_size", "iteration_time_ms"),
}


def _numeric(df: pd.DataFrame, cols) -> pd.DataFrame:
    """``df`` with text columns' empty cells as "" (an adapter names them, not pandas) and
    ``cols`` checked as positive finite numbers."""
    out = df.copy()
    text = out.select_dtypes(include=["object", "string"]).columns
    out[text] = out[text].astype(object).where(out[text].notna(), "")
    for col in cols:
        if col not in out.columns:
            raise KeyError(col)
        vals = pd.to_numeric(out[col], errors="coerce")
        bad = ~np.isfinite(vals.to_numpy(float)) | (vals.to_numpy(float) <= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(
                None, f"row {i + 1}: column '{col}' must be a positive number, got '{df[col].iloc[i]}'"
            )
        out[col] = vals
    return out


def _sc21(df: pd.DataFrame) -> pd.DataFrame:
    label = df["model_label"].astype(str)
    unknown = sorted(set(label) - set(_SC21_RUN))
    if unknown:
        raise KeyError(f"model_label {unknown[0]} (no run_table_1.sh settings)")
    run = label.map(_SC21_RUN)
    mb = run.map(lambda r: r[0])
    lpv = run.map(lambda r: r[1])
    layers_per_stage = df["num_layers"] // df["pipeline_parallel"]
    interleave = np.where(lpv > 0, layers_per_stage // lpv.where(lpv > 0, 1), 1)
    return pd.DataFrame({
        "label": "sc21-" + label,
        "hardware": "dgx-a100-80gb",
        "d_model": df["hidden_size"], "n_layers": df["num_layers"], "n_heads": df["attention_heads"],
        "seq_len": df["seq_len"], "vocab": df["vocab_size"],
        "gpus": df["num_gpus"], "tp": df["tensor_parallel"], "pp": df["pipeline_parallel"],
        "dp": df["num_gpus"] // (df["tensor_parallel"] * df["pipeline_parallel"]),
        "micro_batch": mb, "global_batch": df["global_batch_size"], "interleave": interleave,
        "zero": 0, "recompute": "full", "seq_parallel": False, "dp_overlap": run.map(lambda r: r[2]),
        "flash_attention": False,
        "measured_tflops_per_gpu": df["achieved_tflops_per_gpu"], "tflops_convention": "megatron_eq3",
        "group": np.where(df["pipeline_parallel"] > 1, "pp", "tp-only"),
        "source": df["source"],
    })  # fmt: skip


def _korthikanti(df: pd.DataFrame) -> pd.DataFrame:
    base = pd.DataFrame({
        "hardware": "dgx-a100-80gb",
        "d_model": df["hidden_size"], "n_layers": df["num_layers"], "n_heads": df["attention_heads"],
        "seq_len": df["seq_len"], "vocab": df["vocab_size"],
        "gpus": df["num_gpus"], "tp": df["tensor_parallel"], "pp": df["pipeline_parallel"],
        "dp": df["data_parallel"], "micro_batch": df["microbatch_size"], "global_batch": df["global_batch_size"],
        "interleave": df["model"].astype(str).map(_KORTHIKANTI_INTERLEAVE).fillna(1).astype(int),
        "zero": 0, "dp_overlap": False, "flash_attention": False, "source": df["source"],
    })  # fmt: skip
    short = df["model"].astype(str).str.split(" ").str[0]
    full = base.assign(label="k22-" + short + "-full", recompute="full", seq_parallel=False,
                       measured_iter_s=df["iter_time_full_recompute_s"], group="full")  # fmt: skip
    seqsel = base.assign(label="k22-" + short + "-seqsel", recompute="selective", seq_parallel=True,
                         measured_iter_s=df["iter_time_seqpar_selective_s"], group="seqsel")  # fmt: skip
    return pd.concat([full, seqsel], ignore_index=True)


def _megatron2020(df: pd.DataFrame) -> pd.DataFrame:
    system = df["system"].astype(str)
    v100, a100 = system.str.contains("DGX-2"), system.str.contains("A100")
    if not (v100 | a100).all():
        bad = system[~(v100 | a100)].iloc[0]
        raise InputError(
            None, f"column 'system': unknown value '{bad}' (known: a DGX-2 or a DGX-A100 system)"
        )
    hardware = np.where(v100, "dgx-2", "tg40")
    tp = df["model_parallel_partitions"]
    dp = df["num_gpus"] // tp
    return pd.DataFrame({
        "label": "mlm2020-" + df["case"].astype(str) + "-" + df["num_gpus"].astype(str) + "gpu-" + np.where(system.str.contains("DGX-2"), "v100", "a100"),
        "hardware": hardware,
        "d_model": df["hidden_size"], "n_layers": df["num_layers"], "n_heads": df["attention_heads"],
        "seq_len": df["seq_len"], "vocab": df["vocab_size"],
        "gpus": df["num_gpus"], "tp": tp, "pp": 1, "dp": dp,
        "micro_batch": df["global_batch_size"] // dp, "global_batch": df["global_batch_size"],
        "zero": 0, "recompute": "full", "seq_parallel": False, "dp_overlap": False, "flash_attention": False,
        "measured_iter_s": df["iteration_time_ms"] / 1000.0,
        "group": np.where(df["num_gpus"] > 8, "dp", "tp"),
        "source": df["source"],
    })  # fmt: skip


#: llm-foundry's GPU names -> hardware presets (exact names; anything else is an error).
#: The table's sections say "A100 40GB / 80GB with 1600 Gbps node-node interconnect":
#: DGX A100 nodes of 8 GPUs and 8 x 200 Gb/s NICs (tg40 = dgx-a100-40gb, dgx-a100-80gb).
_MOSAIC_GPU = {"a100_40gb": "dgx-a100-40gb", "a100_80gb": "dgx-a100-80gb", "h100_80gb": "dgx-h100"}
#: FSDP ShardingStrategy -> ZeRO stage (PyTorch FSDP docs: FULL_SHARD shards parameters,
#: gradients and optimizer states; SHARD_GRAD_OP gradients and optimizer states; NO_SHARD
#: is DDP).  HYBRID_SHARD / _HYBRID_SHARD_ZERO2 shard inside a node and replicate across
#: nodes (analytic.hybrid): the shard group is the preset's GPUs per node (FSDP's default).
_MOSAIC_SHARDING = {
    "FULL_SHARD": 3,
    "SHARD_GRAD_OP": 2,
    "NO_SHARD": 0,
    "HYBRID_SHARD": 3,
    "_HYBRID_SHARD_ZERO2": 2,
}
_MOSAIC_HYBRID = {"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"}
_MOSAIC_PRECISION = {"bf16", "amp_bf16", "fp16", "amp_fp16", "amp_fp8", "fp8"}
#: llm-foundry's FP8 runs (Transformer Engine linear layers, ``amp_fp8``) -> precision fp8
_MOSAIC_FP8 = {"amp_fp8", "fp8"}


def _gpus_per_node(preset: str) -> int:
    return int(load_hardware(preset).gpus_per_node)


def _known(values: pd.Series, known, column: str) -> None:
    bad = sorted(set(values) - set(known))
    if bad:
        raise InputError(
            None, f"column '{column}': unknown value '{bad[0]}' (known: {', '.join(sorted(known))})"
        )


def _mosaicml(df: pd.DataFrame) -> pd.DataFrame:
    names = "mpt-" + df["Model"].astype(str).str.lower()
    specs = {n: load_model(n) for n in names.unique()}
    shape = {
        f: names.map(lambda n, f=f: getattr(specs[n], f)) for f in ("d_model", "n_layers", "n_heads", "vocab")
    }
    gpu = df["GPU"].astype(str).str.strip()
    _known(gpu, _MOSAIC_GPU, "GPU")
    sharding = (
        df["Sharding Strategy"].astype(str).str.strip().str.upper()
        if "Sharding Strategy" in df
        else pd.Series("FULL_SHARD", index=df.index)
    )
    _known(sharding, _MOSAIC_SHARDING, "Sharding Strategy")
    precision = pd.Series("bf16", index=df.index)
    if "Precision" in df:
        given = df["Precision"].astype(str).str.strip().str.lower()
        _known(given, _MOSAIC_PRECISION, "Precision")
        precision = given.map(lambda v: "fp8" if v in _MOSAIC_FP8 else "bf16")
    if "Activation CPUOffload" in df:
        off = df["Activation CPUOffload"].astype(str).str.strip().str.lower()
        _known(off, {"false", "0"}, "Activation CPUOffload")
    ckpt_text = df["Activation Checkpointing"].astype(str).str.strip().str.lower()
    _known(ckpt_text, {"true", "false", "1", "0"}, "Activation Checkpointing")
    ckpt = ckpt_text.isin({"true", "1"})
    return pd.DataFrame({
        "label": "mosaic-" + df["Model"].astype(str) + "-s" + df["SeqLen (T)"].astype(str) + "-" + df["# GPUs"].astype(str) + "x" + gpu,
        "hardware": gpu.map(_MOSAIC_GPU),
        **shape, "seq_len": df["SeqLen (T)"],
        "gpus": df["# GPUs"], "tp": 1, "pp": 1, "dp": df["# GPUs"],
        "micro_batch": df["MicroBatchSize"], "global_batch": df["GlobalBatchSize"],
        "zero": sharding.map(_MOSAIC_SHARDING), "recompute": np.where(ckpt, "full", "none"),
        "shard_group": np.where(sharding.isin(_MOSAIC_HYBRID), gpu.map(_MOSAIC_GPU).map(_gpus_per_node), 0),
        "seq_parallel": False, "dp_overlap": True, "flash_attention": True, "precision": precision,
        "zero_impl": "fsdp",
        "measured_tokens_per_s_per_gpu": df["Throughput (T/s/GPU)"],
        "group": gpu, "source": df["source"],
    })  # fmt: skip


_ADAPTERS = {
    "canonical": lambda df: df,
    "sc21": _sc21,
    "korthikanti": _korthikanti,
    "megatron2020": _megatron2020,
    "mosaicml": _mosaicml,
}
