"""Placement of parallel groups on NVLink domains (seed 002: "placement of GPUs matters").

Ranks are numbered with the parallel dimensions nested in a chosen order, innermost first
(Megatron's default is TP, then CP, EP, DP, PP outermost).  A group of dimension X with size
n has its members ``stride`` = product of the inner dimensions apart, so
k = min(n, max(1, domain // stride)) of them share one NVLink domain of ``domain`` GPUs
(4, 8 or 72: a Perlmutter node, a DGX, an NVL72 rack).  A group with k = n stays inside the
domain and communicates at the scale-up bus bandwidth; a group that crosses domains runs at
the network bandwidth of its k members' NICs (NCCL runs a ring per NIC rail): k x the per-GPU
share of the node's NICs, ``inter_busbw_gbps * k / gpus_per_node``, capped by the scale-up one.

Communication per iteration (per GPU, bytes; seed 002's volumes and Megatron's):
TP 4 all-gathers + 4 reduce-scatters of b s d per layer and micro-batch (sequence parallel,
forward and backward), CP 2 all-gathers of the K, V shards (b s d / cp each) per layer and
micro-batch, forward and backward, EP 4 all-to-alls of b s d per MoE layer and micro-batch,
DP one all-reduce of the stage's fp16 gradients, PP 2 sends of b s d / tp per micro-batch.
Ring times: AG / RS (n-1)/n V / busbw, AR twice that, all-to-all (n-1)/n V / busbw.
"""

from __future__ import annotations

from itertools import permutations

import numpy as np

DIMS = ("tp", "cp", "ep", "dp", "pp")
DOMAINS = (4, 8, 72)


def members_in_domain(sizes: dict, order: tuple[str, ...], domain: int) -> dict:
    """k per dimension: members of one group inside one NVLink domain (sizes: ints or arrays)."""
    out, stride = {}, 1
    for dim in order:
        n = np.asarray(sizes.get(dim, 1))
        k = np.where(stride < domain, np.minimum(n, np.maximum(1, domain // np.maximum(stride, 1))), 1)
        out[dim] = int(k) if k.ndim == 0 else k
        stride = stride * n
    return out


def group_bandwidth(sizes: dict, order: tuple[str, ...], domain: int, hw) -> dict[str, dict]:
    """Per dimension: its size, members per domain, the level it crosses and the busbw it gets."""
    k = members_in_domain(sizes, order, domain)
    out = {}
    nic = hw.inter_busbw_gbps / hw.gpus_per_node  # each GPU's share of its node's NICs
    for dim in order:
        n = np.asarray(sizes.get(dim, 1))
        inside = np.asarray(k[dim]) >= n
        bw = np.where(inside, hw.intra_busbw_gbps, np.minimum(hw.intra_busbw_gbps, nic * np.asarray(k[dim])))
        scalar = n.ndim == 0 and inside.ndim == 0
        out[dim] = {
            "size": int(n) if scalar else n,
            "in_domain": k[dim],
            "level": ("nvlink" if inside else "network") if scalar else inside,  # arrays: True inside NVLink
            "busbw_gbps": float(bw) if scalar else bw,
        }
    return out


def comm_seconds(model, sizes: dict, order, domain: int, hw, micro_batch, microbatches,
                 params_per_gpu, moe_layers: int = 0) -> dict:  # fmt: skip
    """Seconds of each dimension's communication per iteration under one placement
    (scalars, or arrays of layouts: ``sizes`` values, micro-batch, micro-batches and
    parameters broadcast together)."""
    g = group_bandwidth(sizes, tuple(order), domain, hw)
    s, d, L = model.seq_len, model.d_model, model.n_layers
    tp, cp, pp = (np.asarray(sizes.get(x, 1), dtype=float) for x in ("tp", "cp", "pp"))
    act = (
        2.0 * np.asarray(micro_batch, dtype=float) * s * d / cp
    )  # bytes of one b s d activation on a CP shard
    lps, m = L / pp, np.asarray(microbatches, dtype=float)

    def ring(dim, v, factor=1.0):
        n = np.asarray(g[dim]["size"], dtype=float)
        return np.where(n <= 1, 0.0, factor * (n - 1) / n * v / (np.asarray(g[dim]["busbw_gbps"]) * 1e9))

    out = {
        "tp": m * lps * 8.0 * ring("tp", act),
        "cp": m * lps * 2.0 * 2.0 * ring("cp", act / tp),
        "ep": m * moe_layers / pp * 4.0 * ring("ep", act),
        "dp": ring("dp", 2.0 * np.asarray(params_per_gpu, dtype=float), 2.0),
        "pp": np.where(pp <= 1, 0.0, m * 2.0 * act / tp / (np.asarray(g["pp"]["busbw_gbps"]) * 1e9)),
    }
    if all(np.ndim(np.asarray(x)) == 0 for x in (*sizes.values(), micro_batch, microbatches, params_per_gpu)):
        return {k: float(v) for k, v in out.items()}
    return out


def orders(sizes: dict[str, int]) -> list[tuple[str, ...]]:
    """Distinct placements: orders of the dimensions larger than 1 (size-1 ones appended)."""
    big = [d for d in DIMS if sizes.get(d, 1) > 1]
    rest = tuple(d for d in DIMS if d not in big)
    return [tuple(p) + rest for p in permutations(big)]


def best_placement(model, sizes, domain, hw, micro_batch, microbatches, params_per_gpu, moe_layers=0):
    """Every placement of ``sizes`` ranked by total communication seconds (the search's placement axis)."""
    rows = []
    for order in orders(sizes):
        c = comm_seconds(
            model, sizes, order, domain, hw, micro_batch, microbatches, params_per_gpu, moe_layers
        )
        g = group_bandwidth(sizes, order, domain, hw)
        rows.append({"order": ">".join(d for d in order if sizes.get(d, 1) > 1) or "-", "comm_s": sum(c.values()),
                     **{f"{k}_s": v for k, v in c.items()},
                     **{f"{k}_in_domain": g[k]["in_domain"] for k in g if sizes.get(k, 1) > 1}})  # fmt: skip
    rows.sort(key=lambda r: r["comm_s"])
    return rows


def placement_map(sizes: dict[str, int], order, domain: int, n_domains: int = 2) -> dict[str, np.ndarray]:
    """Group coordinates of the ranks of the first ``n_domains`` NVLink domains, one
    (n_domains, domain) array per dimension (for the report's placement map)."""
    ranks = np.arange(domain * n_domains)
    out, stride = {}, 1
    for dim in order:
        n = int(sizes.get(dim, 1))
        out[dim] = ((ranks // stride) % n).reshape(n_domains, domain)
        stride *= n
    return out


GRID_DIMS = ("tp", "cp", "dp", "pp")  # EP folds into TP x CP x DP (its all-to-alls are not placed here)
BASE_ORDER = ("tp", "cp", "dp", "pp", "ep")  # Megatron's ranks: what the time model's node placement assumes


def layout_terms(model, system, lay: dict, B: int, domain: int, tp2d_kind=0) -> dict:
    """Placement terms of 1-D layout arrays (tp, cp, dp, pp, micro_batch[, tp_c]), vectorised.

    For every order of the dimensions larger than 1 somewhere in ``lay``: ``nd`` (orders, n) the
    TP + CP + PP seconds under that placement minus under the time model's (TP innermost on nodes
    of the hardware spec), ``dd`` the same for the DP all-reduce, ``tot`` the placed total; and
    ``dp_base`` (n,) the base DP seconds, to scale ``dd`` by the share the time model exposes."""
    from calib.analytic.timemodel import attention_proj_params, shape_terms, stage_params
    from calib.analytic.tp2d import weight_split

    hw = system.hw
    ffn, kv, mats, tied = shape_terms(model)
    t, p = lay["tp"], lay["pp"]
    tw = weight_split(t, lay.get("tp_c", 1), tp2d_kind)
    P = stage_params(
        model.d_model,
        model.n_layers,
        model.seq_len,
        model.vocab,
        tw,
        p,
        ffn,
        kv,
        mats,
        tied,
        attention_proj_params(model),
    )
    m = B // (lay["dp"] * lay["micro_batch"])
    sizes = {k: np.asarray(lay.get(k, 1)) for k in GRID_DIMS}
    args = (hw, lay["micro_batch"], m, P)
    base = comm_seconds(model, sizes, BASE_ORDER, hw.gpus_per_node, *args)
    big = [k for k in GRID_DIMS if np.any(sizes[k] > 1)]
    orders_ = [tuple(o) + tuple(k for k in BASE_ORDER if k not in o) for o in permutations(big)]
    nd, dd, tot = [], [], []
    for order in orders_:
        c = comm_seconds(model, sizes, order, domain, *args)
        nd.append(sum(c[k] - base[k] for k in ("tp", "cp", "pp")))
        dd.append(c["dp"] - base["dp"])
        tot.append(sum(c.values()))
    n = np.shape(t)
    stack = lambda xs: np.stack([np.broadcast_to(x, n) for x in xs])  # noqa: E731
    return {"orders": orders_, "nd": stack(nd), "dd": stack(dd), "tot": stack(tot),
            "dp_base": np.broadcast_to(base["dp"], n), "sizes": sizes}  # fmt: skip


def best_delta(terms: dict, dp_exposed, col=lambda x: x, want_order: bool = True):
    """Per strategy: the smallest placed-minus-base time over the orders, and which order (None
    unless ``want_order``).  ``dp_exposed`` (strategy grid) scales the DP difference by the share
    the time model exposes; ``col`` lifts a layout array onto the grid."""
    base = col(terms["dp_base"])
    frac = np.minimum(1.0, dp_exposed / np.where(base > 0, base, np.inf))
    best = arg = None
    for o in range(len(terms["orders"])):
        v = col(terms["nd"][o]) + frac * col(terms["dd"][o])
        if best is None:
            best = v
            arg = np.zeros(np.shape(v), dtype=np.int64) if want_order else None
            continue
        if want_order:
            arg = np.where(v < best, o, arg)
        np.minimum(best, v, out=best)
    return best, arg


def order_label(order, sizes: dict, i: int) -> str:
    return (
        ">".join(
            d
            for d in order
            if np.asarray(sizes.get(d, 1)).reshape(-1)[min(i, np.size(sizes.get(d, 1)) - 1)] > 1
        )
        or "-"
    )


def placement_search(model, system, gpus, global_batch: int, space, domain: int, top: int = 10):
    """The search with placement as one more axis over the whole grid (``Space.nvlink_domain``):
    every strategy's iteration time + the best placement's change of its TP/CP/PP communication
    and of its exposed DP share, ranked by that placed time (see :func:`layout_terms`)."""
    from dataclasses import replace

    from calib.analytic.search import search

    res = search(model, system, gpus, global_batch, replace(space, nvlink_domain=domain), top=top)
    df = res.top
    df.attrs.update(n_strategies=res.n_strategies, n_feasible=res.n_feasible, seconds=res.seconds)
    return df
