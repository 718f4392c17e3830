"""Predictions against measured tables, with honest held-out errors.

The model's compute efficiency (the GEMM-efficiency curve, which end-to-end times cannot
separate from k1 and k2) is fitted by least squares on log(predicted / measured) over a
*stated* subset of rows; errors are reported on the other rows only.  Three splits:

* ``calibrate_on``: row numbers (1-based), labels, ``group`` tags or ``every-third``
  (rows 1, 4, 7, ... by position, fixed before any error is seen),
* ``holdout``: a seeded random fraction held out,
* leave-one-out: every row is predicted by a fit to all the others.

``fit="none"`` evaluates the calibration as given (no row is used for fitting).  The
fits themselves (and the warning for a parameter on its bound) are in :mod:`analytic.vfit`.
Every result also says which rows the model predicts not to fit in memory and the term
that overflows (all rows of a measured table trained, so each is a model error), the
held-out errors without the fit, and, when one machine replaces the table's hardware
column, the override per row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from calib.analytic import fit_interval as FI
from calib.analytic import formulas as F
from calib.analytic import vfit as VF  # noqa: F401 - the fits, re-exported for callers
from calib.analytic.machine import default_calibration
from calib.analytic.memory import overflow_term
from calib.analytic.precision import fp8_rate_text
from calib.analytic.specs import ModelSpec, load_hardware
from calib.analytic.strategy import Strategies, check_config, valid_mask
from calib.analytic.timemodel import System, comm_times, evaluate
from calib.analytic.vdefaults import settle as settle_defaults
from calib.analytic.vfit import FIT_PARAMS, FITS, fit
from calib.analytic.vshape import columns_of, row_models
from calib.analytic.vsummary import by_group, extrapolation_notes
from calib.analytic.vtable import model_columns

from calib.core.errors import InputError


@dataclass(frozen=True)
class Validation:
    """Per-row results, the summary over held-out rows, and the fitted parameters."""

    rows: pd.DataFrame
    summary: dict
    params: dict
    split: str
    #: the fitted machine per hardware (one fit: the calibrate-on / hold-out split; None
    #: for leave-one-out, which fits once per row, and for ``fit="none"``)
    systems: dict | None = None


def _col(df: pd.DataFrame, name: str, default) -> np.ndarray:
    return df[name].to_numpy() if name in df.columns else np.full(len(df), default)


def strategies_of(df: pd.DataFrame) -> Strategies:
    from calib.analytic.bubble import SCHEDULES
    from calib.analytic.context import CP_KINDS

    cp = _col(df, "cp", 1)
    codes = {
        "cp_kind": pd.Series(_col(df, "cp_kind", "ring")).map(CP_KINDS.index).to_numpy(),
        "schedule": pd.Series(_col(df, "schedule", "1f1b")).map(SCHEDULES.index).to_numpy(),
        "master": (pd.Series(_col(df, "master_weights", "fp32")) == "bf16").to_numpy(),
        "zero_impl": (pd.Series(_col(df, "zero_impl", "deepspeed")) == "fsdp").to_numpy().astype(int),
    }
    return Strategies.of(
        tp=df["tp"].to_numpy(), pp=df["pp"].to_numpy(), dp=(df["gpus"] // (df["tp"] * cp * df["pp"])).to_numpy(),
        micro_batch=df["micro_batch"].to_numpy(), global_batch=df["global_batch"].to_numpy(),
        interleave=df["interleave"].to_numpy(), zero=df["zero"].to_numpy(),
        recompute=df["recompute"].map(F.RECOMPUTE_NAMES.index).to_numpy(),
        seq_parallel=df["seq_parallel"].to_numpy(), dp_overlap=df["dp_overlap"].to_numpy(),
        flash_attention=df["flash_attention"].to_numpy(), cp=cp, ep=_col(df, "ep", 1),
        fp8=_col(df, "precision", "bf16") == "fp8", dist_opt=_col(df, "distributed_optimizer", False),
        tp_overlap=_col(df, "tp_comm_overlap", False), shard=_col(df, "shard_group", 0), **codes,
    )  # fmt: skip


def model_groups(df: pd.DataFrame) -> list:
    """(row indices, model) groups: dense rows as per-row ModelColumns, a MoE shape as a ModelSpec."""
    if "n_experts" not in df.columns:
        return [(np.arange(len(df)), model_columns(df))]
    return row_models(df)


def check_rows(df: pd.DataFrame, where: str, systems: dict | None = None) -> None:
    """Every row must be a valid strategy; name the first bad row and its rule."""
    from calib.analytic.modern import check_modern
    from calib.analytic.vshape import spec_of

    for idx, model in model_groups(df):
        sub = df.iloc[idx]
        st = strategies_of(sub)
        ok = valid_mask(model, st) & (sub["gpus"] % (sub["tp"] * st.cp * sub["pp"]) == 0).to_numpy()
        fp8_ok = np.ones(len(sub), dtype=bool)
        if systems is not None:
            fp8_ok = ~st.fp8 | np.array([bool(systems[h].hw.peak_fp8_tflops) for h in sub["hardware"]])
        if (ok & fp8_ok).all():
            continue
        j = int(np.flatnonzero(~(ok & fp8_ok))[0])
        i, r = int(idx[j]), sub.iloc[j]
        spec = spec_of(r) if "n_experts" in df.columns else ModelSpec(str(r["label"]), *(int(r[c]) for c in (
            "d_model", "n_layers", "n_heads", "seq_len", "vocab")))  # fmt: skip
        try:
            check_config(spec, int(r["gpus"]), int(r["tp"]), int(r["pp"]), int(r["micro_batch"]), int(r["global_batch"]),
                         int(r["interleave"]), int(r["zero"]), F.RECOMPUTE_NAMES.index(r["recompute"]),
                         bool(r["seq_parallel"]), int(st.cp[j]), int(st.shard[j]), int(st.zero_impl[j]))  # fmt: skip
            hw = systems[r["hardware"]].hw if systems is not None else None
            check_modern(spec, hw, st, j)
        except InputError as exc:
            raise InputError(where, f"row {i + 1} ({r['label']}): {exc.problem}") from None
        raise InputError(where, f"row {i + 1} ({r['label']}): invalid strategy")


def hardware_conflicts(df: pd.DataFrame, base: System) -> dict[str, int]:
    """Table hardware values that are not ``base``'s hardware -> their row counts."""
    out = {}
    for h, n in df["hardware"].value_counts(sort=False).items():
        if h and load_hardware(h).name != base.hw.name:
            out[str(h)] = int(n)
    return out


def systems_for(df: pd.DataFrame, base: System | None, where: str) -> dict[str, System]:
    """One System per hardware named in the table (or ``base`` for every row)."""
    if base is not None:
        return {h: base for h in df["hardware"].unique()}
    if (df["hardware"] == "").any():
        i = int(np.flatnonzero((df["hardware"] == "").to_numpy())[0])
        raise InputError(where, f"row {i + 1}: no hardware column value; give a hardware spec or a system")
    out = {}
    for h in df["hardware"].unique():
        hw = load_hardware(h)
        out[h] = System(default_calibration(hw), hw)
    return out


@dataclass(frozen=True)
class Table:
    """A normalised table prepared once for repeated evaluation (fits call it many times)."""

    df: pd.DataFrame
    groups: tuple  # (hardware, row indices, ModelColumns, Strategies) per hardware
    measured: np.ndarray
    inverse: np.ndarray  # True where the measured quantity is a rate: predicted = scale / iter_s
    scale: np.ndarray
    quantity: np.ndarray
    _comm: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, df: pd.DataFrame) -> Table:
        df = df.reset_index(drop=True)
        groups = []
        B = df["global_batch"].to_numpy(dtype=float)
        fl_model, fl_hw = np.zeros(len(df)), np.zeros(len(df))
        for idx_m, model in model_groups(df):
            fl_model[idx_m], fl_hw[idx_m] = _flops(model, df.iloc[idx_m], B[idx_m])
            for h in df["hardware"].iloc[idx_m].unique():
                idx = idx_m[(df["hardware"].iloc[idx_m] == h).to_numpy()]
                sub_model = (
                    model
                    if isinstance(model, ModelSpec)
                    else columns_of(  # the group's own flags
                        df.iloc[idx], model.mlp, model.tied_embeddings, model.dropout
                    )
                )
                groups.append((h, idx, sub_model, strategies_of(df.iloc[idx])))
        d, L, s, V = (df[c].to_numpy(dtype=float) for c in ("d_model", "n_layers", "seq_len", "vocab"))
        n = df["gpus"].to_numpy(dtype=float)
        flops = {"model": fl_model, "hardware": fl_hw, "megatron_eq3": F.megatron_eq3_flops(B, s, d, L, V)}
        conv = df["tflops_convention"].to_numpy()
        fl = np.select([conv == k for k in flops], list(flops.values()), default=np.nan)
        is_iter = df["measured_iter_s"].notna().to_numpy()
        is_tflops = ~is_iter & df["measured_tflops_per_gpu"].notna().to_numpy()
        measured = np.where(
            is_iter,
            df["measured_iter_s"],
            np.where(is_tflops, df["measured_tflops_per_gpu"], df["measured_tokens_per_s_per_gpu"]),
        )
        scale = np.where(is_tflops, fl / n / 1e12, B * s / n)
        quantity = np.where(is_iter, "iter_s", np.where(is_tflops, "tflops_per_gpu", "tokens_per_s_per_gpu"))
        return cls(df, tuple(groups), measured.astype(float), ~is_iter, scale, quantity)

    def subset(self, mask: np.ndarray) -> Table:
        return Table.of(self.df.loc[mask])

    def iter_s(self, systems: dict[str, System]) -> tuple[np.ndarray, np.ndarray]:
        it, oom, _ = self.evaluate(systems)
        return it, oom

    def evaluate(self, systems: dict[str, System]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(iteration s, predicted not to fit, the memory term that overflows or '') per row."""
        it = np.empty(len(self.df))
        oom = np.zeros(len(self.df), dtype=bool)
        term = np.full(len(self.df), "", dtype=object)
        for g, (h, idx, model, st) in enumerate(self.groups):
            system = systems[h]
            # compute fits keep the collectives: reuse their times per calibration
            # (keyed by identity, the objects held with the times so that no id is reused)
            key = (g, h, id(system.cal.collectives), id(system.cal.network), system.gpus_per_node)
            hit = self._comm.get(key)
            if hit is None or hit[0] is not system.cal.collectives or hit[1] is not system.cal.network:
                hit = self._comm[key] = (
                    system.cal.collectives,
                    system.cal.network,
                    comm_times(model, system, st),
                )
            r = evaluate(model, system, st, hit[2])
            it[idx] = r["iter_s"]
            oom[idx] = r["oom"]
            term[idx] = overflow_term(r, system.hw.hbm_bytes)
        return it, oom, term

    def predicted(self, systems: dict[str, System]) -> np.ndarray:
        it, _ = self.iter_s(systems)
        with np.errstate(over="ignore", divide="ignore"):
            return np.where(self.inverse, self.scale / it, it)

    def rows(self, systems: dict[str, System]) -> pd.DataFrame:
        it, oom, term = self.evaluate(systems)
        with np.errstate(over="ignore", divide="ignore"):  # an absurd row's time: inf, not a warning
            pred = np.where(self.inverse, self.scale / it, it)
            err = (pred / self.measured - 1.0) * 100.0
        return pd.DataFrame({
            "label": self.df["label"], "group": self.df["group"], "quantity": self.quantity,
            "measured": self.measured, "predicted": pred, "err_pct": err,
            "pred_iter_s": it, "oom": oom, "oom_term": term,
        })  # fmt: skip


def _fit_at(where, *args):
    """:func:`analytic.vfit.fit`, its verdict on a row said of the table."""
    try:
        return fit(*args)
    except InputError as exc:
        raise InputError(exc.where or where, exc.problem) from None


def _flops(model, sub: pd.DataFrame, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(model FLOPs, hardware FLOPs with recompute) per iteration of each row, from its shape:
    3 x forward (2 x matrix parameters + 4 s d per layer, Narayanan et al. eq. 3's attention
    convention, no causal halving) + the LM head 6 s d V; MoE experts counted active, a
    multi-token-prediction module included (analytic.mla.iteration_flops)."""
    from calib.analytic import modern as X
    from calib.analytic.mla import attention_proj_params, iteration_flops
    from calib.analytic.timemodel import shape_terms

    ffn = X.MOE.dense_ffn_avg(model, shape_terms(model)[0])
    rc = sub["recompute"].map(F.RECOMPUTE_NAMES.index).to_numpy()
    model_fl, hw_fl = iteration_flops(model, B, rc, ffn, attention_proj_params(model))
    return np.broadcast_to(model_fl, B.shape), np.broadcast_to(hw_fl, B.shape)


#: calibrate on rows 0, 3, 6, ... (by position in the table, chosen before looking at errors)
EVERY_THIRD = "every-third"


def select_rows(df: pd.DataFrame, spec: str, where: str = "calibrate_on") -> np.ndarray:
    """Mask of rows named by 1-based numbers, ranges (3-5), labels, group tags or
    ``every-third`` (rows 1, 4, 7, ...), comma separated."""
    mask = np.zeros(len(df), dtype=bool)
    for tok in filter(None, (t.strip() for t in spec.split(","))):
        if tok == EVERY_THIRD:  # by position, fixed before any error is seen
            mask[::3] = True
        elif tok.replace("-", "").isdigit() and tok[0] != "-":
            lo, _, hi = tok.partition("-")
            lo_i, hi_i = int(lo), int(hi or lo)
            if not 1 <= lo_i <= hi_i <= len(df):
                raise InputError(where, f"row range '{tok}' outside 1..{len(df)}")
            mask[lo_i - 1 : hi_i] = True
        elif (df["label"] == tok).any() or (df["group"] == tok).any():
            mask |= ((df["label"] == tok) | (df["group"] == tok)).to_numpy()
        else:
            raise InputError(where, f"'{tok}' is neither a row number, a label nor a group of the table")
    return mask


def oom_summary(rows: pd.DataFrame) -> dict:
    """How many measured (i.e. trained) configurations the model says do not fit, by term."""
    terms = rows.loc[rows["oom"], "oom_term"].value_counts()
    return {"n_rows": int(len(rows)), "n_predicted_oom": int(rows["oom"].sum()),
            "predicted_oom_terms": {str(k): int(v) for k, v in terms.items()}}  # fmt: skip


def summarise(errors_pct: np.ndarray) -> dict:
    signed = np.asarray(errors_pct, dtype=float)
    e = np.abs(signed)
    if e.size == 0:
        return {"n_heldout": 0, "median_abs_pct": None, "mean_abs_pct": None, "max_abs_pct": None}
    return {
        "n_heldout": int(e.size),
        "median_abs_pct": float(np.median(e)),
        "mean_abs_pct": float(np.mean(e)),
        "max_abs_pct": float(np.max(e)),
        # the bias: a model that is off the same way on most rows says so
        "median_signed_pct": float(np.median(signed)),
        "n_predicted_above": int(np.sum(signed > 0)),
    }


def validate(
    df: pd.DataFrame,
    where: str,
    base: System | None = None,
    calibrate_on: str | None = None,
    holdout: float | None = None,
    loo: bool = False,
    fit_kind: str = "network",
    seed: int = 0,
    progress=None,
) -> Validation:
    """Run the model over a normalised table with the chosen split (see module docstring).
    ``progress``: an optional wrapper of the leave-one-out folds' iterable (a progress bar).

    With ``base`` every row runs on that machine; rows whose own hardware differs say so in
    ``hardware_override`` (refusing the disagreement, unless overridden, is the caller's).
    Every result names the memory term of rows predicted not to fit (``oom_term``) and the
    summary counts them; fitted parameters that end on a bound are listed in ``at_bound``.
    """
    if fit_kind not in FITS:
        raise InputError("fit", f"unknown fit '{fit_kind}' (known: {', '.join(FITS)})")
    if sum(x is not None and x is not False for x in (calibrate_on, holdout, loo or None)) > 1:
        raise InputError("calibrate_on", "give at most one of calibrate_on, holdout, loo")
    systems = systems_for(df, base, where)
    df, table_notes = settle_defaults(df, systems)
    if "precision" in df.columns:  # the FP8 rate each machine's FP8 rows run at, and its source
        fp8_hw = sorted(set(df.loc[df["precision"].astype(str) == "fp8", "hardware"]))
        table_notes += [
            f"FP8 rows on {systems[h].hw.name}: linear GEMMs at {fp8_rate_text(systems[h].hw)}"
            for h in fp8_hw
            if h in systems
        ]
    check_rows(df, where, systems)
    table = Table.of(df)
    n = len(df)
    traced = sorted({s.cal.system for s in systems.values() if s.device_model is not None})
    if fit_kind == "none" or traced:
        rows = _annotate(table.rows(systems).assign(role="held-out"), df, base)
        rows = FI.with_saved_interval(rows, table, systems)
        summary = {**_summary(rows), **FI.coverage(rows)}
        prm = {"fit": "none", "at_bound": []}
        if traced and fit_kind != "none":  # its kernels are timed from traces: nothing here to fit
            prm["notes"] = [f"no fit: the device model of {', '.join(traced)} times every kernel from its traces, "
                            "so the table's compute efficiencies do not apply; every row predicted as it gives them"]  # fmt: skip
        _add_notes(prm, table_notes)
        return Validation(rows, summary, prm, "no fit: the calibration as given")
    if loo or (calibrate_on is None and holdout is None):
        if n < 2:
            raise InputError(where, "leave-one-out needs at least two rows")
        parts, params = [], []
        folds = range(n) if progress is None else progress(range(n))
        for i in folds:  # one fit per fold (n fits), each vectorised over the table
            keep = np.arange(n) != i
            fitted, prm = _fit_at(where, table, systems, keep, fit_kind)
            sub = table.subset(~keep)
            parts.append(FI.with_interval(sub.rows(fitted), sub, fitted, prm))
            params.append(prm)
        rows = _annotate(pd.concat(parts, ignore_index=True).assign(role="held-out"), df, base)
        prm = {"fit": fit_kind, "folds": n}
        for name in FIT_PARAMS[fit_kind]:
            vals = np.array([p[name] for p in params if name in p])
            if vals.size:
                prm[name + "_range"] = [float(vals.min()), float(vals.max())]
        prm["at_bound"] = _fold_bounds(params, n)
        summary = _summary(rows, None, table.rows(systems))
        summary.update(FI.coverage(rows))
        _add_notes(prm, table_notes)
        return Validation(rows, summary, prm, f"leave-one-out over {n} rows")
    if calibrate_on is not None:
        cal_rows = select_rows(df, calibrate_on)
        split = f"calibrated on {int(cal_rows.sum())} stated row(s): {calibrate_on}"
    else:
        if not 0 < holdout < 1:
            raise InputError("holdout", f"fraction must be in (0, 1), got {holdout}")
        rng = np.random.default_rng(seed)
        n_hold = min(max(1, int(round(holdout * n))), n - 1)
        held = np.zeros(n, dtype=bool)
        held[rng.choice(n, n_hold, replace=False)] = True
        cal_rows = ~held
        split = f"random hold-out of {n_hold}/{n} rows (seed {seed})"
    if cal_rows.all():
        raise InputError(
            where, f"every one of its {n} row(s) is a calibration row ({split}); nothing is held out"
        )
    fitted, prm = _fit_at(where, table, systems, cal_rows, fit_kind)
    prm.pop("bound_hits", None)  # structured form of at_bound, for the folds' summary only
    rows = _annotate(table.rows(fitted).assign(role=np.where(cal_rows, "calibration", "held-out")), df, base)
    rows = FI.with_interval(rows, table, fitted, prm)
    summary = _summary(rows, ~cal_rows, table.rows(systems))
    summary.update(FI.coverage(rows.loc[~cal_rows]))
    _add_notes(prm, [*table_notes, *extrapolation_notes(df, cal_rows)])
    return Validation(rows, summary, prm, split, fitted)


def _add_notes(prm: dict, notes: list[str]) -> None:
    if notes:
        prm["notes"] = [*prm.get("notes", []), *notes]


def _annotate(rows: pd.DataFrame, df: pd.DataFrame, base: System | None) -> pd.DataFrame:
    """The hardware each row ran on, and where ``base`` replaced the table's own."""
    own = df["hardware"].astype(str).reset_index(drop=True)  # every split keeps the table's row order
    if base is None:
        return rows.assign(hardware=own)
    differs = own.map(lambda h: bool(h) and load_hardware(h).name != base.hw.name)
    return rows.assign(
        hardware=base.hw.name,
        hardware_override=np.where(differs, "table: " + own + " -> " + base.hw.name, ""),
    )


def _summary(
    rows: pd.DataFrame, held: np.ndarray | None = None, unfitted: pd.DataFrame | None = None
) -> dict:
    """Errors over the held-out rows; predicted-OOM counts over every (trained) row; and the
    same held-out errors without the fit (a fit that does worse than none says so)."""
    err = rows["err_pct"] if held is None else rows.loc[held, "err_pct"]
    out = {**summarise(err), **oom_summary(rows), **by_group(rows if held is None else rows.loc[held])}
    if unfitted is not None:
        base = summarise(unfitted["err_pct"] if held is None else unfitted.loc[held, "err_pct"])
        out["unfitted_median_abs_pct"], out["unfitted_max_abs_pct"] = (
            base["median_abs_pct"],
            base["max_abs_pct"],
        )
    return out


def _fold_bounds(params: list[dict], n: int) -> list[str]:
    """One line per (parameter, bound) over the leave-one-out folds: in how many folds it
    ended there, and the range of its values (the folds' values differ, the finding not)."""
    hits: dict[tuple, list] = {}
    for p in params:
        for name, side, bound, value, shown in p.get("bound_hits", []):
            hits.setdefault((name, side, bound), []).append((value, shown))
    out = []
    for (name, side, bound), vals in hits.items():
        lo, hi = min(vals)[1], max(vals)[1]
        where = lo if lo == hi else f"{lo}..{hi}"
        out.append(f"{name} = {where} is at its {side} bound {bound} in {len(vals)} of {n} folds")
    return out
