"""Fit the NCCL-structured collective model (:mod:`calibrate.ncclmodel`) from nccl-tests logs.

Three fits, each from the inter-node (curve, series) pairs of one population:

1. **Ring step tau(c)** -- from all-gather (and reduce-scatter) logs mapped to chunk
   space: a point (n GPUs, size S, time T) becomes (c = S / n, tau = T / (n - 1)).
   Scales with more than two nodes are used when there are any: NCCL's tuner treats
   nNodes <= 2 apart (tuning.cc takes ``bwIntra`` and the N1/N2 columns of its bandwidth
   tables there, the N4 column beyond), so its protocol and channel choices at 2 nodes
   are not those of larger jobs.  tau is a piecewise alpha-beta curve (one regime per
   protocol/channel choice; :func:`calibrate.collectives.fit_curve`), every regime's
   latency and bandwidth with its standard error.  Without all-gather samples the
   all-reduce logs are used (2 (n - 1) steps), with a note.
2. **All-reduce**: ``min(rho * 2 (n-1) tau(S/n), A * L_nccl(nodes) + S 2(n-1)/n / B_tree)``
   over every inter-node scale, sizes >= :data:`MIN_FIT_BYTES`: rho (all-reduce step over
   all-gather step: the reduction), A (tree latency over NCCL's table) and B_tree, by
   ``scipy.optimize.least_squares`` on log-time residuals with a soft-L1 loss (NCCL's
   tuner sometimes picks the slower algorithm; one such size must not drag the fit); the
   Simple-protocol tree's per-hop cost for its pipeline (:mod:`calibrate.treefit`).
3. **All-to-all**: ``(n-1) l_peer + gpn S (n-gpn)/n / B_node * contention(nodes)``: l_peer
   and B_node fitted on every inter-node scale, the contention factor fixed from the
   system spec's topology.

Reduce-scatter (without samples), broadcast, reduce and send/recv are derived from tau
with a note.  Standard errors come from the Jacobian: sigma^2 (J^T J)^-1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from calib.calibrate import ncclmodel, ringfill, treefit
from calib.calibrate.calibration import (
    FITTED,
    FIXED,
    CollectiveCurve,
    FitQuality,
    NetworkScaling,
    Param,
)
from calib.calibrate.collectives import SizeSeries, fit_curve
from calib.calibrate.netparams import fixed, lsq, param

from calib.core.collective_names import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE,
    REDUCESCATTER,
    SENDRECV,
    busbw_factor,
)
from calib.core.errors import InputError

MIN_FIT_BYTES = 256 * 1024.0
TREE_RATIO = treefit.TREE_RATIO
S_REF = float(2**30)
Pair = tuple[CollectiveCurve, SizeSeries]


def fit_nccl(
    pairs: Mapping[str, Sequence[Pair]],
    *,
    where: str,
    topology: Mapping[str, float] | None = None,
    topology_note: str = "",
) -> tuple[dict[str, NetworkScaling], list[str]]:
    """The model per collective (``form="nccl"``) and notes; inter-node scales only."""
    inter = {
        c: sorted((p for p in ps if p[0].n_nodes > 1), key=lambda p: p[0].n_gpus) for c, ps in pairs.items()
    }
    inter = {c: ps for c, ps in inter.items() if ps}
    if not inter:
        return {}, []
    notes: list[str] = []
    gpn = int(next(iter(inter.values()))[0][0].gpus_per_node)
    step_src = [c for c in (ALLGATHER, REDUCESCATTER) if c in inter] or [
        c for c in (ALLREDUCE,) if c in inter
    ]
    out: dict[str, NetworkScaling] = {}
    steps = None
    if step_src:
        steps, used = _fit_steps([p for c in step_src for p in inter[c]], where)
        if step_src == [ALLREDUCE]:
            notes.append(
                "no all-gather/reduce-scatter samples: the ring step curve comes from the all-reduce logs "
                "read as rings (2(n-1) steps); where NCCL ran a tree there, it is optimistic"
            )
        marg, marg_params = ringfill.fit_marginal(inter, min_bytes=MIN_FIT_BYTES, tree_ratio=TREE_RATIO)
        for coll in (ALLGATHER, REDUCESCATTER):
            base = {"gpus_per_node": fixed(gpn, "from the nccl-tests rank lines"), **marg_params}
            derived = coll not in inter
            src = inter.get(coll) or inter.get(ALLGATHER) or inter.get(REDUCESCATTER) or inter[ALLREDUCE]
            out[coll] = _scaling(coll, base, steps, src, gpn, derived=derived, used=used, marginal=marg)
    if ALLREDUCE in inter and steps is not None:
        out[ALLREDUCE] = _fit_allreduce(
            inter[ALLREDUCE], steps, gpn, where, topology or {}, topology_note, marg, marg_params
        )
    if ALLTOALL in inter:
        out[ALLTOALL] = _fit_alltoall(inter[ALLTOALL], gpn, where, topology or {}, topology_note)
    if steps is not None:
        src = inter.get(ALLGATHER) or next(iter(inter.values()))
        for coll in (BROADCAST, REDUCE, SENDRECV):
            base = {"gpus_per_node": fixed(gpn, "from the nccl-tests rank lines")}
            if coll != SENDRECV:
                base["pipeline_bytes"] = fixed(
                    ncclmodel.NCCL_SIMPLE_STEP_BYTES,
                    "NCCL Simple step (buffSize 4 MiB / NCCL_STEPS 8): the chain forwards pieces of this size",
                    unit="B",
                )
            out[coll] = _scaling(coll, base, steps, src, gpn, derived=coll not in inter, used="")
    derived = [c for c in ncclmodel.MODELLED if c in out and out[c].params["derived"].value > 0]
    if derived:
        notes.append(
            f"no samples for {', '.join(derived)}: derived from the fitted ring step curve "
            f"({steps.source if steps is not None else '-'}) with NCCL's step counts"
        )
    return out, notes


# ---- tau(c): the ring step ----------------------------------------------------------------
def _fit_steps(pairs: Sequence[Pair], where: str) -> tuple[CollectiveCurve, str]:
    big = [p for p in pairs if p[0].n_nodes > 2]
    use = big or list(pairs)
    c_all, t_all = [], []
    for _, s in use:
        k = ncclmodel.ring_steps(s.collective, s.n_gpus)
        c_all.append(s.bytes / s.n_gpus)
        t_all.append(s.time_s / k)
    c, t = np.concatenate(c_all), np.concatenate(t_all)
    order = np.argsort(c, kind="stable")
    used = ", ".join(f"{s.collective} {s.n_nodes} nodes" for _, s in use)
    series = SizeSeries(
        collective=SENDRECV,
        n_gpus=2,
        n_nodes=2,
        gpus_per_node=1,
        bytes=c[order],
        time_s=t[order],
        n_samples=int(sum(s.n_samples for _, s in use)),
        source=f"ring steps of {used}",
    )
    if len(c) < 3:
        raise InputError(where, f"ring step curve needs >= 3 message sizes, got {len(c)} ({used})")
    return fit_curve(series), used


def _scaling(
    coll: str,
    params: dict[str, Param],
    steps: CollectiveCurve,
    src: Sequence[Pair],
    gpn: int,
    *,
    derived: bool,
    used: str,
    quality: FitQuality | None = None,
    marginal: CollectiveCurve | None = None,
) -> NetworkScaling:
    params = {
        **params,
        "s_ref_bytes": fixed(S_REF, "reference message of eff_{g->n}", unit="B"),
        "derived": Param(
            1.0 if derived else 0.0,
            status=FIXED,
            note=(
                f"no {coll} samples: derived from the fitted ring step curve ({steps.source})"
                if derived
                else f"ring step curve fitted on {used}"
                if used
                else ""
            ),
        ),
    }
    ns = NetworkScaling(
        collective=coll,
        form=ncclmodel.FORM,
        g_gpus=int(src[0][0].n_gpus),
        params=params,
        quality=quality if quality is not None else steps.quality,
        segments=steps.segments,
        fill_segments=marginal.segments if marginal is not None else (),
    )
    meas = () if derived else _measured_eff(coll, src)
    from dataclasses import replace

    return replace(ns, measured=meas)


def _measured_eff(coll: str, src: Sequence[Pair]) -> tuple[tuple[int, float], ...]:
    s_ref = min(float(s.bytes.max()) for _, s in src)
    out, base = [], None
    for _, s in src:
        i = np.flatnonzero(s.bytes == s_ref)
        if not len(i):
            continue
        busbw = s_ref * float(busbw_factor(coll, s.n_gpus)) / s.time_s[i[0]]
        base = busbw if base is None else base
        out.append((int(s.n_gpus), float(busbw / base)))
    return tuple(out)


def _quality(r_log: np.ndarray, y: np.ndarray, note: str) -> FitQuality:
    rel = np.exp(-r_log) - 1.0  # busbw pred / meas - 1 = t_meas / t_pred - 1
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return FitQuality(
        n_points=int(len(r_log)),
        r2=1.0 - float(np.sum(r_log**2)) / ss_tot if ss_tot > 0 else None,
        rmse=float(np.sqrt(np.mean(rel**2))),
        max_abs_rel_err=float(np.max(np.abs(rel))),
        residuals=tuple(float(x) for x in rel),
        note=note,
    )


def _points(pairs: Sequence[Pair], min_bytes: float):
    """(GPUs, bytes, time, time's standard error or nan) of every size >= ``min_bytes``."""
    n, S, T, se = [], [], [], []
    for _, s in pairs:
        m = s.bytes >= min_bytes
        if m.sum() < 3:
            m = np.ones(len(s.bytes), bool)
        n.append(np.full(int(m.sum()), float(s.n_gpus)))
        S.append(s.bytes[m])
        T.append(s.time_s[m])
        se.append(s.time_se_s[m] if s.time_se_s is not None else np.full(int(m.sum()), np.nan))
    return np.concatenate(n), np.concatenate(S), np.concatenate(T), np.concatenate(se)


def _fit_allreduce(
    pairs: Sequence[Pair],
    steps: CollectiveCurve,
    gpn: int,
    where: str,
    topo: Mapping[str, float],
    topo_note: str,
    marg: CollectiveCurve | None = None,
    marg_params: Mapping[str, Param] | None = None,
) -> NetworkScaling:
    """rho from the sizes the ring explains; (A, B_tree) from those it cannot (the tree's);
    whether NCCL's tuner (:mod:`calibrate.nccltuner`) reproduces the logged choices."""
    n, S, T, T_se = _points(pairs, 0.0)
    marg_params = dict(marg_params or {})
    marg_segs = marg.segments if marg is not None else ()
    f_marg = {k: v.value for k, v in marg_params.items()}
    ring0 = ncclmodel.ring_time_s(
        steps.segments, marg_segs, f_marg, ncclmodel.ring_steps(ALLREDUCE, n), S / n
    )
    ratio = T / ring0
    is_tree = ratio < TREE_RATIO
    big = S >= MIN_FIT_BYTES
    rr = ratio[big & ~is_tree] if (big & ~is_tree).sum() >= 2 else ratio[big]
    rho, se_rho = float(np.median(rr)), float(np.std(rr) / np.sqrt(max(len(rr) - 1, 1)))
    nic = float(topo.get("node_nic_gbps", 0.0))
    graph = ncclmodel.tuner_graph({"tuner_busbw_gbps": nic}, steps.segments)
    tree = treefit.fit_tree(S, n, T, T_se, is_tree, big, gpn, steps, topo, graph, where)
    scales = sorted({int(v) for v in n})
    params = {
        "gpus_per_node": fixed(gpn, "from the nccl-tests rank lines"),
        "ring_step_ratio": param(
            rho,
            se_rho,
            "",
            FITTED,
            "all-reduce ring step over the all-gather ring step "
            f"(median over the {len(rr)} ring-regime sizes >= {MIN_FIT_BYTES / 1024:.0f} KiB)",
        ),  # fmt: skip
        **_topology_params(topo, topo_note),
        **marg_params,
        **tree,
        "tuner_busbw_gbps": fixed(
            graph.busbw_gbps,
            "NCCL graph bandwidth for its tuner: "
            + (
                "the node's NICs (hardware spec node_nic_gbps)"
                if nic > 0
                else "no NIC bandwidth in the system spec; default: the ring step plateau"
            ),
            unit="GB/s",
        ),  # fmt: skip
    }
    ns = _scaling(ALLREDUCE, params, steps, pairs, gpn, derived=False, used="", marginal=marg)
    t_pred, _ = ns.model_time_s(S[big], n[big])
    r = np.log(t_pred) - np.log(T[big])
    q = _quality(
        r, np.log(T[big]), f"ring or tree as chosen, sizes >= {MIN_FIT_BYTES / 1024:.0f} KiB at {scales} GPUs"
    )
    from dataclasses import replace

    return replace(ns, quality=q)


def _fit_alltoall(
    pairs: Sequence[Pair], gpn: int, where: str, topo: Mapping[str, float], topo_note: str
) -> NetworkScaling:
    n, S, T, _ = _points(pairs, 0.0)
    node_bytes = gpn * S * np.maximum(n - gpn, 0.0) / n * 1e-9
    cont = ncclmodel.contention(n / gpn, topo)

    ll = S / n <= ncclmodel.NCCL_P2P_LL_THRESHOLD_BYTES
    split = ll.sum() >= 2 and (~ll).sum() >= 2  # both protocols seen: one per-peer cost each

    def resid(x):
        peer = np.where(ll, x[2], x[0]) if split else x[0]
        return np.log((n - 1.0) * peer + node_bytes / x[1] * cont) - np.log(T)

    bw0 = float(np.median(node_bytes / T))
    x0, lo, hi = (
        ([1e-5, bw0, 1e-5], [0.0, 1e-3, 0.0], [1.0, 1e4, 1.0])
        if split
        else ([1e-5, bw0], [0.0, 1e-3], [1.0, 1e4])
    )
    x, se, r = lsq(resid, x0, lo, hi, where, "all-to-all", len(T))
    scales = sorted({int(v) for v in n})
    thr = f"{ncclmodel.NCCL_P2P_LL_THRESHOLD_BYTES / 1024:.0f} KiB (enqueue.cc P2P_LL_THRESHOLD)"
    params = {
        "gpus_per_node": fixed(gpn, "from the nccl-tests rank lines"),
        "per_peer_s": param(
            x[0],
            se[0],
            "s",
            FITTED,
            f"cost per peer (n - 1 peers), Simple: per-peer message > {thr}"
            if split
            else "cost per peer (n - 1 peers)",
        ),  # fmt: skip
        "node_busbw_gbps": param(x[1], se[1], "GB/s", FITTED, "bytes leaving a node per second (its NICs)"),
        **_topology_params(topo, topo_note),
    }
    if split:
        params["per_peer_ll_s"] = param(
            x[2], se[2], "s", FITTED, f"cost per peer, LL: per-peer message <= {thr}"
        )
        params["p2p_ll_threshold_bytes"] = fixed(ncclmodel.NCCL_P2P_LL_THRESHOLD_BYTES, thr, unit="B")
    q = _quality(r, np.log(T), f"per-peer cost + node NIC bytes at {scales} GPUs, all sizes")
    return _scaling(ALLTOALL, params, _no_steps(), pairs, gpn, derived=False, used="", quality=q)


def _topology_params(topo: Mapping[str, float], note: str) -> dict[str, Param]:
    src = note or "no topology in the system spec: no contention term"
    return {
        "topology": fixed(float(topo.get("topology", 0.0)), f"0 none, 1 dragonfly, 2 fat tree; {src}"),
        "nodes_per_group": fixed(float(topo.get("nodes_per_group", 0.0)), src),
        "global_taper": fixed(float(topo.get("global_taper", 1.0)), src),
    }


def _no_steps() -> CollectiveCurve:
    p = Param(0.0, status=FIXED)
    return CollectiveCurve(SENDRECV, 2, 2, 1, alpha_s=p, busbw_gbps=p, source="")
