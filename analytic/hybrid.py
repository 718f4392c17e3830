"""Hybrid sharding: ZeRO-2/3 inside a shard group, replicas across groups.

PyTorch FSDP's ``HYBRID_SHARD`` (``_HYBRID_SHARD_ZERO2`` for ZeRO-2) and DeepSpeed's MiCS
(Zhang et al., "MiCS: Near-linear Scaling for Training Gigantic Model on Public Cloud",
VLDB 2023) shard parameters, gradients and optimizer states over a group of g_s
consecutive data-parallel ranks -- by default one node -- and keep r = g / g_s replicas
of that sharded state across the g ranks of the DP group.  Per FSDP unit and micro-batch:

* the parameter all-gather runs inside the shard group (g_s ranks, usually NVLink);
* the gradients are reduce-scattered inside the shard group, and each rank's 1 / g_s
  shard is then all-reduced across the r replicas (ranks g_s apart, over the NICs):
  2 (1 - 1/r) S / g_s bytes per rank instead of the flat group's (1 - 1/g) S.

Memory per GPU follows ZeRO's formulas with g_s in place of g.  Reference: PyTorch
``torch.distributed.fsdp.ShardingStrategy`` docs ("HYBRID_SHARD: apply FULL_SHARD within
a node, and replicate parameters across nodes"); MiCS sec. 3 (partition group and
replication group, hierarchical gradient synchronisation).  Hand-worked values:
tests/test_hybrid_shard.py.
"""

from __future__ import annotations

import numpy as np


def shard_sizes(st, g_dense: np.ndarray, g_exp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) shard-group sizes: ``st.shard`` (0 = the whole group) within each group.

    The expert group (EDP) may be smaller than the shard group or not a multiple of it:
    its shard group is the largest common divisor, so the replicas stay whole.
    """
    sh = np.asarray(st.shard, dtype=np.int64)
    dense = np.where(sh > 0, np.minimum(sh, g_dense), g_dense)
    ge = np.asarray(g_exp).astype(np.int64)
    exp = np.where(sh > 0, np.gcd(np.maximum(sh, 1), np.maximum(ge, 1)), g_exp)
    return dense.astype(float), exp.astype(float)


def is_hybrid(st) -> np.ndarray:
    """True where a strategy shards over part of its DP group only."""
    return np.asarray(st.shard) > 0


def gradient_sync_s(st, comm: dict, reduce_z2_s, rs_z3_s, fsdp=False) -> tuple[np.ndarray, np.ndarray]:
    """Per-micro-batch gradient synchronisation of ZeRO-2 and ZeRO-3.

    With hybrid sharding: the reduce-scatter in the shard group (per module) plus the
    shard's all-reduce across the replicas (``dp_hsdp_ar_s``).  ZeRO-2 reduce-scatters per
    module under FSDP (``fsdp``; _HYBRID_SHARD_ZERO2 is FSDP) instead of the reduces
    DeepSpeed's ZeRO-2 issues.  Unchanged for DeepSpeed without hybrid sharding.
    """
    replicas = comm.get("dp_hsdp_ar_s", 0.0)
    z2 = np.where(is_hybrid(st) | np.asarray(fsdp), comm.get("dp_rs_z3_s", 0.0) + replicas, reduce_z2_s)
    return z2, rs_z3_s + replicas
