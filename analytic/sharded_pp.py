"""ZeRO-2/3 combined with pipeline parallelism, as FSDP2 + torch.distributed.pipelining run it.

DeepSpeed's pipeline engine refuses ZeRO-2/3, but PyTorch's pipelining schedules run
FSDP(2)-sharded stages (torchtitan; Llama 3: "Our use of FSDP for Llama 3 shards optimizer
states and gradients, but for model shards we do not reshard after forward computation
to avoid an extra all-gather during backward", arXiv:2407.21783 sec. 3.3.2).  With many
micro-batches per step a per-micro-batch gather/reduce-scatter would repeat the stage's
whole parameter traffic m times, so the schedule

* keeps the stage's parameters unsharded after their first gather (reshard after
  forward off), i.e. one parameter all-gather per step, per module;
* syncs gradients only at the last micro-batch (``set_requires_gradient_sync`` off
  before it), i.e. one reduce-scatter per step, per module -- over the shard group, plus
  the replicas' all-reduce under hybrid sharding (analytic.hybrid).

Per step that is the distributed optimizer's traffic (reduce-scatter + all-gather, with
its stated overlap fractions), issued module by module; at the step's peak the unsharded
parameters and gradients are all resident, so the model states are ZeRO-1's:
2 P + 2 P + 12 P / d (the sharded fp32 copy is the master weight of the 12).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np


def active(st) -> np.ndarray:
    """True where ZeRO-2/3 runs with PP > 1 (the semantics above)."""
    return (np.asarray(st.zero) >= 2) & (np.asarray(st.pp) > 1)


def memory_strategies(st):
    """``st`` with the ZeRO stage whose memory formula holds at the step's peak (ZeRO-1
    for ZeRO-2/3 with PP, unchanged otherwise)."""
    on = active(st)
    if not np.any(on):
        return st
    return replace(st, zero=np.where(on, 1, st.zero).astype(np.int64))
