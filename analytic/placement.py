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


def members_in_domain(sizes: dict[str, int], order: tuple[str, ...], domain: int) -> dict[str, int]:
    """k per dimension: members of one group inside one NVLink domain."""
    out, stride = {}, 1
    for dim in order:
        n = int(sizes.get(dim, 1))
        out[dim] = int(min(n, max(1, domain // stride))) if stride < domain else 1
        stride *= n
    return out


def group_bandwidth(sizes: dict[str, int], order: tuple[str, ...], domain: int, hw) -> dict[str, dict]:
    """Per dimension: its size, members per domain, the level it crosses and the busbw it gets."""
    k = members_in_domain(sizes, order, domain)
    out = {}
    for dim in order:
        n = int(sizes.get(dim, 1))
        inside = k[dim] >= n
        nic = hw.inter_busbw_gbps / hw.gpus_per_node  # each GPU's share of its node's NICs
        bw = hw.intra_busbw_gbps if inside else min(hw.intra_busbw_gbps, nic * k[dim])
        out[dim] = {
            "size": n,
            "in_domain": k[dim],
            "level": "nvlink" if inside else "network",
            "busbw_gbps": bw,
        }
    return out


def comm_seconds(model, sizes: dict[str, int], order, domain: int, hw, micro_batch: int, microbatches: int,
                 params_per_gpu: float, moe_layers: int = 0) -> dict[str, float]:  # fmt: skip
    """Seconds of each dimension's communication per iteration under one placement."""
    g = group_bandwidth(sizes, tuple(order), domain, hw)
    s, d, L = model.seq_len, model.d_model, model.n_layers
    tp, cp, pp = (int(sizes.get(x, 1)) for x in ("tp", "cp", "pp"))
    act = 2.0 * micro_batch * s * d / cp  # bytes of one b s d activation on this CP shard
    lps, m = L / pp, microbatches

    def ring(dim, v, factor=1.0):
        n = g[dim]["size"]
        return 0.0 if n <= 1 else factor * (n - 1) / n * v / (g[dim]["busbw_gbps"] * 1e9)

    return {
        "tp": m * lps * 8.0 * ring("tp", act),
        "cp": m * lps * 2.0 * 2.0 * ring("cp", act / tp),
        "ep": m * moe_layers / pp * 4.0 * ring("ep", act),
        "dp": ring("dp", 2.0 * params_per_gpu, 2.0),
        "pp": 0.0 if pp <= 1 else m * 2.0 * act / tp / (g["pp"]["busbw_gbps"] * 1e9),
    }


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


def placement_search(
    model, system, gpus, global_batch: int, space, domain: int, top: int = 10, pool: int = 200
):
    """The search with placement as one more axis: the ``pool`` fastest strategies of the
    vectorised search (Megatron's TP-innermost placement, nodes of the hardware spec), each
    re-timed under every placement of its groups on NVLink domains of ``domain`` GPUs:
    iteration time + (communication under the placement - under TP > DP > PP on the hardware
    spec's nodes), re-ranked.  The difference uses this module's ring model for both terms; the
    DP part counts with the exposed share the time model gives it (overlap)."""
    import pandas as pd
    from calib.analytic.search import search
    from calib.analytic.timemodel import shape_terms, stage_params

    res = search(model, system, gpus, global_batch, space, top=pool)
    if res.top.empty:
        return res.top
    ffn, kv, mats, tied = shape_terms(model)
    rows = []
    for r in res.top.itertuples(index=False):
        # CP / EP sizes once the strategies carry them (EP is modelled as its own dimension)
        sizes = {"tp": int(r.tp), "pp": int(r.pp), "dp": int(r.dp),
                 "cp": int(getattr(r, "cp", 1)), "ep": int(getattr(r, "ep", 1))}  # fmt: skip
        P = float(
            stage_params(
                model.d_model, model.n_layers, model.seq_len, model.vocab, r.tp, r.pp, ffn, kv, mats, tied
            )
        )
        args = (int(r.micro_batch), int(r.microbatches), P)
        base = comm_seconds(
            model, sizes, ("tp", "dp", "pp", "cp", "ep"), system.hw.gpus_per_node, system.hw, *args
        )
        # the DP collectives hide under compute as far as the time model says they do
        frac = min(1.0, r.dp_exposed_s / base["dp"]) if base["dp"] > 0 else 0.0
        best = None
        for order in orders(sizes):
            c = comm_seconds(model, sizes, order, domain, system.hw, *args)
            t = (
                r.iter_s
                + sum(c[k] - base[k] for k in ("tp", "pp", "cp", "ep"))
                + frac * (c["dp"] - base["dp"])
            )
            if best is None or t < best[0]:
                best = (t, ">".join(d for d in order if sizes.get(d, 1) > 1), sum(c.values()))
        rows.append({**r._asdict(), "placement": best[1], "nvlink_domain": domain,
                     "iter_placed_s": best[0], "comm_placed_s": best[2]})  # fmt: skip
    df = pd.DataFrame(rows).sort_values("iter_placed_s", kind="stable").head(top).reset_index(drop=True)
    df["rank"] = range(1, len(df) + 1)
    return df
