"""NCCL's tree all-reduce, fitted from the sizes of nccl-tests logs it ran (:mod:`calibrate.netfit`).

* **Simple protocol**: the pipeline of :func:`calibrate.ncclmodel.tree_pipeline_s`, one fitted
  per-hop cost ``tree_hop_s``; its bytes run at the ring step's plateau NIC rate (the same
  NICs).  Small chunks make mid-size trees slow and 512 KiB chunks bring a large tree close to
  the ring, so a bandwidth read off an 8 MiB tree is not carried to 1 GiB (until stop 30 it
  was: a 3.3x fall in all-reduce bandwidth between 32 and 64 Polaris nodes, where the tuner
  turns to the tree).
* **The tuner's cost form**: ``A * L_tuner + NIC bytes / (B_tree * share * treeCorrectionFactor)``,
  fitted on every tree size as before stop 30: it times LL / LL128 trees, and it is what the
  choice compares with the ring where NCCL's own table (:mod:`calibrate.nccltuner`, 2.20.3)
  does not reproduce the logged ring/tree choices on :data:`TUNER_AGREEMENT` of the sizes (a
  tuner decides by a model of this form, not by the pipeline's real cost).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from calib.calibrate import ncclmodel, nccltuner
from calib.calibrate.calibration import DEFAULT, FITTED, Param
from calib.calibrate.netparams import fixed, lsq, param

#: an all-reduce size faster than this fraction of the ring's time ran NCCL's tree
TREE_RATIO = 0.8
#: NCCL's tuner decides ring/tree outright when it reproduces this fraction of the logged
#: choices at the fitted scale (sizes >= the fit's smallest; a stated default: 9 in 10)
TUNER_AGREEMENT = 0.9
#: the relative spread (sd) of the per-hop cost that each Simple-tree size implies, on the NCCL
#: 2.18 setup-3 logs (5 sizes, 256 KiB-4 MiB): 0.043 at 2 nodes, 0.097 at 8 -- the model's own
#: error, the floor of a one-size fit's standard error (tests/test_tree_pipeline.py)
HOP_SIZE_SPREAD = 0.1
LAT_WHAT = "tree latency over NCCL's (tuning.cc 2.20.3 tree row of the protocol the tuner picks)"


def fit_tree(S, n, T, T_se, is_tree, big, gpn: int, steps, topo: Mapping[str, float], graph, where: str):
    """The tree's parameters (``tree_lat_scale``, ``tree_busbw_gbps``, ``tree_hop_s``, ``tuner``
    and, with too few tree sizes, ``tree_from_ring``) from the all-reduce points (size ``S``,
    GPUs ``n``, time ``T`` with standard error ``T_se``); ``is_tree`` the points NCCL ran as a
    tree, ``big`` those the tuner's choices are judged on."""
    scales = sorted({int(v) for v in n})
    note = f"{int(is_tree.sum())} of {len(T)} sizes at {scales} GPUs ran below {TREE_RATIO} x the ring's time (NCCL's tree)"
    agree = float(
        np.mean((nccltuner.allreduce_choice(S[big], n[big], gpn, graph)[0] == "tree") == is_tree[big])
    )
    use_tuner = agree >= TUNER_AGREEMENT
    proto, lat_us, bwf = nccltuner.tree_parts(S, n, gpn, graph, tables=use_tuner)
    # with the tuner's tables every tree size has its protocol's latency and bandwidth; without
    # them only Simple-protocol sizes (>= the fit's smallest) fit the Simple tree
    m = is_tree if use_tuner else is_tree & big
    simple = m & (proto == "Simple")
    out = _tuner_form(S[m], n[m], T[m], lat_us[m], bwf[m], gpn, steps, topo, where, note, int(simple.sum()))
    out["tree_hop_s"] = fit_hop(
        S[simple], n[simple], T[simple], T_se[simple], gpn, steps, topo, graph, where, note
    )
    out["tuner"] = fixed(
        1.0 if use_tuner else 0.0,
        f"NCCL 2.20.3's tuner (calibrate/nccltuner.py) picks ring/tree as the logs did on {100 * agree:.0f} % "
        f"of the sizes judged at {scales} GPUs: "
        + (
            "it decides the algorithm"
            if use_tuner
            else f"below {100 * TUNER_AGREEMENT:.0f} %, so its tables are not this NCCL's; the algorithm the "
            "tuner's cost form (tree_lat_scale, tree_busbw_gbps) finds faster is taken"
        ),
    )
    return out


def _tuner_form(
    S, n, T, lat_us, bwf, gpn, steps, topo, where: str, note: str, n_simple: int
) -> dict[str, Param]:
    """(A, B_tree) of ``A * L_tuner + NIC bytes / (B_tree * bwf)`` on the tree sizes given."""
    bus = ncclmodel.tree_nic_bytes(S, n / gpn) * 1e-9 * ncclmodel.contention(n / gpn, topo) / bwf
    cap = ncclmodel.NCCL_TREE_BW_FACTOR * steps.segments[-1].busbw_gbps.value
    if len(T) < 3:
        # no tree regime in the data: NCCL's own tree model, scaled like the measured ring
        # (its step latency over NCCL's ring Simple hwLat, NET 14 us), busbw 0.92 x ring
        a_ring, b_tree = ncclmodel.tree_from_ring(steps.segments)
        why = f"{note}: too few to fit; default"
        return {
            "tree_lat_scale": Param(a_ring, status=DEFAULT, note=f"{why}: the ring step latency over NCCL's ring NET Simple 14 us"),
            "tree_busbw_gbps": Param(b_tree, unit="GB/s", status=DEFAULT, note=f"{why}: NCCL's tree factor 0.92 x the ring step plateau"),
            "tree_from_ring": fixed(1.0, "tree parameters follow the ring step (and its +-1 sigma band)"),
        }  # fmt: skip
    b0 = min(float(np.median(bus / T)), 0.9 * cap)
    x, se, _ = lsq(
        lambda x: np.log(x[0] * lat_us * 1e-6 + bus / x[1]) - np.log(T),
        [1.0, b0], [0.0, 1e-3], [1e4, cap], where, "all-reduce tree", len(T),
    )  # fmt: skip
    # the LL tree's bandwidth is the tuner's guess (busBw / 3.8): the tree's bandwidth is
    # taken as measured only when a Simple-protocol tree size is among the points
    if n_simple < 1 or x[1] >= cap * (1 - 1e-6) or not np.isfinite(se[1]) or se[1] > 0.5 * x[1]:
        # the tree sizes are latency-bound: their bandwidth is not in the logs
        x, se, _ = lsq(
            lambda x: np.log(x[0] * lat_us * 1e-6 + bus / cap) - np.log(T),
            [x[0]], [0.0], [1e4], where, "all-reduce tree latency", len(T),
        )  # fmt: skip
        bw = Param(cap, unit="GB/s", status=DEFAULT, note=f"{note}, {n_simple} of them Simple-protocol: default "
                   f"{ncclmodel.NCCL_TREE_BW_FACTOR} x the ring step plateau (tuning.cc tree busBw x .92)")  # fmt: skip
    else:
        bw = param(x[1], se[1], "GB/s", FITTED, "tree bandwidth per NIC direction in the tuner's cost form (2 S bytes "
                   f"beyond 2 nodes, S at 2), before NCCL's treeCorrectionFactor: times LL / LL128 trees and decides "
                   f"ring/tree without the tuner's tables, not the Simple tree's time (tree_hop_s); {n_simple} "
                   f"Simple-protocol sizes; {note}")  # fmt: skip
    return {"tree_lat_scale": param(x[0], se[0], "", FITTED, f"{LAT_WHAT}; {note}"), "tree_busbw_gbps": bw}


def fit_hop(S, n, T, T_se, gpn, steps, topo, graph, where: str, note: str) -> Param:
    """The Simple tree's per-hop cost (:func:`calibrate.ncclmodel.tree_pipeline_s`) from the
    sizes NCCL ran as a Simple-protocol tree, with the NIC rate of the ring step's plateau;
    without such a size, the ring step's own per-step latency there (a stated default)."""
    plateau = steps.segments[-1]
    bw = plateau.busbw_gbps.value
    cont = ncclmodel.contention(n / gpn, topo)
    nch = graph.n_channels
    what = (f"Simple tree per-hop cost: (chunks + 2 depth - 1) slots of this + the slot's NIC bytes at the ring "
            f"step plateau's {bw:.1f} GB/s (NCCL enqueue.cc chunks, connect.cc depth, {nch:.0f} channels); ")  # fmt: skip
    if len(S) == 0:
        return Param(plateau.alpha_s.value, unit="s", status=DEFAULT,
                     note=what + f"no Simple tree size ({note}): default, the ring step's per-step latency")  # fmt: skip

    def model(a):
        return ncclmodel.tree_pipeline_s(S, n, gpn, a, bw, cont, nch)

    zero = model(0.0)
    slots = model(1.0) - zero  # d t / d alpha: the slot count
    a0 = max(float(np.median((T - zero) / slots)), 1e-7)
    x, se, _ = lsq(
        lambda x: np.log(model(x[0])) - np.log(T), [a0], [0.0], [1.0], where, "Simple tree", len(S)
    )
    if x[0] <= 1e-9:
        what += ("at its lower bound 0: the slots' NIC bytes alone are slower than these sizes ran, so the "
                 "pipeline does not describe this transport (seen on TCP sockets); ")  # fmt: skip
    if len(S) == 1:
        # no residual degrees of freedom: the scatter of the size's repetitions, carried through,
        # and at least the model's own error as the sizes of other logs measured it
        rep = T_se[0] / slots[0] if np.isfinite(T_se[0]) else 0.0
        se = np.array([max(rep, HOP_SIZE_SPREAD * x[0])])
        what += (f"1 size: standard error the larger of its repetitions' scatter and {HOP_SIZE_SPREAD:.0%} of the "
                 "value (the spread of the per-hop cost between sizes on the NCCL 2.18 logs, a stated floor); ")  # fmt: skip
    return param(x[0], se[0], "s", FITTED, what + f"{len(S)} Simple-protocol sizes; {note}")
