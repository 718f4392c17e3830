"""NCCL's own choice of all-reduce algorithm and protocol: its tuner, emulated.

NCCL does not run the faster of ring and tree; it runs the one *its cost model* says is
faster (``src/graph/tuning.cc``: ``ncclTopoTuneModel`` fills a latency/bandwidth table per
algorithm and protocol, ``ncclTopoGetAlgoTime`` adds ``treeCorrectionFactor`` and the ring
plateau factor, the enqueue path takes the least time).  On Polaris that model sends a
2.21 all-reduce to the ring from 128 KiB to 4 MiB at 8 nodes, back to the tree at 8 MiB
(the tree correction factor's dip) and to the ring from 16 MiB -- exactly what the 8-node
logs show, although the measured tree would have been faster at 1-4 MiB.  At hundreds of
nodes the same table keeps the tree up to 1 GiB (the ring's latency grows with 2(n-1)
steps, the tree's with log2 of the node count).

Every constant below is copied from ``src/graph/tuning.cc`` of NCCL 2.20.3 (GitHub
NVIDIA/nccl, commit b6475625fbcaa2c3c0e50eed2fa1255d7514d4a2, ``makefiles/version.mk``
2.20.3), the table 2.21 inherits.  Only the ring and tree rows are used: NVLS needs
NVSwitch multicast, CollNet needs SHARP; a system without them (Polaris) never runs them.

The graph inputs NCCL takes from its topology search are not in any log; they come from
:class:`TunerGraph` (the node's NIC bandwidth from the hardware spec, the rest stated
defaults).  The choice is insensitive to them on Polaris (checked: 2, 4 or 8 channels,
9-25 GB/s per channel, Intel or AMD give the same ring/tree pattern within one size step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

LL, LL128, SIMPLE = 0, 1, 2
PROTOCOLS = ("LL", "LL128", "Simple")
TREE, RING = 0, 1

#: tuning.cc 2.20.3 ``baseLat`` (us), [Tree, Ring][LL, LL128, Simple]
BASE_LAT_US = ((6.8, 14.0, 0.0), (6.6, 14.0, 8.4))
#: tuning.cc 2.20.3 ``hwLat[NCCL_HW_NVLINK]`` (us), [Tree, Ring][LL, LL128, Simple]
NVLINK_LAT_US = ((0.6, 1.25, 28.0), (0.6, 1.9, 3.4))
#: tuning.cc 2.20.3 ``hwLat[NCCL_HW_NET]`` (us), [Tree, Ring][LL, LL128, Simple]
NET_LAT_US = ((5.0, 8.5, 28.0), (2.7, 4.0, 14.0))
#: tuning.cc 2.20.3 ``llMaxBws`` (GB/s) [Volta/Intel, Ampere/AMD][N1, N2, N4]
LL_MAX_BW = {"intel": (39.0, 39.0, 20.4), "amd": (87.7, 22.5, 19.0)}
#: tuning.cc 2.20.3 ``perChMaxTreeBws`` Ampere (N1, N2, N4), GB/s per channel
PER_CH_MAX_TREE_BW = (24.0, 23.6, 17.8)
#: tuning.cc 2.20.3 ``perChMaxRingLL128Bws`` / ``perChMaxTreeLL128Bws`` Ampere, GB/s per channel
PER_CH_MAX_LL128_BW = 20.0
#: tuning.cc 2.20.3 ``getNetOverhead`` (us): x86 Intel 1.0, x86 AMD 2.0; x3 for Simple
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
#: tuning.cc 2.20.3 ``treeCorrectionFactor[protocol][log2i(nBytes >> 6)]``, 64 B .. 256 MiB
TREE_CORRECTION = np.array(
    [
        [1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0],
        [1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0],
        [0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9],
    ]
)  # fmt: skip
#: tuning.cc 2.20.3 ``ncclTopoGetAlgoTime``: ring Simple all-reduce latency x 1.4 on sm80+
RING_PLATEAU_LAT = 1.4


@dataclass(frozen=True)
class TunerGraph:
    """The inputs NCCL's tuner takes from its topology search, for one system.

    ``busbw_gbps``: nChannels x per-channel bandwidth of the ring/tree graph (NCCL sizes
    it to the node's NICs; from the hardware spec's ``node_nic_gbps``).  The rest are
    stated defaults: ``n_channels`` 4 (2 NICs, channels duplicated by the graph search),
    ``cpu`` AMD (Polaris: AMD EPYC, ALCF machine overview), ``ll128`` off (tuning.cc
    enables LL128 only when the GPU-NIC path is ``<= PATH_PXB``; on Polaris it crosses
    the CPU host bridge, which is why the ALCF setups set ``NCCL_NET_GDR_LEVEL=PHB``).
    """

    busbw_gbps: float
    n_channels: float = 4.0
    cpu: str = "amd"
    ll128: bool = False


def log2i(x: ArrayLike) -> np.ndarray:
    """NCCL's ``log2i``: floor(log2(x)) for x >= 1, 0 below."""
    return np.floor(np.log2(np.maximum(np.asarray(x, dtype=float), 1.0)))


def allreduce_times_us(
    nbytes: ArrayLike, n_gpus: ArrayLike, gpus_per_node: float, g: TunerGraph
) -> np.ndarray:
    """NCCL's modelled all-reduce time (us), shape (..., 2 algorithms, 3 protocols); inf where
    the protocol is disabled.  ``ncclTopoTuneModel`` + ``ncclTopoGetAlgoTime``, 2.20.3."""
    S, n = np.broadcast_arrays(np.asarray(nbytes, dtype=float), np.asarray(n_gpus, dtype=float))
    nodes = np.maximum(np.round(n / gpus_per_node), 1.0)
    ppn = n / nodes
    idx2 = np.where(nodes <= 1, 0, np.where(nodes <= 2, 1, 2))
    ll_max = np.asarray(LL_MAX_BW[g.cpu])[idx2]
    tree_max = np.asarray(PER_CH_MAX_TREE_BW)[idx2] * g.n_channels
    nsteps = 2.0 * (n - 1.0)
    n_inter = np.where(nodes > 1, 2.0 * nodes, 0.0)
    overhead = np.where(nodes > 1, NET_OVERHEAD_US[g.cpu], 0.0)
    bus = g.busbw_gbps
    out = np.full(S.shape + (2, 3), np.inf)
    for p in (LL, LL128, SIMPLE):
        if p == LL128 and not g.ll128:
            continue
        # ring
        bw = {
            LL: np.minimum(ll_max, bus / 4.0),
            LL128: np.minimum(bus * 0.92, g.n_channels * PER_CH_MAX_LL128_BW),
        }.get(p, np.full(S.shape, bus))
        bw = bw * n / nsteps
        intra = np.where(
            nodes > 1, NVLINK_LAT_US[RING][p] * (1.8 if p == LL else 1.0), NVLINK_LAT_US[RING][p]
        )
        intra = np.maximum(intra, overhead * (3.0 if p == SIMPLE else 1.0))
        lat = BASE_LAT_US[RING][p] + (nsteps - n_inter) * intra + n_inter * NET_LAT_US[RING][p]
        if p == SIMPLE:
            lat = np.where((nodes > 1) & (S / (g.n_channels * n) >= 64), lat * RING_PLATEAU_LAT, lat)
        out[..., RING, p] = lat + S / (1000.0 * bw)
        # tree
        tb = np.minimum(bus * 0.92, tree_max)
        if p == LL:
            tb = np.minimum(tb / 3.8, ll_max)
        elif p == LL128:
            tb = np.minimum(tb * 120.0 / 128.0, g.n_channels * PER_CH_MAX_LL128_BW)
        tb = tb * 0.5 * tree_correction(S, np.full(S.shape, PROTOCOLS[p], dtype=object))
        intra_t = NVLINK_LAT_US[TREE][p] * np.where((nodes > 1) & (p == LL), 1.8, 1.0)
        lat_t = BASE_LAT_US[TREE][p] + 2.0 * ((ppn - 1.0) * intra_t + log2i(nodes) * NET_LAT_US[TREE][p])
        out[..., TREE, p] = lat_t + S / (1000.0 * tb)
    return out


def allreduce_choice(
    nbytes: ArrayLike, n_gpus: ArrayLike, gpus_per_node: float, g: TunerGraph
) -> tuple[np.ndarray, np.ndarray]:
    """(algorithm "ring"/"tree", protocol name) NCCL's tuner picks for each all-reduce."""
    t = allreduce_times_us(nbytes, n_gpus, gpus_per_node, g)
    flat = t.reshape(t.shape[:-2] + (6,)).argmin(axis=-1)
    algo = np.where(flat // 3 == TREE, "tree", "ring").astype(object)
    proto = np.asarray(PROTOCOLS, dtype=object)[flat % 3]
    return algo, proto


def tree_correction(nbytes: ArrayLike, protocol: np.ndarray) -> np.ndarray:
    """tuning.cc's ``treeCorrectionFactor`` for each size and protocol name (1 past 256 MiB)."""
    S = np.asarray(nbytes, dtype=float)
    log_size = log2i(np.floor(S / 64.0)).astype(int)
    p = np.vectorize(PROTOCOLS.index, otypes=[int])(protocol)
    inside = log_size < TREE_CORRECTION.shape[1]
    return np.where(inside, TREE_CORRECTION[p, np.clip(log_size, 0, TREE_CORRECTION.shape[1] - 1)], 1.0)


def tree_parts(
    nbytes: ArrayLike, n_gpus: ArrayLike, gpus_per_node: float, g: TunerGraph, *, tables: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(protocol, latency us, bandwidth factor) of NCCL's tree all-reduce at each size.

    The protocol is the tuner's cheapest for the tree; the latency is the table's tree
    latency ``baseLat + 2((ppn-1) intraLat + log2i(nNodes) interLat)`` for it; the
    bandwidth factor is the table's tree bandwidth for that protocol over its Simple
    bandwidth, times ``treeCorrectionFactor`` (1 for Simple past the dip).  ``tables=False``
    (this NCCL's tuner is not the table's): Simple throughout, no correction factor."""
    t = allreduce_times_us(nbytes, n_gpus, gpus_per_node, g)[..., TREE, :]
    p = t.argmin(axis=-1) if tables else np.full(t.shape[:-1], SIMPLE)
    S, n = np.broadcast_arrays(np.asarray(nbytes, dtype=float), np.asarray(n_gpus, dtype=float))
    nodes = np.maximum(np.round(n / gpus_per_node), 1.0)
    idx2 = np.where(nodes <= 1, 0, np.where(nodes <= 2, 1, 2))
    ll_max = np.asarray(LL_MAX_BW[g.cpu])[idx2]
    simple = np.minimum(g.busbw_gbps * 0.92, np.asarray(PER_CH_MAX_TREE_BW)[idx2] * g.n_channels)
    ratio = np.select(
        [p == LL, p == LL128],
        [
            np.minimum(simple / 3.8, ll_max) / simple,
            np.minimum(simple * 120.0 / 128.0, g.n_channels * 20.0) / simple,
        ],
        1.0,
    )
    intra = np.asarray(NVLINK_LAT_US[TREE])[p] * np.where((nodes > 1) & (p == LL), 1.8, 1.0)
    lat = np.asarray(BASE_LAT_US[TREE])[p] + 2.0 * (
        (n / nodes - 1.0) * intra + log2i(nodes) * np.asarray(NET_LAT_US[TREE])[p]
    )
    proto = np.asarray(PROTOCOLS, dtype=object)[p]
    return proto, lat, ratio * (tree_correction(S, proto) if tables else 1.0)
