"""Data-parallel / ZeRO collectives per iteration: how many are issued and how much shows.

Per stage and iteration, over the stage's parameter shard (the single collectives are
timed by :func:`analytic.timemodel.comm_times`):

* ZeRO-0 all-reduce; ZeRO-1 all-reduce + all-gather after the step;
* ZeRO-2 a gradient reduce per micro-batch + the all-gather after the step;
* ZeRO-3 per micro-batch two parameter all-gathers (forward, backward) -- three with full
  recompute when the recomputed forward gathers again -- and a reduce-scatter, module by
  module (analytic.zero_overlap);
* Megatron's distributed optimizer and ZeRO-3 with PP (analytic.sharded_pp): one
  reduce-scatter + one all-gather per step; hybrid sharding adds the replicas' all-reduce
  (analytic.hybrid).

**Implementation** (``zero_impl``): DeepSpeed (0, the default) or PyTorch FSDP (1).  They
differ per micro-batch, as their sources say:

* FSDP skips the unshard in the recomputed forward ("For ``fully_shard`` + ``checkpoint``,
  skip pre-forward logic in the recomputed forward", ``torch.distributed.fsdp.
  _runtime_utils._pre_forward``): two gathers per micro-batch with full recompute, where
  DeepSpeed's pre-forward hook fetches the released parameters a third time;
* FSDP's SHARD_GRAD_OP (ZeRO-2) reshards after backward, so every micro-batch's forward
  all-gathers the parameters (module by module), and reduce-scatters its gradients
  (FSDP docs), where DeepSpeed's ZeRO-2 keeps whole fp16 parameters and reduces.

With ``dp_overlap`` the collectives hide under compute (ZeRO-0/1's all-reduce and ZeRO-2's
reduces under the backward, ZeRO-3's and FSDP ZeRO-2's gathers by the stated fraction of
analytic.zero_overlap); otherwise they add.
"""

from __future__ import annotations

import numpy as np
from calib.analytic import hybrid as HY
from calib.analytic import sharded_pp as SPP
from calib.analytic import zero_overlap as ZO
from calib.analytic.modern import dist_opt_exposed

#: ZeRO implementations, by code
ZERO_IMPLS = ("deepspeed", "fsdp")
DEEPSPEED, FSDP = 0, 1


def dp_terms(st, c: dict, m, full, bwd_window, fwd_window, lean: bool = False) -> dict[str, np.ndarray]:
    """Totals (``dp_ar``, ``dp_ag``, ``dp_rs``) and the exposed time (``dp_exposed``; per kind
    ``ar_exp``, ``ag_exp``, ``rs_exp`` unless ``lean``) of one stage's DP collectives per
    iteration.  ``c``: the single collectives' seconds; ``full``: full recompute."""
    z = st.zero
    fsdp = np.asarray(st.zero_impl) == FSDP
    ar, ag, rs3, rs2 = c["dp_ar_s"], c["dp_ag_s"], c["dp_rs_s"], c["dp_reduce_s"]
    ag3, rs33 = c.get("dp_ag_z3_s", ag), c.get("dp_rs_z3_s", rs3)  # per-module collectives
    rs2, rs33 = HY.gradient_sync_s(st, c, rs2, rs33, fsdp)  # reduce-scatters where FSDP/hybrid
    n_ag_mb = np.where(full & ~fsdp, 3.0, 2.0)  # ZeRO-3 gathers per micro-batch
    ag2 = np.where(fsdp, m * ag3, ag)  # ZeRO-2's gathers: FSDP per micro-batch, DeepSpeed once
    dp_ar = np.where(z <= 1, ar, 0.0)
    dp_ag = np.where(z == 1, ag, 0.0) + np.where(z == 2, ag2, 0.0) + np.where(z == 3, m * n_ag_mb * ag3, 0.0)
    dp_rs = np.where(z == 2, m * rs2, 0.0) + np.where(z == 3, m * rs33, 0.0)

    ovl = st.dp_overlap
    # ZeRO-3 gathers/reduce-scatters hide under compute only up to a fraction (analytic.zero_overlap)
    z3_exp = m * (ZO.exposed_s(ag3, fwd_window) + ZO.exposed_s((n_ag_mb - 1.0) * ag3 + rs33, bwd_window))
    ar_hidden = np.maximum(0.0, ar - bwd_window)  # ZeRO-0/1 all-reduce under the last backward
    rs2_exp = m * np.maximum(0.0, rs2 - bwd_window)  # ZeRO-2 reduces under each backward
    ag2_exp = np.where(fsdp, m * ZO.exposed_s(ag3, fwd_window), ag)  # DeepSpeed's after the step never hides
    ovl_total = np.select([z == 0, z == 1, z == 2], [ar_hidden, ar_hidden + ag, ag2_exp + rs2_exp], z3_exp)
    dp_exposed = np.where(ovl, ovl_total, dp_ar + dp_ag + dp_rs)
    # Megatron's distributed optimizer, and ZeRO-3 with PP per module (analytic.sharded_pp):
    # one reduce-scatter + one all-gather per step, fractional overlap
    fp = SPP.active(st)
    do, rs_do, ag_do = st.dist_opt | fp, np.where(fp, rs33, rs3), np.where(fp, ag3, ag)
    do_rs, do_ag = dist_opt_exposed(st, rs_do, ag_do, bwd_window, fwd_window)
    dp_exposed = np.where(do, do_rs + do_ag, dp_exposed)
    dp_ar, dp_rs, dp_ag = np.where(do, 0.0, dp_ar), np.where(do, rs_do, dp_rs), np.where(fp, ag_do, dp_ag)
    out = {"dp_ar": dp_ar, "dp_ag": dp_ag, "dp_rs": dp_rs, "dp_exposed": dp_exposed}
    if lean:
        return out
    z3_ag_share = np.where(z == 3, (n_ag_mb * ag3) / np.maximum(n_ag_mb * ag3 + rs33, 1e-30), 0.0)
    ar_exp = np.where(ovl, np.where(z <= 1, ar_hidden, 0.0), dp_ar)
    ag_exp = np.where(
        ovl,
        np.where(z == 1, ag, 0.0)
        + np.where(z == 2, ag2_exp, 0.0)
        + np.where(z == 3, z3_exp * z3_ag_share, 0.0),
        dp_ag,
    )
    rs_exp = np.where(
        ovl, np.where(z == 2, rs2_exp, 0.0) + np.where(z == 3, z3_exp * (1.0 - z3_ag_share), 0.0), dp_rs
    )
    out.update(
        ar_exp=np.where(do, 0.0, ar_exp),
        ag_exp=np.where(do, do_ag, ag_exp),
        rs_exp=np.where(do, do_rs, rs_exp),
    )
    return out
