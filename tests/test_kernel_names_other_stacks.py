"""Kernel names of stacks the shipped traces do not cover: FlashAttention 3 and 4, AMD's
Tensile / hipBLASLt GEMMs, Composable Kernel attention and ROCm's blit copies, apex's
LayerNorm backward, DeepEP's MoE all-to-all and Transformer Engine's userbuffers (TP
communication overlapped with the GEMMs); and PyTorch's LayerNorm / log-softmax kernels of
the shipped traces.

The names are copied from public profiles (kernel tables of real traces, public index file
ids in each list; long template arguments cut where the profile cut them).  Before these
rules (stop 27) FA3's kernels, which run inside ``cutlass::device_kernel<...>``, were
counted as GEMMs, AMD's GEMMs as "other", and DeepEP's and userbuffers' kernels as
computation.
"""

from __future__ import annotations

import gzip
import json

import numpy as np

from calib.core.schema import KERNEL_CLASSES
from tests.conftest import ALL_TRACES

#: FlashAttention 3 (Hopper): file ids 68424092448, 65919887630 (forward, split combine) and
#: 68300020104 (backward)
FA3 = [
    "void cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::"
    "CollectiveMainloopFwdSm90<2, cute::tuple<cute::C<1>, cute::C<1>, cute::C<1> >, cute::tuple<cute::C<128>, "
    "cute::C<176>, cute::C<128> >, 128, cu",
    "flash::FlashAttnFwdCombine",
    "flash::enable_sm90<flash::FlashAttnBwdSm90<flash::CollectiveMainloopBwdS...>>",
    "FlashAttentionForwardSm100",  # FlashAttention 4 (CuTe DSL, Blackwell): file id 54970931634
]
#: AMD MI355X Megatron trace (file id 54874638758): hipBLASLt (Tensile) GEMMs and a CK
#: grouped GEMM; hand-tuned Tensile kernels (file id 62179961574); CK FMHA (file id 55663012580)
AMD_GEMM = [
    "Cijk_Ailk_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_CMS_SN_LDSB0_AFC1_AFEM...",
    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x256x64_MI16x16x1_CMS_SN_LDSB0_AFC1_AFEM...",
    "Custom_Cijk_Ailk_Bjlk_S_MX_B_BIAS_HA_S_SAV_NTD_SK3_UserArgs_MT256x256x32_MI16x16x1_shortname0_gfx950",
    "void ck_tile::kentry<1, ck_tile::GroupedGemmKernel<ck_tile::GemmSpatiallyLocalTilePartitio...",
]
AMD_ATTENTION = ["ck_tile::FmhaFwdKernel"]
#: ROCm's blit kernels for copies and fills (file ids 53382071463: "SDMA copies ... seen as
#: __amd_rocclr_copyBuffer"; 67106950907: "memset / iter ... __amd_rocclr_fillBufferAligned")
AMD_BLIT = ["__amd_rocclr_copyBuffer", "__amd_rocclr_fillBufferAligned"]
#: DeepEP: file ids 61765607032 and 71442866495 (NVIDIA), 54874638758 (AMD's primus_turbo port)
DEEPEP = [
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, "
    "int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int",
    "void deep_ep::intranode::combine<__nv_bfloat16, (int)8, (in",
    "void primus_turbo::deep_ep::intranode::dispatch<8, 1024, true>(HIP_vector_type<int, 4u>*, ...",
]

#: Transformer Engine userbuffers (Megatron --tp-comm-overlap): file ids 28786920182 (all-gather,
#: reduce-scatter), 19568099538 (FP8 reduce-scatter), 53513329779 (residual all-gather),
#: 63626143030 (the ring's push kernels)
USERBUFFERS = {
    "void userbuffers_fp16_sum_inplace_gpu_rw_ag<2>(int, int, int, int, int, int, int, void**, int, unsigned long)":
        "allgather",
    "void userbuffers_fp16_sum_inplace_gpu_rr_rs<2>(int, in": "reducescatter",
    "userbuffers_fp16_sum_inplace_gpu_rr_rs_oop_fp8": "reducescatter",
    "userbuffers_fp16_sum_inplace_res_allgather": "allgather",
    "kuserbuffers_pushsend": "sendrecv",
    "kuserbuffers_pushrecv": "sendrecv",
}  # fmt: skip
#: apex / Megatron fused LayerNorm backward (file id 26054091961)
APEX_NORM = ["cuComputePartGradGammaBeta", "cuComputeGradGammaBeta", "cuComputeGradInput"]


def _classes(names):
    from calib.ingest.rules import DEFAULT_RULES

    return [KERNEL_CLASSES[i] for i in DEFAULT_RULES.kernel_class(names)]


def test_flash_attention_3_is_attention_not_a_cutlass_gemm():
    assert _classes(FA3) == ["attention"] * 4


def test_amd_gemms_and_attention():
    assert _classes(AMD_GEMM) == ["gemm"] * 4
    assert _classes(AMD_ATTENTION) == ["attention"]
    assert _classes(AMD_BLIT) == ["memcpy", "memset"]


def test_deepep_kernels_are_communication_and_nothing_else_is():
    from calib.ingest.rules import DEFAULT_RULES

    assert DEFAULT_RULES.is_comm(DEEPEP).all()
    assert not DEFAULT_RULES.is_comm(FA3 + AMD_GEMM + AMD_ATTENTION).any()


def test_a_deepep_kernel_is_an_all_to_all_of_its_own_backend(tmp_path):
    """The real NCCL trace of HTA's nccl_parser_config with its six broadcast kernels renamed
    to DeepEP's dispatch, their NCCL arguments and the sizes of the host ops that launched
    them dropped (DeepEP records none): the same communication time, now six all-to-alls of
    backend deepep, their size unknown rather than guessed."""
    from calib.ingest.orchestrate import ingest_rank

    src = ALL_TRACES["nccl_data"]
    with gzip.open(src) as fh:
        doc = json.load(fh)
    renamed = 0
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel_Broadcast"):
            e["name"] = DEEPEP[0]
            keep = ("device", "stream", "correlation", "External id")
            e["args"] = {k: v for k, v in e["args"].items() if k in keep}
            renamed += 1
        elif e.get("name") == "record_param_comms" and e["args"].get("Out msg nelems") in (53120, 53):
            e["args"] = {k: v for k, v in e["args"].items() if "nelems" not in k}  # the broadcasts' sizes
    assert renamed == 6
    path = tmp_path / "deepep.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)
    base, moved = ingest_rank(src), ingest_rank(path)
    coll = moved.tables["collectives"]
    ours = coll[coll["backend"] == "deepep"]
    assert len(ours) == 6 and set(ours["collective"]) == {"alltoall"}
    assert (ours["bytes"] <= 0).all()  # no size is guessed
    assert len(coll) == len(base.tables["collectives"])
    b0, b1 = base.tables["buckets"], moved.tables["buckets"]
    num = b0.select_dtypes("number").columns
    np.testing.assert_allclose(b1[num].to_numpy(float), b0[num].to_numpy(float), rtol=1e-9, atol=1e-9)


def test_layer_norm_and_log_softmax_kernels_of_shipped_traces():
    """PyTorch's LayerNorm moments and weight/bias-gradient kernels (HTA's trace_filter trace)
    and the loss's log-softmax kernels (the H100 GPT-2 run) are normalization and
    element-wise work, not "other" (they were until stop 27; the device fit streams every
    class but GEMMs, attention, optimizer and memcpy alike, so no fit moves)."""
    from pathlib import Path

    def kernel_names(path):
        with gzip.open(path) as fh:
            return sorted({e["name"] for e in json.load(fh)["traceEvents"] if e.get("cat") == "kernel"})

    h100 = (
        Path(__file__).parents[1]
        / "fixtures"
        / "traces"
        / "h100"
        / "runs"
        / "g125m-b8"
        / "rank0.pt.trace.json.gz"
    )
    norm = [
        n
        for n in kernel_names(ALL_TRACES["sampled_rank-0"])
        if "RowwiseMoments" in n or "GammaBetaBackward" in n
    ]
    soft = [n for n in kernel_names(h100) if "cunn_SoftMax" in n]
    assert len(norm) >= 2 and len(soft) == 2
    assert set(_classes(norm)) == {"normalization"} and set(_classes(soft)) == {"elementwise"}


def test_userbuffers_tp_overlap_kernels_are_tp_collectives():
    """Transformer Engine's userbuffers kernels move the TP all-gathers and reduce-scatters
    that Megatron overlaps with the GEMMs: communication, each with its collective (until
    stop 27 they were "other" computation)."""
    from calib.ingest.collective_calls import _ub_collective
    from calib.ingest.rules import DEFAULT_RULES

    names = list(USERBUFFERS)
    assert DEFAULT_RULES.is_comm(names).all()
    assert [_ub_collective(n) for n in names] == list(USERBUFFERS.values())
    assert _ub_collective(DEEPEP[0]) is None


def test_apex_layer_norm_backward_is_normalization():
    assert _classes(APEX_NORM) == ["normalization"] * 3
