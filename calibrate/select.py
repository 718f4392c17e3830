"""What a fit sees: a system's runs (read by the API layer), narrowed by ``where`` filters.

Keys are the columns of the ``samples`` table (``setup``, ``nccl_version``,
``collective``, ``nnodes``, ``nranks``, ``gpus_per_node``, ``dtype``, ``source``,
``file``) plus ``run`` (run name, applies to every run kind).  Several ``KEY=VALUE`` items
on one key, or a comma list, mean "any of"; different keys must all hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from calib.core.errors import InputError
from calib.core.rundir import Run
from calib.core.schema import KIND_TRACE, SAMPLES

RUN_KEY = "run"
SAMPLE_KEYS = tuple(SAMPLES.names)


@dataclass(frozen=True)
class Selection:
    """The runs and samples one fit uses, and what was decided on the way."""

    system: str
    runs: tuple[Run, ...]
    samples: pd.DataFrame  # conforming to SAMPLES plus a "run" column
    trace_runs: tuple[Run, ...]
    where: dict[str, tuple[str, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def parse_where(items: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``["setup=5", "nnodes=2,8"]`` -> ``{"setup": ("5",), "nnodes": ("2", "8")}``."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise InputError("where", f"'{item}' is not KEY=VALUE (e.g. setup=5)")
        if key != RUN_KEY and key not in SAMPLE_KEYS:
            raise InputError("where", f"unknown key '{key}' (known: {RUN_KEY}, {', '.join(SAMPLE_KEYS)})")
        out.setdefault(key, []).extend(v.strip() for v in value.split(",") if v.strip())
    return {k: tuple(v) for k, v in out.items()}


def _match(col: pd.Series, key: str, values: tuple[str, ...]) -> pd.Series:
    if key == "nccl_version":  # logs that do not name their NCCL version
        values = tuple("" if v.lower() in ("unrecorded", "unknown") else v for v in values)
    if pd.api.types.is_numeric_dtype(col):
        try:
            nums = [float(v) for v in values]
        except ValueError:
            raise InputError("where", f"{key} takes numbers, got {', '.join(values)}") from None
        return col.astype(float).isin(nums)
    return col.astype(str).isin(values)


def select(runs: Sequence[Run], system: str, where: dict[str, tuple[str, ...]]) -> Selection:
    """The system's runs and samples with ``where`` applied; errors name what is missing."""
    runs = sorted(runs, key=lambda r: r.meta.name)
    if not runs:
        raise InputError(f"system {system}", "no runs to fit. " + needs_text(system))
    names = set(where.get(RUN_KEY, ()))
    if names:
        unknown = sorted(names - {r.meta.name for r in runs})
        if unknown:
            raise InputError(
                "where",
                f"run {', '.join(unknown)} not in system {system} "
                f"(runs: {', '.join(r.meta.name for r in runs)})",
            )
        runs = [r for r in runs if r.meta.name in names]
    frames = [r.table("samples").assign(run=r.meta.name) for r in runs if r.has("samples")]
    samples = (
        pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*SAMPLE_KEYS, RUN_KEY])
    )
    notes: list[str] = []
    for key, values in where.items():
        if key == RUN_KEY:
            continue
        if samples.empty:
            raise InputError(
                "where", f"{key}={','.join(values)} filters samples, but system {system} has none"
            )
        keep = _match(samples[key], key, values)
        if not keep.any():
            seen = ", ".join(map(str, sorted(samples[key].dropna().unique().tolist())))
            raise InputError(
                "where",
                f"{key}={','.join(values)} matches none of the {len(samples)} samples ({key} values: {seen})",
            )
        samples = samples[keep]
    samples, setup_note = _one_setup(samples, "setup" in where)
    if setup_note:
        notes.append(setup_note)
    samples, version_note = _one_version(samples, "nccl_version" in where)
    if version_note:
        notes.append(version_note)
    trace_runs = tuple(r for r in runs if r.meta.kind == KIND_TRACE)
    return Selection(
        system=system,
        runs=tuple(runs),
        samples=samples.reset_index(drop=True),
        trace_runs=trace_runs,
        where=where,
        notes=tuple(notes),
    )


def _one_setup(samples: pd.DataFrame, chosen: bool) -> tuple[pd.DataFrame, str]:
    """Environment setups (nccl-tests ``.dat.K``) differ up to 10x: never pool them.

    Without a ``setup=K`` filter the setup with the highest large-message bus bandwidth
    (median over collectives and scales of the busbw at each log's largest size) is used.
    """
    if samples.empty or samples["setup"].nunique() <= 1:
        return samples, ""
    if chosen:
        raise InputError(
            "where",
            f"setup={','.join(map(str, sorted(samples['setup'].unique())))} selects several "
            "environment setups; their bandwidths differ up to 10x, fit one at a time",
        )
    busbw = np.fmax(samples["busbw_oop_gbps"], samples["busbw_ip_gbps"])
    largest = samples["bytes"] == samples.groupby(["setup", "collective", "nranks"])["bytes"].transform("max")
    score = busbw[largest].groupby(samples.loc[largest, "setup"]).median().sort_index()
    best = int(score.idxmax())
    listing = ", ".join(f"{int(k)}: {v:.1f}" for k, v in score.items())
    note = (
        f"samples hold environment setups {sorted(score.index.tolist())}; used setup {best}, the highest "
        f"median large-message busbw (GB/s by setup: {listing}); choose another with the filter setup=K"
    )
    return samples[samples["setup"] == best], note


def _version_key(v: str) -> tuple:
    return tuple(int(x) for x in v.split(".") if x.isdigit()) if v else ()


def _one_version(samples: pd.DataFrame, chosen: bool) -> tuple[pd.DataFrame, str]:
    """NCCL versions are separate populations too (their tuners choose differently).

    Without ``nccl_version`` in the filter: the version with the most samples, ties to
    the newest (an unrecorded version counts as the oldest); the note says which.
    """
    if samples.empty or samples["nccl_version"].astype(str).nunique() <= 1:
        return samples, ""
    ver = samples["nccl_version"].astype(str)
    counts = ver.value_counts()
    if chosen:
        raise InputError(
            "where",
            f"{', '.join(sorted(v or 'unrecorded' for v in counts.index))} select several NCCL versions; "
            "their tuners pick different algorithms, fit one at a time",
        )
    best = max(counts.index, key=lambda v: (int(counts[v]), _version_key(v)))
    listing = ", ".join(f"{v or 'unrecorded'}: {int(c)}" for v, c in sorted(counts.items()))
    note = (
        f"samples hold NCCL versions ({listing} samples); used {best or 'unrecorded'} (most samples, ties to "
        "the newest); versions are never pooled; choose another with the filter nccl_version=V"
    )
    return samples[ver == best], note


def needs_text(system: str) -> str:
    """What data each factor needs, for errors and notes."""
    return (
        "What each factor needs: collective curves -- nccl-tests logs (all_reduce_perf, all_gather_perf, ...) "
        f"of system {system} with >= 3 message sizes; eff_{{g->n}} -- such logs at >= 2 node counts; k1, k2 and "
        f"dispatch costs -- profiler traces of system {system}, k1/k2 curves need >= 2 model sizes; GEMM "
        "efficiency -- traces recorded with record_shapes and the device's peak (peak_tflops)."
    )
