"""ZeRO-3 combined with pipeline parallelism, as FSDP2 + torch.distributed.pipelining run it.

DeepSpeed's pipeline engine refuses ZeRO-2/3, but PyTorch's pipelining schedules run
FSDP2-sharded stages (torchtitan).  With many micro-batches per step a per-micro-batch
gather/reduce-scatter would repeat the stage's whole parameter traffic m times, so for an
FSDP module the schedule turns off resharding after backward and gradient sync for every
micro-batch and runs the post-backward reduce once at the end
(``torch.distributed.pipelining.stage``: ``set_reshard_after_backward(False)``,
``set_requires_gradient_sync(False)``); torchtitan also turns off resharding after
forward when PP is on.  Hence per step

* one parameter all-gather per module (the first use; then kept unsharded);
* one gradient reduce-scatter per module at the last micro-batch -- over the shard group,
  plus the replicas' all-reduce under hybrid sharding (analytic.hybrid);

the distributed optimizer's traffic (with its stated overlap fractions), issued module
by module; at the step's peak the unsharded parameters and gradients are all resident,
so the model states are ZeRO-1's: 2 P + 2 P + 12 P / d (the sharded fp32 copy is the
master weight of the 12).

The same holds for FSDP's ZeRO-2 (SHARD_GRAD_OP, ``zero_impl`` fsdp) under torch
pipelining.  ZeRO-2 with PP otherwise keeps ZeRO-2's own semantics per stage --
gradients reduced and sharded per micro-batch, parameters whole -- which is what Llama 3
describes for its FSDP with PP 16: "shards optimizer states and gradients, but for model
shards we do not reshard after forward computation" (arXiv:2407.21783 sec. 3.3.2).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np


def active(st) -> np.ndarray:
    """True where ZeRO-3, or FSDP's ZeRO-2, runs with PP > 1 (the semantics above)."""
    z = np.asarray(st.zero)
    fsdp_z2 = (z == 2) & (np.asarray(st.zero_impl) == 1)
    return ((z == 3) | fsdp_z2) & (np.asarray(st.pp) > 1)


def memory_strategies(st):
    """``st`` with the ZeRO stage whose memory formula holds at the step's peak (ZeRO-1
    where :func:`active`, unchanged otherwise)."""
    on = active(st)
    if not np.any(on):
        return st
    return replace(st, zero=np.where(on, 1, st.zero).astype(np.int64))
