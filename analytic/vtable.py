"""The validation table: a documented CSV schema of measured training runs.

One row per measured configuration.  Columns (units in the names):

=====================  ========  ===========================================================
column                 required  meaning
=====================  ========  ===========================================================
label                  no        row name (default: row number)
hardware               no*       hardware preset or spec file (* or --hardware/--system)
d_model, n_layers,     yes       model shape: hidden, layers, heads, sequence, vocabulary
n_heads, seq_len,
vocab
gpus, tp, pp           yes       GPUs, tensor- and pipeline-parallel sizes
dp                     no        data-parallel size; checked against gpus / (tp * pp)
micro_batch,           yes       sequences per micro-batch and per iteration
global_batch
interleave             no        virtual pipeline stages per GPU (default 1)
zero                   no        ZeRO stage 0-3 (default 0; FSDP FULL_SHARD = 3)
recompute              no        none | selective | full (default none; true/false read
                                 as full/none, activation checkpointing on/off)
seq_parallel           no        true/false (default false)
dp_overlap             no        DP/ZeRO comm overlapped with compute (blank: analytic.vdefaults)
flash_attention        no        fused attention, no s x s tensors kept (blank: analytic.vdefaults)
measured_iter_s        one of    measured seconds per iteration
measured_tflops_per_gpu  these   measured TFLOP/s per GPU, counted per ``tflops_convention``
measured_tokens_per_s_per_gpu    measured tokens/s per GPU
measured_tokens_per_s  (or)      tokens/s of the whole job (divided by gpus)
measured_samples_per_s (or)      sequences/s of the whole job (x seq_len / gpus)
measured_mfu           (or)      model FLOPs utilisation, a fraction of the row hardware's
                                 dense bf16 peak: TFLOP/s per GPU = mfu x peak, ``model``
                                 convention (6N + attention per token, PaLM's MFU)
tflops_convention      with      model (no recompute) | hardware (with recompute) |
                       tflops    megatron_eq3 (Narayanan et al. eq. 3)
group                  no        free tag used to pick calibration rows (e.g. full, seqsel)
source                 no        where the numbers come from
=====================  ========  ===========================================================

Model-shape and stack columns (all optional: ``model`` preset, ffn, kv_heads, mlp,
tied_embeddings, the MoE shape, the multi-head latent attention and multi-token prediction
columns q_lora_rank, kv_lora_rank, qk_rope_head_dim, mtp_layers, cp, cp_kind, ep, precision, master_weights, schedule,
distributed_optimizer, tp_comm_overlap) are described in :mod:`analytic.vshape`; with a
``model`` preset the shape columns above may be left out.  ``dp`` is checked against
gpus / (tp x cp x pp).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from calib.analytic import vshape as VS
from calib.analytic.formulas import RECOMPUTE_NAMES
from calib.analytic.specs import ModelColumns

from calib.core.errors import InputError

MEASURES = ("measured_iter_s", "measured_tflops_per_gpu", "measured_tokens_per_s_per_gpu")
CONVENTIONS = ("model", "hardware", "megatron_eq3")
INT_REQUIRED = (
    "d_model",
    "n_layers",
    "n_heads",
    "seq_len",
    "vocab",
    "gpus",
    "tp",
    "pp",
    "micro_batch",
    "global_batch",
)
DEFAULTS = {
    "interleave": 1, "zero": 0, "recompute": "none", "seq_parallel": False, "dp_overlap": False,
    "flash_attention": False,
}  # fmt: skip
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f", ""}


def _ints(df: pd.DataFrame, col: str, where: str) -> pd.Series:
    vals = pd.to_numeric(df[col], errors="coerce")
    bad = ~np.isfinite(vals.to_numpy(float)) | (vals < 0) | (vals > 2.0**53) | (vals != vals.round())
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(
            where, f"row {i + 1}: column '{col}' must be a non-negative integer, got '{df[col].iloc[i]}'"
        )
    return vals.astype("int64")


def _bools(df: pd.DataFrame, col: str, where: str) -> pd.Series:
    text = df[col].astype(str).str.strip().str.lower().replace({"nan": "", "none": ""})
    bad = ~text.isin(_TRUE | _FALSE)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(where, f"row {i + 1}: column '{col}' must be true/false, got {df[col].iloc[i]!r}")
    return text.isin(_TRUE)


def normalise(df: pd.DataFrame, where: str | Path) -> pd.DataFrame:
    """Check a canonical table and fill defaults; raise InputError naming row and column."""
    where = str(where)
    if df.empty:
        raise InputError(where, "the table has no rows")
    df = VS.fill_presets(df, where)
    missing = [c for c in INT_REQUIRED if c not in df.columns]
    if missing:
        raise InputError(where, f"missing column(s) {', '.join(missing)} (the schema is in docs/analytic.md)")
    out = df.copy()
    # blank flash_attention / dp_overlap are decided once the row's hardware is known (analytic.vdefaults)
    given = {
        c: ~VS._blank(out[c] if c in out.columns else pd.Series(np.nan, index=out.index))
        for c in ("flash_attention", "dp_overlap")
    }
    for col, default in DEFAULTS.items():
        if col not in out.columns:
            out[col] = default
        else:
            out[col] = out[col].where(out[col].notna() & (out[col].astype(str).str.strip() != ""), default)
    for col in INT_REQUIRED + ("interleave", "zero"):
        out[col] = _ints(out, col, where)
    for col in INT_REQUIRED + ("interleave",):
        if (out[col] < 1).any():
            i = int(np.flatnonzero((out[col] < 1).to_numpy())[0])
            raise InputError(where, f"row {i + 1}: column '{col}' must be at least 1")
    out["recompute"] = out["recompute"].astype(str).str.strip().str.lower()
    # "activation checkpointing: yes/no" as tables print it: full recompute or none
    # (not 0/1: a number could mean a recompute code)
    flags = dict.fromkeys(("true", "yes", "y", "t"), "full") | dict.fromkeys(
        ("false", "no", "n", "f"), "none"
    )
    out["recompute"] = out["recompute"].replace(flags)
    bad = ~out["recompute"].isin(RECOMPUTE_NAMES)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputError(
            where,
            f"row {i + 1}: recompute must be one of {', '.join(RECOMPUTE_NAMES)}, got {df['recompute'].iloc[i]!r}",
        )
    for col in ("seq_parallel", "dp_overlap", "flash_attention"):
        out[col] = _bools(out, col, where)
    for c, g in given.items():
        out[c + "_given"] = g.to_numpy(dtype=bool)
    out = VS.normalise_stack(out, where, _ints, _bools)
    if "dp" in out.columns and out["dp"].notna().any():
        dp = _ints(out.fillna({"dp": 0}), "dp", where)
        want = out["gpus"] // (out["tp"] * out["cp"] * out["pp"])
        bad = (dp > 0) & (dp != want)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            what = "tp x cp x pp" if out["cp"].iloc[i] > 1 else "tp x pp"
            raise InputError(where, f"row {i + 1}: dp={dp.iloc[i]} but gpus / ({what}) = {want.iloc[i]}")
    out = _derived_measures(out, where)
    present = [c for c in MEASURES if c in out.columns]
    if not present:
        raise InputError(where, f"no measured column: give one of {', '.join(MEASURES)}")
    for c in present:
        out[c] = _measure(out[c], c, where)
    has = out[present].notna()
    if not has.any(axis=1).all():
        i = int(np.flatnonzero(~has.any(axis=1).to_numpy())[0])
        raise InputError(where, f"row {i + 1}: no positive measured value in {', '.join(present)}")
    for c in MEASURES:
        if c not in out.columns:
            out[c] = np.nan
    if out["measured_tflops_per_gpu"].notna().any():
        conv = out.get("tflops_convention", pd.Series("", index=out.index)).astype(str).str.strip()
        bad = out["measured_tflops_per_gpu"].notna() & ~conv.isin(CONVENTIONS)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(
                where,
                f"row {i + 1}: measured_tflops_per_gpu needs tflops_convention in {', '.join(CONVENTIONS)}",
            )
        out["tflops_convention"] = conv
    else:
        out["tflops_convention"] = ""
    if "label" not in out.columns:
        out["label"] = [f"row{i + 1}" for i in range(len(out))]
    out["label"] = out["label"].astype(str)
    for col in ("hardware", "group", "source"):
        if col not in out.columns:
            out[col] = ""
        out[col] = out[col].astype(object).where(out[col].notna(), "").astype(str)
    out["hardware"] = _spec_paths(out["hardware"], Path(where).parent)
    _check_hardware(out, where)
    return out.reset_index(drop=True)


def _measure(col: pd.Series, name: str, where: str) -> pd.Series:
    """A measured column as numbers: blank cells are absent; text that is not a number, or a
    value outside :data:`MEASURE_RANGE`, is an error naming row and column (never dropped)."""
    vals = pd.to_numeric(col, errors="coerce")
    text = col.astype(object).where(col.notna(), "").astype(str).str.strip()
    given = ~text.isin(("", "nan", "None"))
    x = vals.to_numpy(float)
    lo, hi = MEASURE_RANGE
    bad = given.to_numpy() & ~(np.isfinite(x) & (x >= lo) & (x <= hi))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            where, f"row {i + 1}: column '{name}' must be a number in {lo:g}..{hi:g}, got '{text.iloc[i]}'"
        )
    return vals


#: what a measured seconds, TFLOP/s or tokens/s per GPU can be (beyond it: a typo or a unit slip)
MEASURE_RANGE = (1e-9, 1e12)


#: measurements converted to the three above (see the module docstring)
DERIVED = ("measured_tokens_per_s", "measured_samples_per_s", "measured_mfu")


def _derived_measures(out: pd.DataFrame, where: str) -> pd.DataFrame:
    """Job-wide tokens/s or sequences/s -> tokens/s per GPU; MFU -> model TFLOP/s per GPU at
    the row hardware's peak.  A row's own per-GPU value wins over a derived one."""
    from calib.analytic.specs import load_hardware

    cols = [c for c in DERIVED if c in out.columns]
    if not cols:
        return out
    out = out.copy()
    vals = {c: pd.to_numeric(out[c], errors="coerce") for c in cols}
    for c in cols:
        text = out[c].astype(object).where(out[c].notna(), "").astype(str).str.strip()
        bad = vals[c].isna() & ~text.isin(("", "nan", "None"))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(where, f"row {i + 1}: column '{c}' must be a number, got '{text.iloc[i]}'")
    gpus = out["gpus"].astype(float)
    tok = pd.Series(np.nan, index=out.index)
    if "measured_tokens_per_s" in vals:
        tok = tok.fillna(vals["measured_tokens_per_s"] / gpus)
    if "measured_samples_per_s" in vals:
        tok = tok.fillna(vals["measured_samples_per_s"] * out["seq_len"].astype(float) / gpus)
    base = out["measured_tokens_per_s_per_gpu"] if "measured_tokens_per_s_per_gpu" in out else tok * np.nan
    out["measured_tokens_per_s_per_gpu"] = pd.to_numeric(base, errors="coerce").fillna(tok)
    if "measured_mfu" in vals:
        mfu = vals["measured_mfu"]
        bad = mfu.notna() & ((mfu <= 0) | (mfu > 1))
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise InputError(
                where, f"row {i + 1}: measured_mfu is a fraction of peak in (0, 1], got {mfu.iloc[i]:g}"
            )
        hw = (
            out.get("hardware", pd.Series("", index=out.index))
            .astype(object)
            .fillna("")
            .astype(str)
            .str.strip()
        )
        own = out.get("measured_tflops_per_gpu", pd.Series(np.nan, index=out.index))
        use = mfu.notna() & pd.to_numeric(own, errors="coerce").isna()
        if (use & (hw == "")).any():
            i = int(np.flatnonzero((use & (hw == "")).to_numpy())[0])
            raise InputError(
                where, f"row {i + 1}: measured_mfu needs the row's hardware (its peak is the denominator)"
            )
        peak = {}
        for h in hw[use].unique():
            try:
                peak[h] = float(load_hardware(h).peak_tflops)
            except InputError as exc:
                i = int(np.flatnonzero((hw == h).to_numpy())[0])
                raise InputError(where, f"row {i + 1}: column 'hardware': {exc.problem}") from None
        tflops = (mfu * hw.map(peak)).where(use)
        out["measured_tflops_per_gpu"] = pd.to_numeric(own, errors="coerce").fillna(tflops)
        conv = out.get("tflops_convention", pd.Series("", index=out.index)).fillna("").astype(str)
        out["tflops_convention"] = conv.where(~use, "model")
    return out


def _spec_paths(hw: pd.Series, table_dir: Path) -> pd.Series:
    """A hardware spec file named by a relative path is read next to the table when it is
    not found from the working directory (a table shipped with its cluster's YAML)."""
    out = hw.copy()
    for h in hw.unique():
        p = Path(h)
        spec = bool(h) and p.suffix.lower() in (".yaml", ".yml", ".json") and not p.is_absolute()
        if spec and not p.exists() and (table_dir / p).exists():
            out[hw == h] = str(table_dir / p)
    return out


def _check_hardware(out: pd.DataFrame, where: str) -> None:
    """Every named hardware must load: a bad value names the file, row and column."""
    from calib.analytic.specs import load_hardware

    for h in out["hardware"].unique():
        if not h:
            continue
        try:
            load_hardware(h)
        except InputError as exc:
            i = int(np.flatnonzero((out["hardware"] == h).to_numpy())[0])
            raise InputError(where, f"row {i + 1}: column 'hardware': {exc.problem}") from None


def model_columns(df: pd.DataFrame) -> ModelColumns:
    """Dense per-row shapes (one MLP kind, embedding tying and dropout: the first row's);
    :func:`analytic.vshape.row_models` groups a mixed table."""
    if "mlp" not in df.columns:
        return VS.columns_of(df)
    first = df.iloc[0]
    drop = bool(first["dropout"]) if "dropout" in df.columns else True
    return VS.columns_of(df, str(first["mlp"]), bool(first["tied_embeddings"]), drop)


def read_table(path: str | Path, fmt: str = "auto") -> tuple[pd.DataFrame, str]:
    """Read a canonical table or one of the published tables; return (table, format name)."""
    from calib.analytic import published

    path = Path(path)
    try:
        raw = pd.read_csv(path)
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise InputError(
            path, f"unreadable CSV: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    try:
        name = published.detect(raw) if fmt == "auto" else fmt
    except InputError as exc:
        raise InputError(path, exc.problem) from None
    if name != "canonical":
        raw = published.adapt(name, raw, path)
    return normalise(raw, path), name
