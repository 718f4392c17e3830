"""Ingest numbers checked against independent, plain-Python readings of the same JSON.

The reference side uses only ``json``/``gzip`` and interval merging written here, never
calib's own code, so a wrong bucket or a wrong size shows up as a mismatch.
"""

from __future__ import annotations

import gzip
import json
import re
from functools import cache

import numpy as np
import pytest

from tests.conftest import ALL_TRACES, CPU_TRACES


@cache
def events(key: str) -> list[dict]:
    with gzip.open(ALL_TRACES[key]) as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]


def merged_length(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of intervals clipped to [lo, hi), by sort-and-merge."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


@pytest.mark.parametrize("key", ["nccl_data", "control", "test", "sampled_rank-0"])
def test_gpu_comm_and_kernel_time_match_interval_unions(ingested, key):
    """comm_s = |union of NCCL kernels|, comm_s + kernel_s = |union of all device work|, per window."""
    ev = events(key)
    t0 = min(e["ts"] for e in ev)
    dev = [e for e in ev if e.get("cat", "").lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    comm = [(e["ts"] - t0, e["ts"] - t0 + e["dur"]) for e in dev if "nccl" in e["name"].lower()]
    every = [(e["ts"] - t0, e["ts"] - t0 + e["dur"]) for e in dev]
    b = ingested(key).tables["buckets"]
    for _, row in b.iterrows():
        lo, hi = row.start_s * 1e6, (row.start_s + row.wall_s) * 1e6
        assert row.comm_s * 1e6 == pytest.approx(merged_length(comm, lo, hi), rel=1e-6, abs=1e-3)
        assert (row.comm_s + row.kernel_s) * 1e6 == pytest.approx(
            merged_length(every, lo, hi), rel=1e-6, abs=1e-3
        )


def test_cpu_comm_is_union_of_gloo_work(ingested):
    key = "ws2_ddp_rank0"
    ev = events(key)
    t0 = min(e["ts"] for e in ev)
    gloo = [(e["ts"] - t0, e["ts"] - t0 + e["dur"]) for e in ev if e["name"].startswith("gloo:")]
    b = ingested(key).tables["buckets"]
    assert list(b["iteration"]) == [1, 2, 3]
    for _, row in b.iterrows():
        lo, hi = row.start_s * 1e6, (row.start_s + row.wall_s) * 1e6
        assert row.comm_s * 1e6 == pytest.approx(merged_length(gloo, lo, hi), rel=1e-6, abs=1e-3)


@pytest.mark.parametrize("key", sorted(ALL_TRACES))
def test_iterations_are_the_profiler_steps(ingested, key):
    steps = sorted(
        {int(m.group(1)) for e in events(key) if (m := re.match(r"ProfilerStep#(\d+)$", e["name"]))}
    )
    b = ingested(key).tables["buckets"]
    assert list(b["iteration"]) == (steps or [-1])
    # each window starts no earlier than its CPU step and ends no earlier than the step ends
    t0 = min(e["ts"] for e in events(key))
    cpu = {int(e["name"].split("#")[1]): e for e in events(key) if e["name"].startswith("ProfilerStep#")}
    for it, start, wall in zip(b["iteration"], b["start_s"], b["wall_s"], strict=True):
        if it in cpu:
            step_start, step_end = cpu[it]["ts"] - t0, cpu[it]["ts"] - t0 + cpu[it]["dur"]
            assert start * 1e6 >= step_start - 1e-3
            assert (start + wall) * 1e6 >= step_end - 1e-3


def test_nccl_sizes_come_from_kernel_args(ingested):
    ev = events("nccl_data")
    kernels = sorted((e for e in ev if e["name"].startswith("ncclKernel")), key=lambda e: e["ts"])
    c = ingested("nccl_data").tables["collectives"].sort_values("start_s")
    assert len(c) == len(kernels) == 21
    itemsize = {"Float": 4, "Long": 8}
    expected = [
        max(k["args"]["In msg nelems"], k["args"]["Out msg nelems"]) * itemsize[k["args"]["dtype"]]
        for k in kernels
    ]
    assert list(c["bytes"]) == expected
    assert set(c["group_size"]) == {2}
    assert set(c["pg_desc"]) == {"default_pg"}
    ar = c[c["collective"] == "allreduce"]
    assert len(ar) == 15
    # allreduce over 2 ranks: busbw factor 2(n-1)/n = 1
    np.testing.assert_allclose(ar["busbw_gbps"], ar["algbw_gbps"])
    assert set(c["collective"]) == {"allreduce", "broadcast"}


def test_old_schema_nccl_without_sizes_is_unknown_not_guessed(ingested):
    c = ingested("df_index_resolver").tables["collectives"]
    n_kernels = sum(1 for e in events("df_index_resolver") if e["name"].startswith("ncclKernel"))
    assert len(c) == n_kernels == 2020
    assert (c["bytes"] == -1).all() and c["algbw_gbps"].isna().all()
    assert set(c["collective"]) == {"allreduce"} and set(c["dtype"]) == {"float"}


def test_gloo_sizes_follow_nccl_tests_convention(ingested):
    c = ingested("ws2_collectives_rank0").tables["collectives"]
    by = {k: g for k, g in c.groupby("collective")}
    assert set(by["allreduce"]["bytes"]) == {262144 * 4, 100 * 4}
    # all_gather of 262144 floats per rank over 2 ranks: nccl-tests size is the output buffer
    assert set(by["allgather"]["bytes"]) == {2 * 262144 * 4}
    assert set(by["alltoall"]["bytes"]) == {262144 * 4}
    assert set(by["send"]["bytes"]) == {1000 * 4}
    ddp = ingested("ws2_ddp_rank0").tables["collectives"]
    assert set(ddp.loc[ddp["collective"] == "allreduce", "bytes"]) == {263808 * 4, 272256 * 4}


def test_gemm_shapes_and_flops_from_input_dims(ingested):
    ev = events("ws2_ddp_rank0")
    mms = [e for e in ev if e["name"] == "aten::mm" and e["args"].get("Input Dims")]
    g = ingested("ws2_ddp_rank0").tables["gemms"]
    mm = g[g["op"] == "aten::mm"]
    assert len(mm) == len(mms)
    ref = sorted(2 * a[0] * a[1] * b[1] for a, b in (e["args"]["Input Dims"][:2] for e in mms))
    assert sorted(mm["flops"]) == ref
    b = ingested("ws2_ddp_rank0").tables["buckets"]
    assert b["gemm_flops"].sum() == pytest.approx(g.loc[g["iteration"] >= 1, "flops"].sum())


@pytest.mark.parametrize(
    ("key", "name", "stage", "strategy"),
    [
        ("ws2_ddp_rank0", "ddp", 0, None),
        ("ws2_fsdp_full_rank0", "fsdp", 3, "FULL_SHARD"),
        ("ws2_fsdp2_full_rank0", "fsdp2", 3, "FULL_SHARD"),
        ("ds_zero3_ws2_rank0", "deepspeed", 3, None),
        ("ds_zero1_ws2_rank0", "zero", None, None),
        ("nccl_data", "ddp", 0, None),
    ],
)
def test_framework_detection(ingested, key, name, stage, strategy):
    fw = ingested(key).framework
    assert (fw.name, fw.zero_stage, fw.sharding_strategy) == (name, stage, strategy)
    assert fw.detected_from


def test_cpu_trace_kernels_are_compute_ops_not_views(ingested):
    stats = ingested("ws2_ddp_rank0").tables["kernel_stats"]
    names = set(stats["name"])
    assert {"aten::mm", "aten::addmm"} <= names
    assert not names & {"aten::view", "aten::as_strided", "aten::t", "aten::transpose", "aten::empty"}
    gemm = stats[stats["kernel_class"] == "gemm"]
    assert set(gemm["name"]) <= {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}


def test_cpu_fixtures_are_all_cpu(ingested):
    for key in CPU_TRACES:
        r = ingested(key)
        assert r.tables["buckets"]["device"].eq("cpu").all()
        assert r.devices == ("cpu",)


def test_old_and_new_nccl_kernel_names_are_communication():
    """NCCL <= 2.8 names (ncclAllReduceRingLLKernel_sum_f32) count as comm, as in HTA."""
    from calib.ingest.collective_calls import _OLD_KERNEL_RE
    from calib.ingest.rules import DEFAULT_RULES

    names = [
        "ncclAllReduceRingLLKernel_sum_f32(ncclColl)",
        "ncclBroadcastRingLLKernel_copy_i8(ncclColl)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "void at::native::vectorized_elementwise_kernel<4>",
        "Memcpy DtoD (Device -> Device)",
    ]
    assert list(DEFAULT_RULES.is_comm(names)) == [True, True, True, True, False, False]
    assert _OLD_KERNEL_RE.search(names[0]).groups() == ("AllReduce", "f32")


def test_backlog_from_unprofiled_step_is_noted(ingested):
    """trace_diff/test starts with kernels queued by an untraced step (found by the HTA cross-check)."""
    notes = ingested("test").notes
    assert any("launched before the trace began" in n and "iteration 1009" in n for n in notes)
    assert not any("launched before the trace began" in n for n in ingested("control").notes)


def test_generated_run_directory_with_sidecar(tmp_path):
    """A captured run directory ingests as a whole; run_config.json states what traces cannot."""
    from calib.ingest.orchestrate import IngestOptions, ingest

    from tests.conftest import FIXTURES

    run = FIXTURES / "traces" / "generated" / "ds-z1-d128-ws2"
    cfg = json.loads((run / "run_config.json").read_text())
    meta, tables = ingest([run], IngestOptions())
    assert meta.ranks == (0, 1) and meta.world_size == cfg["world_size"] == 2
    assert meta.system == cfg["system"] and meta.name == cfg["name"]
    assert (meta.framework.name, meta.framework.zero_stage, meta.framework.stated) == ("deepspeed", 1, True)
    assert {k: meta.model[k] for k in ("d", "l", "a", "s", "V", "b")} == {
        k: cfg["model"][k] for k in ("d", "l", "a", "s", "V", "b")
    }
    # the command line wins over the sidecar
    meta2, _ = ingest([run], IngestOptions(zero_stage=2, system="other"))
    assert (meta2.framework.zero_stage, meta2.system) == (2, "other")
    # detection alone cannot tell ZeRO-1 from ZeRO-2
    alone, _ = ingest(sorted(run.glob("rank*.pt.trace.json.gz")), IngestOptions())
    assert alone.framework.zero_stage is None and not alone.framework.stated
    assert len(tables["buckets"]) == 2 * 3  # ProfilerStep#2..#4 on each rank


def test_gemm_kernel_names_of_cublas_cutlass_and_torch_compile():
    """Matmul kernels are GEMMs whoever wrote them; Triton element-wise kernels are not."""
    from calib.ingest.rules import DEFAULT_RULES

    from calib.core.schema import KERNEL_CLASSES

    names = [
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel",
        "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_32x1_nn_align1>(Params)",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
        "triton_tem_fused_addmm_gelu_0",
        "triton_tem_fused_mm_1",
        "triton_poi_fused_add_gelu_2",
        "triton_per_fused_add_native_layer_norm_3",
    ]
    got = [KERNEL_CLASSES[i] for i in DEFAULT_RULES.kernel_class(names)]
    assert got == ["gemm"] * 5 + ["elementwise", "normalization"]
