"""The extrapolation self-check the shipped data allows: fit on the smallest node count alone,
predict every larger one, and report the error per collective and size.

Honest by construction: the larger scales' samples are dropped before any fit (the
fit never sees them), and every parameter is chosen by :mod:`calibrate.netfit`, which
has no knob set by looking at them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from calib.calibrate.collectives import fit_series, size_series
from calib.calibrate.netfit import fit_nccl

from calib.core.collective_names import busbw_factor


def fit_pairs(samples: pd.DataFrame, source: str = "nccl-tests") -> dict[str, list]:
    """(curve, series) pairs per collective, as ``calib fit`` builds them."""
    pairs: dict[str, list] = {}
    for s in size_series(samples, source):
        pairs.setdefault(s.collective, []).append((fit_series(s), s))
    return pairs


def selfcheck(
    samples: pd.DataFrame,
    *,
    topology: Mapping[str, float] | None = None,
    min_bytes: float = 2**20,
    where: str = "selfcheck",
) -> pd.DataFrame:
    """Fit on the smallest inter-node count of ``samples`` (one population), predict the rest.

    Returns one row per (collective, nodes, bytes >= ``min_bytes``) of the held-out scales:
    measured and predicted median time, busbw, the relative time error pred / meas - 1
    and the algorithm the model chose.
    """
    inter = samples[samples["nnodes"] > 1]
    base_nodes = int(inter["nnodes"].min())
    train = inter[inter["nnodes"] == base_nodes]
    test = inter[inter["nnodes"] > base_nodes]
    nets, _ = fit_nccl(fit_pairs(train), where=where, topology=topology)
    rows = []
    for s in size_series(test, "held out"):
        net = nets.get(s.collective)
        if net is None:
            continue
        m = s.bytes >= min_bytes
        t_pred, algo = net.model_time_s(s.bytes[m], float(s.n_gpus))
        f = float(busbw_factor(s.collective, s.n_gpus))
        for b, tm, tp, a in zip(s.bytes[m], s.time_s[m], t_pred, algo):
            rows.append(
                {
                    "collective": s.collective,
                    "fit_nodes": base_nodes,
                    "nodes": s.n_nodes,
                    "bytes": int(b),
                    "measured_s": float(tm),
                    "predicted_s": float(tp),
                    "busbw_measured_gbps": b * f / tm / 1e9,
                    "busbw_predicted_gbps": b * f / tp / 1e9,
                    "error": float(tp / tm - 1.0),
                    "algorithm": str(a),
                }
            )
    return pd.DataFrame(rows)


def populations(samples: pd.DataFrame) -> list[tuple[str, int, pd.DataFrame]]:
    """(NCCL version, setup, samples) of every population with at least two inter-node scales:
    versions and environment setups are never pooled (their tuners and bandwidths differ)."""
    out = []
    ver = samples["nccl_version"].astype(str)
    for (v, setup), g in samples.groupby([ver, samples["setup"]], sort=True):
        if g.loc[g["nnodes"] > 1, "nnodes"].nunique() >= 2:
            out.append((str(v), int(setup), g))
    return out


def summary(table: pd.DataFrame) -> dict[str, float]:
    """Median and max |error| over the table, and per collective."""
    err = table["error"].abs()
    out = {"median_abs_error": float(np.median(err)), "max_abs_error": float(err.max()), "points": len(err)}
    for coll, g in table.groupby("collective"):
        out[f"median_abs_error_{coll}"] = float(np.median(g["error"].abs()))
        out[f"max_abs_error_{coll}"] = float(g["error"].abs().max())
    return out
