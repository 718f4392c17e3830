"""Classification rules in one table: kernel classes, communication, host-only ops, waits.

Rules are ordered (first match wins) regular expressions over event names.  They are
data, not code: users extend them with ``calib ingest --rules FILE`` (JSON or YAML
``{"kernel_classes": [[pattern, class], ...], "host_only_ops": [...], ...}``), whose
entries are tried before the built-in ones.  Classification runs once per *unique*
name, so the cost does not grow with the number of events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calib.core.errors import InputError
from calib.core.schema import KERNEL_CLASSES

#: (pattern, class) for device kernels and host compute ops, first match wins.
KERNEL_CLASS_RULES: tuple[tuple[str, str], ...] = (
    # ROCm runs copies and fills as blit kernels: __amd_rocclr_copyBuffer, __amd_rocclr_fillBuffer...
    (r"^Memcpy|^memcpy|\bMemcpy|^__amd_rocclr_copyBuffer", "memcpy"),
    (r"^Memset|^memset|\bMemset|^__amd_rocclr_fillBuffer", "memset"),
    (
        r"flash_fwd|flash_bwd|flash_attn|fmha|_attention|attention_|scaled_dot_product|cutlassF|cutlassB"
        r"|sdpa|mha_|MultiHeadAttention|attn_"
        # FlashAttention 3's Hopper kernels run inside cutlass::device_kernel<flash::FlashAttnFwdSm90<..>>
        # (and FlashAttnBwdSm90, FlashAttnFwdCombine), FlashAttention 4's CuTe kernels
        # (FlashAttentionForwardSm100): attention, not the "cutlass" GEMMs below;
        # AMD's Composable Kernel FMHA (ck_tile::FmhaFwdKernel, FmhaBwd...)
        r"|FlashAttn(Fwd|Bwd)|FlashAttention(Forward|Backward)|Fmha(Fwd|Bwd)",
        "attention",
    ),
    (r"multi_tensor_apply|[Aa]dam|[Ll]amb\b|_foreach_|fused_sgd|sgd_kernel|optim", "optimizer"),
    (
        r"layer_?norm|LayerNorm|rms_?norm|RMSNorm|RmsNorm|batch_?norm|bn_fw|bn_bw|group_?norm|cudnn::bn"
        r"|_norm_|normalization"
        # PyTorch's LayerNorm kernels outside the vectorised path: forward moments, weight/bias grads
        r"|RowwiseMomentsCUDAKernel|GammaBetaBackward"
        r"|GradGammaBeta|cuComputeGradInput",  # apex / Megatron fused LayerNorm backward
        "normalization",
    ),
    (r"embedding|Embedding|indexSelect|index_select|EmbeddingBag|embedding_dense", "embedding"),
    (
        r"gemm|GEMM|Gemm|gemv|cublas|cutlass|matmul|xmma|wgmma|nvjet|Kernel2|"
        r"^aten::(mm|addmm|bmm|baddbmm|_addmm_activation|addmv|mv|dot)$|mkldnn_matmul|onednn.*gemm"
        r"|^triton_tem_fused_\w*(mm|addmm|bmm)"  # torch.compile's Triton matmul templates
        # AMD: Tensile's GEMM solutions (rocBLAS, hipBLASLt), C[i,j,k] = A[i,l,k] B[l,j,k]:
        # Cijk_Ailk_Bljk_BBS_BH_..._MT256x256x64_MI16x16x1_..., Custom_Cijk_... (hand-tuned)
        r"|^(Custom_)?Cijk_A",
        "gemm",
    ),
    (
        r"CatArrayBatchedCopy|CatArray|aten::cat$|concat|_copy_kernel|direct_copy|CopyKernel|copy_kernel"
        r"|^aten::copy_$|^aten::clone$|^aten::_to_copy$|transpose|permute|aten::index$|gather_kernel",
        "copy_concat",
    ),
    (
        r"elementwise|vectorized|unrolled|reduce_kernel|softmax|SoftMax|gelu|relu|silu|dropout|fill|triton_"
        r"|^aten::",
        "elementwise",
    ),
)

#: Communication: device kernels and host intervals that move data between ranks.
COMM_PATTERNS: tuple[str, ...] = (
    # every NCCL/RCCL device kernel, old (NCCL <= 2.8: ncclAllReduceRingLLKernel_sum_f32)
    # and new (ncclDevKernel_AllReduce_RING_LL) names alike, as HTA counts them
    r"^(void )?(nccl|rccl)|nccl:|ncclDevKernel|ncclKernel",
    r"^gloo:",
    # DeepEP's MoE dispatch / combine kernels (NVLink and RDMA all-to-all outside NCCL;
    # deep_ep::intranode::dispatch<..>, internode, internode_ll, and AMD's primus_turbo port)
    r"\bdeep_ep::",
    # Transformer Engine's userbuffers: the TP all-gather / reduce-scatter (and their ring
    # exchanges) that overlap the GEMMs (Megatron --tp-comm-overlap), outside NCCL
    r"userbuffers_",
)

#: Host ops that only dispatch (views, allocation, metadata): never "kernels" on CPU traces.
HOST_ONLY_OPS: tuple[str, ...] = (
    r"^aten::(view|_unsafe_view|view_as|as_strided|reshape|_reshape_alias|t|transpose|permute|expand"
    r"|expand_as|slice|select|narrow|unsqueeze|squeeze|detach|detach_|alias|empty|empty_strided|empty_like"
    r"|new_empty|new_empty_strided|resolve_conj|resolve_neg|_has_compatible_shallow_copy_type|split"
    r"|split_with_sizes|chunk|unbind|contiguous|lift_fresh|set_|result_type|is_nonzero|item"
    r"|_local_scalar_dense|size|stride|numel|to|_to_copy|flatten|unflatten|type_as|is_same_size"
    r"|record_stream|_nested_tensor_from_mask_left_aligned|broadcast_tensors|_version|requires_grad_"
    r"|output_nr|_is_any_true|is_leaf|lift|_shape_as_tensor|copy_\(\)|"
    r"retain_grad|_fw_primal|_make_dual|_unpack_dual|align_to|numpy_T|dim|sym_size|sym_stride|"
    r"sym_numel|sym_storage_offset|storage_offset|data_ptr|_nnz"
    # composite ops: their own time is dispatch, the work is in the ops they call
    r"|linear|matmul|dropout|layer_norm|softmax|log_softmax|cross_entropy_loss|scaled_dot_product_attention"
    r"|clone|einsum|stack|zeros|ones|full|zeros_like|ones_like|full_like|new_zeros|new_ones|new_full"
    r"|embedding|nll_loss|nll_loss_nd|repeat|tensordot|chunk_cat)$",
    r"^detach$",
    r"^(c10d|nccl|gloo)::|^record_param_comms$",  # comm launches: the transfer is timed elsewhere
)

#: Host waits: device idle while the host sits in one of these is "other", not dispatch.
WAIT_PATTERNS: tuple[str, ...] = (
    r"^cuda(Device|Stream|Event)Synchronize$",
    r"^hip(Device|Stream|Event)Synchronize$",
    r"^cudaStreamWaitEvent$",
    r"^enumerate\(DataLoader\)|DataLoader.*__next__|^DataLoader",
    r"^c10d::wait|^aten::wait$|^c10d::.*wait|Work::wait|^torch::distributed::wait",
)

#: CPU-only traces: host ops whose own (self) time is computation, not dispatch.
CPU_COMPUTE_OPS: tuple[str, ...] = (
    r"^(aten|prim|mkldnn|onednn|fbgemm|quantized|xformers|flash_attn|torchao|te|vllm)::",
)

#: Host annotations that mark the optimizer step (its kernels are class "optimizer").
OPTIMIZER_PATTERNS: tuple[str, ...] = (r"^Optimizer\.step#", r"^optimizer_step$", r"^optimizer$")


@dataclass(frozen=True)
class Rules:
    """A compiled rule set; :func:`load_rules` builds one with user rules first."""

    kernel_classes: tuple[tuple[str, str], ...] = KERNEL_CLASS_RULES
    comm: tuple[str, ...] = COMM_PATTERNS
    host_only_ops: tuple[str, ...] = HOST_ONLY_OPS
    waits: tuple[str, ...] = WAIT_PATTERNS
    optimizer: tuple[str, ...] = OPTIMIZER_PATTERNS
    cpu_compute_ops: tuple[str, ...] = CPU_COMPUTE_OPS
    _compiled: dict = field(default_factory=dict, compare=False, repr=False)

    def _re(self, pattern: str) -> re.Pattern:
        c = self._compiled.get(pattern)
        if c is None:
            c = self._compiled[pattern] = re.compile(pattern)
        return c

    def _any(self, patterns: Iterable[str], names: Sequence[str]) -> np.ndarray:
        combined = self._re("|".join(f"(?:{p})" for p in patterns)) if patterns else None
        if combined is None:
            return np.zeros(len(names), dtype=bool)
        return np.fromiter((combined.search(n) is not None for n in names), dtype=bool, count=len(names))

    def kernel_class(self, names: Sequence[str]) -> np.ndarray:
        """Class index (into :data:`calib.core.schema.KERNEL_CLASSES`) for each unique name."""
        out = np.full(len(names), KERNEL_CLASSES.index("other"), dtype=np.int8)
        todo = np.ones(len(names), dtype=bool)
        for pattern, cls in self.kernel_classes:
            rx = self._re(pattern)
            idx = np.flatnonzero(todo)
            hit = np.fromiter((rx.search(names[i]) is not None for i in idx), dtype=bool, count=len(idx))
            out[idx[hit]] = KERNEL_CLASSES.index(cls)
            todo[idx[hit]] = False
        return out

    def is_comm(self, names: Sequence[str]) -> np.ndarray:
        return self._any(self.comm, names)

    def is_host_only(self, names: Sequence[str]) -> np.ndarray:
        return self._any(self.host_only_ops, names)

    def is_wait(self, names: Sequence[str]) -> np.ndarray:
        return self._any(self.waits, names)

    def is_optimizer(self, names: Sequence[str]) -> np.ndarray:
        return self._any(self.optimizer, names)

    def is_cpu_compute(self, names: Sequence[str]) -> np.ndarray:
        return self._any(self.cpu_compute_ops, names)


DEFAULT_RULES = Rules()


def load_rules(path: str | Path | None) -> Rules:
    """Built-in rules, extended by a user file whose rules take precedence."""
    if path is None:
        return DEFAULT_RULES
    path = Path(path)
    try:
        text = path.read_text()
        if path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise InputError(path, f"cannot read rules: {exc}") from None
    if not isinstance(data, dict):
        raise InputError(path, "rules file must hold a mapping")
    known = {"kernel_classes", "comm", "host_only_ops", "waits", "optimizer", "cpu_compute_ops"}
    unknown = set(data) - known
    if unknown:
        raise InputError(path, f"unknown rule groups {sorted(unknown)} (known: {sorted(known)})")
    kc = data.get("kernel_classes", [])
    if not isinstance(kc, list) or not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in kc):
        raise InputError(path, "kernel_classes must be a list of [pattern, class] pairs")
    for _pattern, cls in kc:
        if cls not in KERNEL_CLASSES:
            raise InputError(path, f"unknown kernel class '{cls}' (known: {', '.join(KERNEL_CLASSES)})")
    lists = {}
    for key in ("comm", "host_only_ops", "waits", "optimizer", "cpu_compute_ops"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise InputError(path, f"{key} must be a list of regular expressions")
        lists[key] = tuple(value)
    for pattern in [p for p, _ in kc] + [p for v in lists.values() for p in v]:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InputError(path, f"bad regular expression {pattern!r}: {exc}") from None
    return Rules(
        kernel_classes=tuple((p, c) for p, c in kc) + KERNEL_CLASS_RULES,
        comm=lists["comm"] + COMM_PATTERNS,
        host_only_ops=lists["host_only_ops"] + HOST_ONLY_OPS,
        waits=lists["waits"] + WAIT_PATTERNS,
        optimizer=lists["optimizer"] + OPTIMIZER_PATTERNS,
        cpu_compute_ops=lists["cpu_compute_ops"] + CPU_COMPUTE_OPS,
    )
