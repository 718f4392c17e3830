"""NCCL's structure for collective times across nodes: algorithms, per-step costs, the choice.

What NCCL does (``src/graph/tuning.cc`` and ``src/enqueue.cc``, 2.18-2.21), and how this
model follows it:

* **Ring** (all-gather, reduce-scatter, all-reduce; broadcast and reduce as a pipelined
  chain).  A ring collective over n ranks is ``nsteps`` dependent steps -- n - 1 for
  all-gather and reduce-scatter, 2 (n - 1) for all-reduce -- and in every step each
  rank sends one per-rank chunk c = S / n to its neighbour; a step cannot start before
  the previous one delivered.  The tuner's ring cost is ``nsteps`` x per-hop latency +
  bytes / bandwidth, i.e. per step: latency + c / busbw.  Its protocol (LL, LL128,
  Simple) and channel count (fewer channels while ``nBytes < nChannels x nThreads x
  threshold x nRanks``) therefore depend on the chunk c alone once n is large (the
  tuner's constant ``baseLat`` is shared by all n - 1 steps).  So the time of one ring
  step is a function tau(c) of the chunk -- piecewise alpha-beta, one regime per
  protocol/channel choice -- that does not depend on n, and
  ``t_ring(n, S) = nsteps(n) * tau(S / n)`` -- except that tau, read at the fitted
  scale, carries that ring's once-only pipeline fill and drain: steps beyond the fitted
  scale's cost tau - L0 / fill_steps (:func:`ring_time_s`, :mod:`calibrate.ringfill`).
  tau is fitted from nccl-tests logs in chunk space (:mod:`calibrate.netfit`).  Every ring
  step crosses a node boundary when gpus_per_node < n (the ring leaves each node once per
  channel), so the step runs at the NIC level; inside a node the NVLink curves apply
  (``Calibration.collective_time_s``).
* **Tree** (all-reduce only; NCCL's double binary tree across nodes, a chain inside each
  node).  Simple protocol: a pipeline (:func:`tree_pipeline_s`).  NCCL cuts each channel's
  share into chunks (``enqueue.cc``: 512 KiB, halved while the message is short of 8, 4, 1
  chunks per tree level) and every chunk climbs ``depth`` hops and comes back down
  (``connect.cc``: depth = ranks per node - 1 + log2i(nodes)): (chunks + 2 depth - 1)
  slots, each a per-hop cost ``alpha_hop`` (fitted) plus the slot's NIC bytes
  (:func:`tree_nic_bytes` per byte: 1 at 2 nodes, 2 beyond) at the NIC rate the ring step
  reaches.  Small chunks make mid-size trees slow; 512 KiB chunks bring a large tree close
  to the ring's bandwidth, as NCCL's own tuner assumes (tree busBw = 0.92 x ring's).
  LL / LL128: ``A * L_tuner + NIC bytes / (B_tree * share * treeCorrectionFactor)`` with
  the latency, protocol share and correction of the protocol NCCL's tuner picks
  (:func:`calibrate.nccltuner.tree_parts`) and a fitted scale A.  A tree's neighbours
  (node i and nodes 2i, 2i+1) lie anywhere in the machine, like all-to-all peers and
  unlike a ring's, so its bytes get the topology's contention factor too.
* **The choice**: NCCL takes the algorithm/protocol of least *modelled* time in its own
  table; :mod:`calibrate.nccltuner` emulates it and decides where it reproduces the
  fitted logs' choices, else the least of the fitted ring and tree times is taken.  NVLS
  and CollNet need NVSwitch multicast / SHARP; a system whose spec has neither never uses
  them (Polaris: neither), and no sample could calibrate them, so they are not modelled.
* **All-to-all** (n - 1 point-to-point exchanges of S / n, all posted at once): one
  per-peer cost for each of the n - 1 peers -- l_LL while the per-peer message S / n is
  within NCCL's P2P LL threshold (16 KiB), l_peer above (Simple) -- plus the bytes leaving each node,
  ``gpn * S * (n - gpn) / n``, over the node's effective NIC bandwidth B_node, slowed
  by the topology's contention factor (:func:`contention`).
* **Send/recv**: one hop, tau(S).

Every function is vectorised over message sizes S (nccl-tests "size") and GPU counts n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from calib.calibrate import nccltuner
from numpy.typing import ArrayLike

from calib.core.collective_names import (
    ALLGATHER,
    ALLREDUCE,
    ALLTOALL,
    BROADCAST,
    REDUCE,
    REDUCESCATTER,
    SENDRECV,
)

FORM = "nccl"

#: tuning.cc (2.20.3, NVIDIA/nccl b6475625): tree busBw = ring's x .92 at most
NCCL_TREE_BW_FACTOR = 0.92
#: tuning.cc (2.20.3) hwLat[NCCL_HW_NET][NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] (us)
NCCL_RING_NET_LAT_US = 14.0
#: NCCL's Simple-protocol step: buffSize 4 MiB / NCCL_STEPS 8 = 512 KiB per channel; a
#: broadcast/reduce chain forwards the message in pieces of this size
NCCL_SIMPLE_STEP_BYTES = 512 * 1024.0
#: enqueue.cc ``NCCL_PARAM(P2pLLThreshold, "P2P_LL_THRESHOLD", 16384)`` (2.14+): a send/recv
#: of at most this many bytes runs the LL protocol, a larger one Simple
NCCL_P2P_LL_THRESHOLD_BYTES = 16384.0

MIN_PIECE_BYTES = 4096.0  # smallest piece a chain splits a message into
TOPOLOGY_CODES = {"none": 0.0, "dragonfly": 1.0, "fat-tree": 2.0}

RING_COLLECTIVES = (ALLGATHER, REDUCESCATTER)
CHAIN_COLLECTIVES = (BROADCAST, REDUCE)
MODELLED = (ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, BROADCAST, REDUCE, SENDRECV)


def ring_steps(collective: str, n: ArrayLike) -> np.ndarray:
    """Dependent ring steps (tuning.cc ``nsteps``): 2(n-1) for all-reduce, n-1 otherwise."""
    n = np.asarray(n, dtype=float)
    return 2.0 * (n - 1.0) if collective == ALLREDUCE else n - 1.0


def contention(nodes: ArrayLike, p: Mapping[str, float]) -> np.ndarray:
    """Slow-down of all-to-all bytes from the topology named in the system spec (>= 1).

    Dragonfly (groups joined by global links) and fat tree (leaf switches joined by a
    tapered upper level) alike: under uniform all-to-all a fraction
    f = 1 - nodes_per_group / nodes of each node's bytes leaves its group, and the
    upper level carries ``global_taper`` x the injection bandwidth per node, so once
    f > taper those bytes run at taper / f of the NIC speed.  No topology: 1.
    """
    nodes = np.asarray(nodes, dtype=float)
    if p.get("topology", 0.0) <= 0 or p.get("nodes_per_group", 0.0) <= 0:
        return np.ones_like(nodes)
    f = np.clip(1.0 - p["nodes_per_group"] / np.maximum(nodes, 1.0), 0.0, 1.0)
    return np.maximum(1.0, f / max(p.get("global_taper", 1.0), 1e-9))


def shifted_segments(segments: Sequence, shift: float) -> tuple:
    """Segments with every latency raised and bandwidth lowered by ``shift`` standard errors
    (shift < 0: the fast side).  Parameters without a standard error stay put."""
    from dataclasses import replace

    if not shift:
        return tuple(segments)
    out = []
    for s in segments:
        a, b = s.alpha_s, s.busbw_gbps
        a_v = max(a.value + shift * (a.stderr or 0.0), 0.0)
        b_v = max(b.value - shift * (b.stderr or 0.0), 1e-3 * b.value)
        out.append(replace(s, alpha_s=replace(a, value=a_v), busbw_gbps=replace(b, value=b_v)))
    return tuple(out)


def step_time_s(segments: Sequence, chunk: ArrayLike) -> np.ndarray:
    """tau(c): seconds of one ring step whose per-rank chunk is ``chunk`` bytes."""
    from calib.calibrate.curves import CollectiveCurve

    curve = CollectiveCurve(
        collective=SENDRECV,
        n_gpus=2,
        n_nodes=2,
        gpus_per_node=1,
        alpha_s=segments[0].alpha_s,
        busbw_gbps=segments[-1].busbw_gbps,
        segments=tuple(segments),
    )
    c = np.maximum(np.asarray(chunk, dtype=float), 1.0)
    return curve.time_s(c)


def _v(p: Mapping, key: str, shift: float, sign: float = 1.0) -> float:
    """Parameter value moved by ``shift`` standard errors (``sign`` -1: larger is faster)."""
    prm = p[key]
    if isinstance(prm, (int, float)):
        return float(prm)
    se = prm.stderr if prm.stderr is not None and np.isfinite(prm.stderr) else 0.0
    return float(prm.value + sign * shift * se)


def time_s(
    collective: str,
    params: Mapping,
    segments: Sequence,
    nbytes: ArrayLike,
    n_gpus: ArrayLike,
    gpus_per_node: float,
    *,
    shift: float = 0.0,
    fill: Sequence = (),
) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, algorithm) of ``collective`` of ``nbytes`` over ``n_gpus`` spanning nodes.

    ``params`` maps names to :class:`Param` (or floats); ``segments`` is tau(c).
    ``shift`` moves every fitted parameter by that many standard errors towards slower
    (+) or faster (-): the +-1 sigma band.
    """
    S, n = np.broadcast_arrays(np.asarray(nbytes, dtype=float), np.asarray(n_gpus, dtype=float))
    gpn = float(gpus_per_node)
    nodes = np.maximum(n / gpn, 1.0)
    ring = np.full(S.shape, "ring", dtype=object)
    if collective == ALLTOALL:
        peer = _v(params, "per_peer_s", shift)
        if "per_peer_ll_s" in params:
            # NCCL sends a peer's message with LL up to its P2P LL threshold, Simple above
            ll = S / n <= _floats(params)["p2p_ll_threshold_bytes"]
            peer = np.where(ll, _v(params, "per_peer_ll_s", shift), peer)
        bw = max(_v(params, "node_busbw_gbps", shift, -1.0), 1e-6) * 1e9
        node_bytes = gpn * S * np.maximum(n - gpn, 0.0) / n
        t = (n - 1.0) * peer + node_bytes / bw * contention(nodes, _floats(params))
        return t, np.where(S / n <= _floats(params).get("p2p_ll_threshold_bytes", -1.0), "p2p LL", "p2p")
    segs = shifted_segments(segments, shift)
    if collective == SENDRECV:
        return step_time_s(segs, S), np.full(S.shape, "p2p", dtype=object)
    if collective in CHAIN_COLLECTIVES:
        # a chain pipelines the message in pieces of at most one NCCL step; fewer, larger
        # pieces cost less fill, more pieces overlap more: the best split (k = 2^j pieces)
        q = _v(params, "pipeline_bytes", 0.0)
        k = np.maximum(np.ceil(S / q), 1.0)[..., None] * 2.0 ** np.arange(12)
        piece = S[..., None] / k
        t = (n[..., None] + k - 2.0) * step_time_s(segs, piece)
        t = np.where((piece >= MIN_PIECE_BYTES) | (k == k[..., :1]), t, np.inf)
        return t.min(axis=-1), ring
    t_ring = ring_time_s(
        segs, shifted_segments(fill, -shift), _floats(params), ring_steps(collective, n), S / n
    )
    if collective != ALLREDUCE:
        return t_ring, ring
    t_ring = t_ring * _v(params, "ring_step_ratio", shift)
    if "tree_lat_scale" not in params:
        return t_ring, ring
    f = _floats(params)
    graph = tuner_graph(f, segs)
    if f.get("tree_from_ring", 0.0) > 0:
        # no tree regime in the samples: NCCL's tree scaled like the (shifted) ring step
        scale, b_tree = tree_from_ring(segs)
    else:
        scale = max(_v(params, "tree_lat_scale", shift), 0.0)
        b_tree = max(_v(params, "tree_busbw_gbps", shift, -1.0), 1e-6)
    tables = f.get("tuner", 0.0) > 0
    cont = contention(nodes, f)
    t_tree, proto = tree_time_s(S, n, gpn, scale, b_tree, cont, graph, tables=tables)
    if tables:
        # NCCL runs what its own cost model picks, not the faster of the two (nccltuner)
        use_tree = nccltuner.allreduce_choice(S, n, gpn, graph)[0] == "tree"
    else:
        # a tuner decides by a cost of its form, fitted here (tree_time_s), not the pipeline's
        use_tree = t_tree < t_ring
    if "tree_hop_s" in params:
        # what a Simple-protocol tree costs: chunks pipelined over its depth (tree_pipeline_s)
        hop = max(_v(params, "tree_hop_s", shift), 0.0)
        pipe = tree_pipeline_s(S, n, gpn, hop, segs[-1].busbw_gbps.value, cont, graph.n_channels)
        t_tree = np.where(proto == "Simple", pipe, t_tree)
    return np.where(use_tree, t_tree, t_ring), np.where(use_tree, "tree", "ring")


def ring_time_s(segments: Sequence, fill: Sequence, f: Mapping[str, float], nsteps, chunk) -> np.ndarray:
    """A ring collective of ``nsteps`` steps of ``chunk`` bytes.

    tau(c) is read as the fitted scale's time over its ``fill_steps`` steps, so it spreads
    the pipeline's once-only fill and drain L0(c) (:mod:`calibrate.ringfill`) over them:
    the first ``fill_steps`` steps cost tau(c), every further one the marginal step
    tau(c) - L0(c) / fill_steps (at least a tenth of tau).  Without L0 (no ring all-reduce
    at the fitted scale, or a chunk below ``fill_min_chunk_bytes``) every step costs tau."""
    tau = step_time_s(segments, chunk)
    nsteps = np.asarray(nsteps, dtype=float)
    n_fill = f.get("fill_steps", 0.0)
    if not fill or n_fill <= 0:
        return nsteps * tau
    c = np.asarray(chunk, dtype=float)
    l0 = np.where(c >= f.get("fill_min_chunk_bytes", np.inf), step_time_s(fill, c), 0.0)
    tau_m = np.maximum(tau - l0 / n_fill, 0.1 * tau)
    first = np.minimum(nsteps, n_fill)
    return first * tau + (nsteps - first) * tau_m


def tuner_graph(f: Mapping[str, float], segments: Sequence) -> nccltuner.TunerGraph:
    """NCCL's graph bandwidth for its tuner: the node's NICs from the hardware spec
    (``tuner_busbw_gbps``), else the fitted ring step plateau."""
    bus = f.get("tuner_busbw_gbps", 0.0) or segments[-1].busbw_gbps.value
    return nccltuner.TunerGraph(busbw_gbps=float(bus))


def tree_time_s(
    S, n, gpn: float, scale: float, b_tree_gbps: float, cont, graph, *, tables: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, protocol) of NCCL's tree all-reduce in the tuner's cost form: ``scale`` x the
    tuner's tree latency for the protocol it picks, plus :func:`tree_nic_bytes` at ``b_tree_gbps``
    (per NIC direction) x the protocol's share x ``treeCorrectionFactor``
    (:func:`nccltuner.tree_parts`), slowed by ``cont``."""
    proto, lat_us, bw_factor = nccltuner.tree_parts(S, n, gpn, graph, tables=tables)
    nic_bytes = tree_nic_bytes(S, n / gpn)
    return scale * lat_us * 1e-6 + nic_bytes / (b_tree_gbps * 1e9 * bw_factor) * cont, proto


#: enqueue.cc (2.18-2.21): the Simple tree's chunk starts at one step (512 KiB) and is halved
#: while nBytes / (nChannels x chunk) < depth x mult and the chunk exceeds the floor
TREE_CHUNK_RULE = ((8.0, 131072.0), (4.0, 65536.0), (1.0, 32768.0))


def tree_depth(n_gpus: ArrayLike, gpus_per_node: float) -> np.ndarray:
    """connect.cc ``connectTrees``: depth = nRanks / nNodes - 1 + log2i(nNodes)."""
    n = np.asarray(n_gpus, dtype=float)
    nodes = np.maximum(np.round(n / gpus_per_node), 1.0)
    return n / nodes - 1.0 + nccltuner.log2i(nodes)


def tree_chunk_bytes(nbytes: ArrayLike, depth: ArrayLike, n_channels: float) -> np.ndarray:
    """The Simple tree's chunk size, NCCL's rule (``TREE_CHUNK_RULE``; integer division as in C)."""
    S, d = np.broadcast_arrays(np.asarray(nbytes, dtype=float), np.asarray(depth, dtype=float))
    chunk = np.full(S.shape, NCCL_SIMPLE_STEP_BYTES)
    for mult, floor in TREE_CHUNK_RULE:
        for _ in range(4):  # 512 KiB -> 32 KiB is four halvings at most
            chunk = np.where(
                (np.floor(S / (n_channels * chunk)) < d * mult) & (chunk > floor), chunk / 2.0, chunk
            )
    return chunk


def tree_pipeline_s(S, n, gpn: float, hop_s: float, node_gbps: float, cont, n_channels: float) -> np.ndarray:
    """NCCL's Simple-protocol tree all-reduce as a pipeline: each channel's share in chunks
    (:func:`tree_chunk_bytes`) climbs ``depth`` hops and comes back down, so the collective
    takes (chunks + 2 depth - 1) slots; a slot is ``hop_s`` plus the bytes the node's NICs
    carry in it (the channels' chunks x :func:`tree_nic_bytes` per byte) at ``node_gbps``
    (the ring step's NIC rate), slowed by ``cont``."""
    S, n = np.broadcast_arrays(np.asarray(S, dtype=float), np.asarray(n, dtype=float))
    depth = tree_depth(n, gpn)
    chunk = tree_chunk_bytes(S, depth, n_channels)
    chunks = np.maximum(np.ceil(S / (n_channels * chunk)), 1.0)
    per_byte = tree_nic_bytes(1.0, n / gpn)
    slot = hop_s + per_byte * n_channels * chunk / (node_gbps * 1e9) * cont
    return (chunks + 2.0 * depth - 1.0) * slot


def tree_nic_bytes(nbytes: ArrayLike, nodes: ArrayLike) -> np.ndarray:
    """Bytes each node's NICs carry per direction in NCCL's double binary tree all-reduce.

    Each of the two trees reduces and broadcasts half the message.  A node interior to one
    tree (two children) and a leaf of the other receives S/2 from each child and S/2 from
    its parent in the first, S/2 from its parent in the second: 2 S (and sends 2 S).  With
    two nodes neither tree has an interior node: S each way.  So a tree bandwidth read
    from 2-node logs runs half as many bytes through the NIC as any larger tree (the ring
    carries 2 S (n-1)/n at every scale)."""
    S, nodes = np.broadcast_arrays(np.asarray(nbytes, dtype=float), np.asarray(nodes, dtype=float))
    return S * np.where(nodes > 2.0, 2.0, 1.0)


def tree_from_ring(segments: Sequence) -> tuple[float, float]:
    """(latency scale, busbw GB/s) of NCCL's tree when no sample shows one: the ring step's
    largest latency over NCCL's ring NET Simple 14 us, and 0.92 x the ring step plateau."""
    scale = max(s.alpha_s.value for s in segments) / (NCCL_RING_NET_LAT_US * 1e-6)
    return scale, NCCL_TREE_BW_FACTOR * segments[-1].busbw_gbps.value


def _floats(params: Mapping) -> dict[str, float]:
    return {k: (float(v) if isinstance(v, (int, float)) else float(v.value)) for k, v in params.items()}
