"""Canonical collective names and the nccl-tests bus-bandwidth factors.

nccl-tests (doc/PERFORMANCE.md) reports algbw = size / time and busbw = algbw * factor,
where the factor makes busbw comparable to link bandwidth:

    allreduce                      2 (n - 1) / n
    allgather, reducescatter,      (n - 1) / n
    alltoall
    broadcast, reduce, sendrecv    1
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
from numpy.typing import ArrayLike

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
REDUCESCATTER = "reducescatter"
ALLTOALL = "alltoall"
BROADCAST = "broadcast"
REDUCE = "reduce"
SENDRECV = "sendrecv"
SEND = "send"
RECV = "recv"
BARRIER = "barrier"
GATHER = "gather"
SCATTER = "scatter"
UNKNOWN = "unknown"

CANONICAL = (
    ALLREDUCE,
    ALLGATHER,
    REDUCESCATTER,
    ALLTOALL,
    BROADCAST,
    REDUCE,
    SENDRECV,
    SEND,
    RECV,
    BARRIER,
    GATHER,
    SCATTER,
    UNKNOWN,
)

_FACTOR_2 = {ALLREDUCE}
_FACTOR_N1 = {ALLGATHER, REDUCESCATTER, ALLTOALL, GATHER, SCATTER}

# Aliases seen in NCCL kernel names, trace args ("Collective name"), gloo annotations,
# c10d op names and nccl-tests binaries, lower-cased with separators removed.
_ALIASES = {
    "allreduce": ALLREDUCE,
    "allreducecoalesced": ALLREDUCE,
    "allgather": ALLGATHER,
    "allgatherbase": ALLGATHER,
    "allgatherintotensor": ALLGATHER,
    "allgathercoalesced": ALLGATHER,
    "allgatherintotensorcoalesced": ALLGATHER,
    "reducescatter": REDUCESCATTER,
    "reducescatterbase": REDUCESCATTER,
    "reducescattertensor": REDUCESCATTER,
    "reducescattertensorcoalesced": REDUCESCATTER,
    "alltoall": ALLTOALL,
    "alltoallbase": ALLTOALL,
    "alltoallv": ALLTOALL,
    "broadcast": BROADCAST,
    "bcast": BROADCAST,
    "reduce": REDUCE,
    "sendrecv": SENDRECV,
    "send": SEND,
    "recv": RECV,
    "barrier": BARRIER,
    "gather": GATHER,
    "scatter": SCATTER,
}


@lru_cache(maxsize=4096)
def canonical(name: str) -> str:
    """Map any spelling (``all_gather``, ``_allgather_base_``, ``AllReduce``) to a canonical name."""
    key = re.sub(r"[^a-z]", "", name.lower())
    for prefix in ("c10d", "gloo", "nccl", "nccldevkernel", "ncclkernel"):
        if key.startswith(prefix) and key[len(prefix) :] in _ALIASES:
            key = key[len(prefix) :]
            break
    return _ALIASES.get(key, UNKNOWN)


def busbw_factor(collective: str | ArrayLike, n: ArrayLike) -> np.ndarray:
    """nccl-tests bus-bandwidth factor for ``collective`` over ``n`` ranks (vectorised)."""
    n = np.asarray(n, dtype=float)
    if isinstance(collective, str):  # one name (the time model's calls): no per-element matching
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(n > 0, (n - 1.0) / n, np.nan)
        if collective in (BARRIER, UNKNOWN):
            return np.full(n.shape, np.nan)
        return (
            2.0 * frac if collective in _FACTOR_2 else frac if collective in _FACTOR_N1 else np.ones(n.shape)
        )
    coll = np.asarray(collective, dtype=object)
    coll, n = np.broadcast_arrays(coll, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(n > 0, (n - 1.0) / n, np.nan)
    two = np.isin(coll, list(_FACTOR_2))
    n1 = np.isin(coll, list(_FACTOR_N1))
    out = np.where(two, 2.0 * frac, np.where(n1, frac, 1.0))
    return np.where(np.isin(coll, [BARRIER, UNKNOWN]), np.nan, out)
