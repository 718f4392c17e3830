"""Communication/computation overlap as modelled fractions -- never perfect hiding.

A collective of ``comm`` seconds that a framework overlaps with ``window`` seconds of
independent compute is charged

    exposed = comm - f * min(comm, window)

with ``f`` < 1 the fraction of the overlappable time that really hides (contention for
SMs and HBM, launch ordering and the first/last bucket that cannot overlap).  The
fractions below are stated defaults, not fits: no measurement in this repository
identifies them.  ``calib predict`` prints them with every prediction that uses one.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

#: TP all-gather / reduce-scatter split and pipelined with the adjacent GEMMs
#: (Megatron-Core ``--tp-comm-overlap``, Transformer Engine userbuffers).  Default 0.6.
TP_OVERLAP = 0.6
#: SM sharing: the compute a TP collective hides under runs slower while the collective's kernels
#: hold SMs (seed 000's execution-strategy table: TP overlap raises "Comp time").  Calculon charges
#: the hidden communication time x the network's ``processor_usage`` as extra compute time
#: (calculon/llm/layers.py ``compute_processing_time``; systems/a100_80g.json: 0.15 for NVLink,
#: 0.02 for InfiniBand).  Default 0.15 (TP runs on NVLink).
TP_OVERLAP_SM_SLOWDOWN = 0.15
#: ring-attention K/V send/recv under the attention block compute of the same step.  Default 0.8.
CP_RING_OVERLAP = 0.8
#: Ulysses all-to-alls sit between the projection and the attention core: not overlapped.
CP_ULYSSES_OVERLAP = 0.0
#: Llama 3's all-gathered K/V: gathered before the attention that needs them; not overlapped.
#: MoE dispatch/combine all-to-all under the other micro-batch's compute in DualPipe
#: (DeepSeek-V3 report sec. 3.2.1 overlaps them fully; 0.8 is charged).  Default 0.8.
EP_OVERLAP_DUALPIPE = 0.8
#: ... and with 1F1B / interleaved / ZB-H1 (no paired micro-batch to hide under).  Default 0.
EP_OVERLAP_1F1B = 0.0
#: distributed optimizer: gradient reduce-scatter under the last micro-batch's backward
#: (Megatron ``--overlap-grad-reduce``) and parameter all-gather under the first
#: micro-batch's forward (``--overlap-param-gather``).  Default 0.8 each.
DP_RS_OVERLAP = 0.8
DP_AG_OVERLAP = 0.8

DEFAULTS = {
    "tp_overlap_fraction": TP_OVERLAP,
    "tp_overlap_sm_slowdown": TP_OVERLAP_SM_SLOWDOWN,
    "cp_ring_overlap_fraction": CP_RING_OVERLAP,
    "ep_overlap_fraction_dualpipe": EP_OVERLAP_DUALPIPE,
    "dist_opt_reduce_scatter_overlap_fraction": DP_RS_OVERLAP,
    "dist_opt_all_gather_overlap_fraction": DP_AG_OVERLAP,
}


def exposed(comm: ArrayLike, window: ArrayLike, fraction: ArrayLike) -> np.ndarray:
    """comm - f min(comm, window): the part of ``comm`` left on the critical path."""
    comm = np.asarray(comm, dtype=float)
    return comm - np.asarray(fraction, dtype=float) * np.minimum(comm, np.asarray(window, dtype=float))


def exposed_with_sharing(comm: ArrayLike, window: ArrayLike, fraction: ArrayLike,
                         slowdown: ArrayLike = TP_OVERLAP_SM_SLOWDOWN) -> np.ndarray:  # fmt: skip
    """Exposed communication plus the compute slowdown of sharing the SMs: ``slowdown`` x the
    hidden part (Calculon's branch where communication fits under compute; where it does not,
    Calculon slows compute tiles that stay hidden under the communication, and this charges
    at most ``slowdown`` x the window more)."""
    exp = exposed(comm, window, fraction)
    return exp + np.asarray(slowdown, dtype=float) * (np.asarray(comm, dtype=float) - exp)
