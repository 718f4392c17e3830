"""Communication: volumes per collective (seed 004), group placement, and timing.

Volumes follow seed 004's table for p devices exchanging a 2P-byte buffer (P values in
fp16): all-reduce 4(1 - 1/p)P bytes per device, all-gather, reduce-scatter and reduce
2(1 - 1/p)P.  They are the nccl-tests "size" of the buffer times the busbw factor, so a
collective's time is size * factor / busbw + latency -- exactly what the calibration's
``collective_time_s`` evaluates.

Placement follows Megatron's rank order (TP fastest, then DP, then PP): a group of size n
whose members are ``stride`` ranks apart has k = min(n, gpus_per_node / stride) members
in each node.  A group inside one node uses the intra-node curve.  A group spanning
nodes shares the node's NICs with the gpn/k other groups of its kind running at the same
time, so its bus bandwidth is the full-node curve's times k / gpn (NERSC model, seed 002:
placement on NVLink domains).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from calib.calibrate.calibration import Calibration
from numpy.typing import ArrayLike

from calib.core.collective_names import ALLGATHER, ALLREDUCE, REDUCE, REDUCESCATTER, busbw_factor

# ---- seed 004 volumes --------------------------------------------------------------------
_VOLUME_FACTOR = {ALLREDUCE: 4.0, ALLGATHER: 2.0, REDUCESCATTER: 2.0, REDUCE: 2.0}


def volume_bytes(collective: str, params: ArrayLike, p: ArrayLike) -> np.ndarray:
    """Bytes each device moves when p devices run ``collective`` on P fp16 values (seed 004)."""
    p = np.asarray(p, dtype=float)
    return _VOLUME_FACTOR[collective] * (1.0 - 1.0 / p) * np.asarray(params, dtype=float)


# ---- placement -------------------------------------------------------------------------
def members_per_node(n: ArrayLike, stride: ArrayLike, gpus_per_node: int) -> np.ndarray:
    """k: members of one group (size n, ranks ``stride`` apart) that share a node."""
    n = np.asarray(n, dtype=float)
    per = np.maximum(1.0, np.floor(gpus_per_node / np.maximum(np.asarray(stride, dtype=float), 1.0)))
    return np.minimum(n, per)


# ---- timing ----------------------------------------------------------------------------
@lru_cache(maxsize=64)
def _probe(collective: str) -> tuple[float, float]:
    """The contract's factor at n = 2 and 4 (once per collective name)."""
    f2, f4 = busbw_factor(collective, np.array([2.0, 4.0]))
    return float(f2), float(f4)


def _factor(collective: str, n: np.ndarray) -> np.ndarray:
    """``busbw_factor(collective, n)`` without its per-element name matching.

    nccl-tests factors are c (n - 1) / n or a constant; two probes of the contract's own
    function tell which, and the arithmetic then runs on the array.
    """
    f2, f4 = _probe(collective)
    if not np.isfinite(f2):
        return np.full(n.shape, np.nan)
    if np.isclose(f4, f2):
        return np.full(n.shape, float(f2))
    with np.errstate(divide="ignore", invalid="ignore"):
        return 2.0 * f2 * (n - 1.0) / n


def _on_unique(fn, collective: str, nbytes: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Call ``fn(collective, nbytes, n)`` once per distinct (nbytes, n) pair and scatter back.

    A search grid has few distinct message sizes and group sizes per layout, so this
    turns a contract call over every layout into one over a few hundred pairs.
    """
    flat_b, flat_n = nbytes.ravel(), n.ravel()
    if flat_b.size <= 64:
        return fn(collective, flat_b, flat_n).reshape(nbytes.shape)
    ub, ib = np.unique(flat_b, return_inverse=True)
    un, in_ = np.unique(flat_n, return_inverse=True)
    codes, inv = np.unique(ib.ravel() * un.size + in_.ravel(), return_inverse=True)  # distinct pairs
    t = np.asarray(fn(collective, ub[codes // un.size], un[codes % un.size]))
    return t[inv.ravel()].reshape(nbytes.shape)


def group_time_s(
    cal: Calibration,
    collective: str,
    nbytes: ArrayLike,
    n: ArrayLike,
    k: ArrayLike,
) -> np.ndarray:
    """Seconds for one ``collective`` of ``nbytes`` (nccl-tests size) over a group of n GPUs
    with k per node, using only the calibration's ``collective_time_s`` contract.

    Inside a node (n <= k): the calibration's intra-node time at n.  Across nodes: the
    calibration's time for a full-node group over the same nodes (n_full = nodes * gpn),
    carrying the bytes that put the same load on each node's NICs -- gpn / k times the
    message (the NICs are shared with the other groups of this kind), corrected by the
    bus factor of n over that of n_full.  One vectorised contract call over the distinct
    (bytes, group) pairs.
    """
    gpn = int(cal.gpus_per_node)
    nbytes, n, k = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (nbytes, n, k)))
    if not np.any(n > 1):  # no group to communicate in: no curve needed
        return np.zeros(n.shape)
    intra = n <= k
    n_full = np.ceil(n / k) * gpn
    f_n = _factor(collective, n)
    f_full = _factor(collective, n_full)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(np.isfinite(f_n) & (f_full > 0), f_n / f_full, 1.0)
    n_call = np.where(intra, n, n_full)
    b_call = np.where(intra, nbytes, nbytes * (gpn / k) * ratio)
    t = _on_unique(cal.collective_time_s, collective, b_call, n_call)
    return np.where(n <= 1, 0.0, t)
