"""NCCL's Simple-protocol tree all-reduce as a pipeline (calibrate.ncclmodel.tree_pipeline_s):
NCCL's own chunk and depth rules by hand, one per-hop cost across sizes on the real Polaris
logs, and a large tree close to the ring's bandwidth where NCCL's tuner turns to it."""

from __future__ import annotations

import numpy as np
import pytest
from calib.calibrate import ncclmodel, treefit
from calib.calibrate.netcheck import fit_pairs
from calib.calibrate.netfit import fit_nccl
from calib.ingest.nccl_tests import ingest_nccl_tests

from calib.core.collective_names import busbw_factor
from tests.conftest import FIXTURES

POLARIS_TOPOLOGY = {"topology": 1.0, "nodes_per_group": 14.0, "global_taper": 0.8, "node_nic_gbps": 50.0}
KiB, MiB, GiB = 2.0**10, 2.0**20, 2.0**30


@pytest.fixture(scope="module")
def samples():
    _, tables = ingest_nccl_tests([FIXTURES / "nccl-tests"], name="polaris", system="polaris")
    return tables["samples"]


def _pop(samples, version: str, setup: int):
    return samples[(samples["setup"] == setup) & (samples["nccl_version"].astype(str) == version)]


def test_depth_follows_connect_cc():
    """connect.cc connectTrees: depth = nRanks / nNodes - 1 + log2i(nNodes), 4 GPUs per node."""
    d = ncclmodel.tree_depth(np.array([8.0, 32.0, 512.0, 2160.0]), 4)
    np.testing.assert_array_equal(d, [3 + 1, 3 + 3, 3 + 7, 3 + 9])


def test_chunks_follow_enqueue_cc():
    """enqueue.cc, 4 channels, 512 KiB start: halve while nBytes / (4 chunk) < 8 depth (chunk >
    128 KiB), < 4 depth (> 64 KiB), < depth (> 32 KiB).  By hand at depth 6 (8 nodes):
    8 MiB: 4 < 48 -> 256K: 8 -> 128K: 16 (stop, not > 128K); 16 < 24 -> 64K: 32 (stop) = 64 KiB.
    256 KiB: ... 64K: 1 < 6 -> 32K: 2 (stop at the floor) = 32 KiB.  1 GiB: 512 >= 48 = 512 KiB.
    At depth 4 (2 nodes) 16 MiB: 8 < 32 -> 256K: 16 -> 128K: 32 (stop); 32 >= 16 = 128 KiB."""
    c = ncclmodel.tree_chunk_bytes(np.array([8 * MiB, 256 * KiB, GiB]), 6.0, 4.0)
    np.testing.assert_array_equal(c, [64 * KiB, 32 * KiB, 512 * KiB])
    assert float(ncclmodel.tree_chunk_bytes(16 * MiB, 4.0, 4.0)) == 128 * KiB


def test_pipeline_by_hand():
    """8 MiB over 8 nodes x 4 GPUs: 64 KiB chunks, 8 MiB / (4 x 64 KiB) = 32 per channel,
    depth 6: 32 + 11 = 43 slots of 18 us + 2 x 4 x 64 KiB / 37 GB/s."""
    t = ncclmodel.tree_pipeline_s(8 * MiB, 32.0, 4, 18e-6, 37.0, 1.0, 4.0)
    assert float(t) == pytest.approx(43 * (18e-6 + 2 * 4 * 65536 / 37e9))


def test_one_hop_cost_explains_every_simple_tree_size(samples):
    """NCCL 2.18 (setup 3, RDMA) ran the Simple tree from 256 KiB to 4 MiB at 2 and 8 nodes.
    With the ring plateau's NIC rate, the per-hop cost each size implies is one number per
    scale within 20 % (9.2-10.2 us at 2 nodes, 10.4-12.9 us at 8): the chunks' count and size
    carry the 16x range of sizes, as the pipeline says."""
    pop = _pop(samples, "", 3)
    nets, _ = fit_nccl(fit_pairs(pop), where="t", topology=POLARIS_TOPOLOGY)
    ar = nets["allreduce"]
    plateau = ar.segments[-1].busbw_gbps.value
    for _, s in fit_pairs(pop)["allreduce"]:
        m = (s.bytes >= 256 * KiB) & (s.bytes <= 4 * MiB)
        n = float(s.n_gpus)
        cont = ncclmodel.contention(n / 4, {k: p.value for k, p in ar.params.items()})
        zero = ncclmodel.tree_pipeline_s(s.bytes[m], n, 4, 0.0, plateau, cont, 4.0)
        slots = ncclmodel.tree_pipeline_s(s.bytes[m], n, 4, 1.0, plateau, cont, 4.0) - zero
        hop = (s.time_s[m] - zero) / slots
        assert m.sum() == 5 and (hop > 0).all()
        assert np.abs(hop / np.median(hop) - 1).max() < 0.20, (s.n_nodes, hop)
        # their relative spread is what a one-size fit's standard error is floored at
        assert np.std(hop, ddof=1) / np.mean(hop) <= treefit.HOP_SIZE_SPREAD, (s.n_nodes, hop)


def test_large_tree_runs_near_the_ring_where_the_tuner_picks_it(samples):
    """Default population (NCCL 2.21, setup 5; 2 + 8 nodes).  Past 32 nodes the tuner sends a
    1 GiB all-reduce to the tree.  Its 512 KiB chunks keep the per-hop cost small next to the
    bytes, so the tree runs at 0.6-1 x the ring step's NIC rate (NCCL's tuner: 0.92 x) and there
    is no cliff: until stop 30 the 8 MiB tree's bandwidth was carried to 1 GiB, 36.0 GB/s at 32
    nodes fell to 10.9 at 64."""
    nets, _ = fit_nccl(fit_pairs(_pop(samples, "2.21", 5)), where="t", topology=POLARIS_TOPOLOGY)
    ar = nets["allreduce"]
    plateau = ar.segments[-1].busbw_gbps.value
    n = np.array([128.0, 256.0, 512.0, 2160.0])
    t, algo = ar.model_time_s(np.full(n.shape, GiB), n)
    busbw = GiB * busbw_factor("allreduce", n) / t / 1e9
    assert list(algo) == ["ring", "tree", "tree", "tree"]
    assert ((busbw > 0.6 * plateau) & (busbw <= plateau)).all(), busbw
    assert busbw[1] > 0.75 * busbw[0]
    hop = ar.params["tree_hop_s"]
    assert hop.status == "fitted" and hop.stderr is not None and "repetitions" in hop.note
    # one Simple size (8 MiB at 8 nodes): its repetitions alone said +-0.8 %; the floor is the
    # per-size spread the 2.18 logs measured (test_one_hop_cost_explains_every_simple_tree_size)
    assert hop.stderr == pytest.approx(treefit.HOP_SIZE_SPREAD * hop.value) and "10%" in hop.note


def test_hop_at_its_bound_says_so(samples):
    """NCCL 2.18 setup 2 runs over TCP sockets (3.4 GB/s plateau): its 2-node tree sizes ran
    faster than their NIC bytes at the ring's rate allow, the per-hop cost ends at its bound
    0, and the parameter's note says the pipeline does not describe that transport."""
    pop = _pop(samples, "", 2)
    nets, _ = fit_nccl(fit_pairs(pop[pop["nnodes"] == 2]), where="t", topology=POLARIS_TOPOLOGY)
    hop = nets["allreduce"].params["tree_hop_s"]
    assert hop.value == pytest.approx(0.0, abs=1e-9) and "lower bound" in hop.note
    pop = _pop(samples, "", 3)
    nets, _ = fit_nccl(fit_pairs(pop[pop["nnodes"] == 2]), where="t", topology=POLARIS_TOPOLOGY)
    hop = nets["allreduce"].params["tree_hop_s"]
    assert 5e-6 < hop.value < 15e-6 and "lower bound" not in hop.note
