"""Multi-head latent attention (MLA) projections and the multi-token prediction (MTP) module.

**MLA** (DeepSeek-V2/V3; DeepSeek-V3 report arXiv:2412.19437 sec. 2.1.1; weights as in the
Hugging Face checkpoint's modeling_deepseek.py).  Queries and keys/values pass through
low-rank bottlenecks; the keys carry a decoupled RoPE part of width r shared by the heads:

    q_a_proj  d x q_rank            q_b_proj   q_rank x a h_qk           (full rank: d x a h_qk)
    kv_a_proj d x (kv_rank + r)     kv_b_proj  kv_rank x a (h_qk - r + h_v)
    o_proj    a h_v x d

with h_qk = qk_head_dim (d / a when unset) and h_v = v_head_dim.  DeepSeek-V3 (config.json:
d 7168, a 128, q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
v_head_dim 128): 11,010,048 + 37,748,736 + 4,128,768 + 16,777,216 + 117,440,512 =
187,105,280 weights per layer, where (2 + 2 kv/a) d^2 counts 205,520,896.  The two latent
norms (q_a_layernorm, kv_a_layernorm) are vectors, left out as every norm is here.
A model with none of q_lora_rank, kv_lora_rank, qk_rope_head_dim set keeps (2 + 2 kv/a) d^2
through the same function as before (formulas.attention_matrix_params), whatever its head
widths: qk_head_dim / v_head_dim alone set only the attention core's FLOPs
(shape_terms.attention_dims_factor).  Every projection is taken as split over TP (Megatron-Core
replicates the two down-projections; immaterial at TP 1, as DeepSeek-V3 trains).

Kept activations (:func:`attention_kept_coeffs`, in place of the attention part of
formulas.activation_bytes_layer; HF modeling_deepseek's tensors, bf16 as the other formulas):
besides the layer-norm input and the input norm's output that feeds q_a and kv_a (both kept as
for any layer), the q latent c_q and its norm (2 q_rank), the kv latent c_kv with k_rope and
c_kv's norm (2 kv_rank + r) -- replicated over TP like the layer's other d-wide tensors (split
only with sequence parallelism); and the up-projected q and k (a h_qk each), v (a h_v) the fused
attention keeps and its output into o_proj (a h_v) -- split over TP like Q, K, V.  DeepSeek-V3:
(8320 + 163840) bytes per token against full heads' 16 d = 114,688.  Where ``kv / a`` full
heads stood, the real projections now count: op-level SAC re-runs every second matmul of
torchtitan's call order q_a, q_b, kv_a, kv_b, o, then the MLP's (:func:`op_sac_terms`);
context parallelism exchanges the up-projected K and V (:func:`head_widths`, analytic.context);
FP8 casts read each projection's input and gradient output (:func:`linear_io`); the MTP block
is a ZeRO-3 gathered layer (shape_terms.layer_params_gpu, zero_overlap.mtp_matrices).  The trace-
fitted device model's activation bytes count the same tensors beyond its full heads (stop 29,
device_path.mla_act_bytes_layer; plus what HF's implementation keeps beyond this count,
device_path.hf_mla_kept_extra, stop 32).  Still full-head: the element-wise traffic
(formulas.vector_traffic_bytes_layer, GPT's shape for every model) and the device model's
streamed bytes where no dense MLA run was traced (calibrate.device_mla measures them).

**MTP** (report sec. 2.2): each of ``mtp_layers`` depths adds one Transformer block of the
last layer's kind (MLA + MoE for DeepSeek-V3), a projection M of 2d x d and two RMSNorms; the
embedding and output head are shared with the main model.  Per depth: block 11.507 B +
projection 0.103 B = 11.61 B new weights (the checkpoint's "14B" also stores copies of the
embedding and head).  In training each depth runs its block, the projection, the shared head
and a cross-entropy once more per token.  Placement (a stated assumption): each MTP block is
one more layer at the end of the stack, so the pipeline partition splits L + depths layers
over the stages by the same rule as the model's own (analytic.uneven: the first stages take
the extra layers of an uneven split, the last stage the fewest); the head's second pass and
the projection ride with the LM head on the last stage.  DeepSeek-V3 sec. 3.2.3 puts the
output head, which the MTP module shares, on the DualPipe rank that also holds the shallowest
layers, and does not publish how layers are balanced around it.  Taking the MTP block on top
of the last stage's own layers instead (Megatron-Core's placement before
``--decoder-last-pipeline-num-layers`` rebalances it) makes that stage the pipeline's pace:
the DeepSeek-V3 row comes out -34.17 % against -22.79 % this way, -13.05 % once DualPipe
pairs the last stage with the first (analytic.uneven); all reported in docs/analytic.md,
this rule chosen after they were seen.  So

* time: the largest and the last stage's layer counts are those of L + depths layers; per
  micro-batch the last stage also runs the head once more plus the projection (at the head's
  efficiency, 2d / V of its FLOPs); only the excess over the stage's lighter share of layers
  is on the critical path (uneven.head_excess_s);
* weights, gradients, optimizer states: charged to the stage the memory model charges (its
  largest), the conservative bound, as the embedding is (shape_terms.stage_params);
* activations: with one stage, and under DualPipe (whose GPU 0 holds the first and the last
  stage), they add one layer's and one head's logits per depth; with 1F1B the last stage
  holds one micro-batch in flight and never sets the peak (memory.py's first stage holds
  min(p, m)), so nothing is added;
* FLOPs: model and hardware FLOPs (reported TFLOP/s, MFU) count the MTP work too (3 x forward
  of block + projection + head, recompute on block and projection as on the layers): it is
  matmul work every training step runs.  DeepSeek publishes no MFU or its FLOP convention.
"""

from __future__ import annotations

import numpy as np
from calib.analytic import formulas as F

MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim")


def check(model, who: str, max_count: int = 2**53) -> None:
    """One-line InputError for a bad MLA / MTP field of a ModelSpec."""
    from calib.core.errors import InputError

    def is_int(v, lo):
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= max_count

    for f in MLA_FIELDS:
        v = getattr(model, f)
        if v is not None and not is_int(v, 0):
            raise InputError(who, f"{f} must be a non-negative integer (0 or absent: none), got {v!r:.40}")
    if not is_int(model.mtp_layers, 0):
        raise InputError(who, f"mtp_layers must be a non-negative integer, got {model.mtp_layers!r:.40}")
    rope = model.qk_rope_head_dim or 0
    if rope and not model.kv_lora_rank:
        raise InputError(who, f"qk_rope_head_dim {rope} needs kv_lora_rank (the decoupled RoPE key of MLA)")
    h_qk = model.qk_head_dim or model.d_model / model.n_heads
    if rope >= h_qk:
        raise InputError(who, f"qk_rope_head_dim {rope} must be below the query/key head width {h_qk:g}")


def uses_mla(model) -> bool:
    return any(getattr(model, f, None) for f in MLA_FIELDS)


def attention_proj_params(model) -> np.ndarray:
    """Weights of one layer's attention projections, before TP (module docstring): MLA's
    low-rank projections where any MLA field is set, else (2 + 2 kv/a) d^2 exactly."""
    linears = attention_linears(model)
    if linears is None:
        d, a = np.asarray(model.d_model, dtype=float), np.asarray(model.n_heads, dtype=float)
        return F.attention_matrix_params(d, np.asarray(model.shape_extras["kv"], dtype=float) / a)
    return np.asarray(sum(i * o for i, o, _ in linears), dtype=float)  # the shapes, written once


def attention_linears(model) -> tuple | None:
    """(in, out, column-parallel) of MLA's projections (module docstring), for the device
    model's per-GEMM times; None without MLA (Q, K, V, O of d / a-wide heads)."""
    if not uses_mla(model):
        return None
    ex = model.shape_extras
    d, a = float(model.d_model), float(model.n_heads)
    kv = float(ex["kv"])
    h_qk = float(ex.get("qk_head_dim") or 0) or d / a
    h_v = float(ex.get("v_head_dim") or 0) or d / a
    q_r, kv_r, rope = (float(getattr(model, f) or 0) for f in MLA_FIELDS)
    q = ((d, q_r, 1.0), (q_r, a * h_qk, 1.0)) if q_r else ((d, a * h_qk, 1.0),)
    if kv_r:
        k_v = ((d, kv_r + rope, 1.0), (kv_r, a * (h_qk - rope + h_v), 1.0))
    else:
        k_v = ((d, kv * h_qk, 1.0), (d, kv * h_v, 1.0))
    return (*q, *k_v, (a * h_v, d, 0.0))


def attention_kept_coeffs(model) -> tuple[float, float] | None:
    """(split over TP, replicated) bytes per s b d MLA's attention keeps for backward beyond the
    layer-norm input and the attention input (module docstring), 2 bytes a value: split
    2 (q + k + v + output) widths / d, replicated 2 (2 q_rank + 2 kv_rank + r) / d.  Without a
    kv latent, k and v are kv heads wide; without a q latent there is no c_q.  None without MLA
    (formulas.kept_split_coeff's 4 + 4 kv/a)."""
    if not uses_mla(model):
        return None
    (q, k, v, o), q_r, kv_r, rope = _kept_widths(model)
    d = float(model.d_model)
    return 2.0 * (q + k + v + o) / d, 2.0 * (2.0 * q_r + 2.0 * kv_r + rope) / d


def op_sac_attention(linears, d) -> tuple[float, float, int] | None:
    """(re-run weights, kept bytes per s b d, matmul count) of the attention projections
    ``linears`` (:func:`attention_linears`, in torchtitan's call order: q_a, q_b or q, kv_a,
    kv_b, o) under op-level SAC (formulas.op_sac_recompute_flops): the even ones re-run, the odd
    ones' outputs and the attention output (o's input) kept, 2 bytes a value.  None: full heads."""
    if linears is None:
        return None
    rerun = sum(i * o for k, (i, o, _) in enumerate(linears) if k % 2)
    kept = sum(o for k, (_, o, _) in enumerate(linears) if not k % 2) + linears[-1][0]
    return float(rerun), 2.0 * kept / float(d), len(linears)


def linear_io(linears) -> tuple[float, float] | None:
    """(inputs, outputs) per token summed over the projections ``linears``
    (:func:`attention_linears`): what their FP8 casts read (precision.cast_bytes_layer);
    DeepSeek-V3 32,768 and 66,624 where fused QKV + projection of full heads said 2 d and 4 d."""
    if linears is None:
        return None
    return float(sum(i for i, _, _ in linears)), float(sum(o for _, o, _ in linears))


def op_sac_terms(model) -> tuple[float, float, int] | None:
    """:func:`op_sac_attention` of the model's MLA projections; None without MLA."""
    return op_sac_attention(attention_linears(model), model.d_model)


def head_widths(model) -> tuple | None:
    """(q, k, v, attention output) values per token before TP: a h_qk, a h_qk, a h_v, a h_v
    with a kv latent (kv heads for k, v without); None without MLA.  Kept activations
    (:func:`attention_kept_coeffs`) and context parallelism's K/V bytes (analytic.context)."""
    return _kept_widths(model)[0] if uses_mla(model) else None


def _kept_widths(model) -> tuple:
    ex = model.shape_extras
    d, a, kv = float(model.d_model), float(model.n_heads), float(ex["kv"])
    h_qk = float(ex.get("qk_head_dim") or 0) or d / a
    h_v = float(ex.get("v_head_dim") or 0) or d / a
    q_r, kv_r, rope = (float(getattr(model, f) or 0) for f in MLA_FIELDS)
    heads = a if kv_r else kv  # the kv latent up-projects to every head
    return (a * h_qk, heads * h_qk, heads * h_v, a * h_v), q_r, kv_r, rope


def depths(model) -> int:
    return int(getattr(model, "mtp_layers", 0) or 0)


def _mlp(model, mats: float) -> tuple[float, float, float]:
    """(total, active, of them routed per expert) MLP weights of one block of the last layer's kind."""
    from calib.analytic import moe as MOE

    return MOE.layer_mlp_params(model, mats)


def mtp_params(model) -> tuple[float, float]:
    """(total, active) weights of the MTP module: depths x (block + projection 2 d^2)."""
    n = depths(model)
    if not n:
        return 0.0, 0.0
    mats = 3.0 if model.mlp == "swiglu" else 2.0
    d = float(model.d_model)
    attn = float(attention_proj_params(model)) + 2.0 * d * d
    tot, act, _ = _mlp(model, mats)
    return n * (attn + tot), n * (attn + act)


def mtp_forward_flops_per_token(model) -> float:
    """Forward FLOPs per token of the MTP module: per depth 2 x (block active + 2 d^2) + the
    attention core 4 s d + the shared head once more 2 d V."""
    d = float(model.d_model)
    _, act = mtp_params(model)
    return 2.0 * act + depths(model) * (4.0 * float(model.seq_len) * d + 2.0 * d * float(model.vocab))


def mtp_iteration_flops(model, B, s, rc) -> tuple[np.ndarray, np.ndarray]:
    """(model, hardware) FLOPs of the MTP module per iteration of B sequences of s: 3 x forward;
    the hardware count adds recompute as the layers get it (full: block and projection once
    more; selective: the attention core 4 s^2 d; op-level SAC: the block's every second matmul,
    formulas.op_sac_recompute_flops, with a MoE block's experts not re-run as on the layers,
    whose dense MLP width averages them out); the head is never recomputed."""
    n = depths(model)
    if not n:
        return np.zeros(()), np.zeros(())
    B, s = np.asarray(B, dtype=float), np.asarray(s, dtype=float)
    mats = 3.0 if model.mlp == "swiglu" else 2.0
    d, V = float(model.d_model), float(model.vocab)
    _, act, _ = _mlp(model, mats)
    mat_fwd = 2.0 * s * (float(attention_proj_params(model)) + act + 2.0 * d * d)
    core_fwd = 4.0 * s * s * d
    head = 6.0 * s * d * V
    rc = np.asarray(rc)
    extra = np.where(rc == F.FULL, mat_fwd + core_fwd, np.where(rc == F.SELECTIVE, core_fwd, 0.0))
    f = 0.0 if int(getattr(model, "n_experts", 0) or 0) else float(model.ffn_size)  # MoE: no dense MLP
    kv = float(model.shape_extras["kv"]) / float(model.n_heads)
    extra = np.where(rc == F.OP, F.op_sac_recompute_flops(1.0, s, d, f, kv, op_sac_terms(model), mats), extra)
    model_fl = n * B * (3.0 * (mat_fwd + core_fwd) + head)
    return model_fl, model_fl + n * B * extra


def iteration_flops(model, B, rc, ffn, attn) -> tuple[np.ndarray, np.ndarray]:
    """(model, hardware) FLOPs per iteration of B sequences, the reported TFLOP/s' basis:
    layers (3 x forward, 2 x matrix weights + 4 s d; ``ffn`` the dense MLP width averaged over
    the layers, ``attn`` the attention projection weights) + the LM head 6 s d V + MoE experts
    counted active + the MTP module; hardware FLOPs add recompute."""
    from calib.analytic import modern as X
    from calib.analytic.shape_terms import shape_terms

    d, L, s, V = (
        np.asarray(getattr(model, c), dtype=float) for c in ("d_model", "n_layers", "seq_len", "vocab")
    )
    _, kv_frac, mats, _ = shape_terms(model)
    B, rc = np.asarray(B, dtype=float), np.asarray(rc)
    moe, head = X.moe_model_flops(model, B, s), F.lm_head_flops(1.0, s, d, V)
    mtp_fl, mtp_hw = mtp_iteration_flops(model, B, s, rc)
    model_fl = moe + B * (F.training_flops_layers(1.0, s, d, L, F.NONE, ffn, kv_frac, mats, attn) + head)
    hw_fl = moe * np.where(rc == F.FULL, 4.0 / 3.0, 1.0) + B * (
        F.training_flops_layers(1.0, s, d, L, rc, ffn, kv_frac, mats, attn, op_sac_terms(model)) + head
    )
    return model_fl + mtp_fl, hw_fl + mtp_hw


def with_mtp(model, d, V, heads: tuple) -> tuple:
    """The last stage's head terms with the MTP module: + depths x the head once more x
    (1 + 2d / V, the projection's FLOPs over the head's).  The MTP blocks themselves are
    layers of the pipeline partition (timemodel: L + depths over the stages)."""
    n = depths(model)
    if not n:
        return heads
    proj = 2.0 * np.asarray(d, dtype=float) / np.asarray(V, dtype=float)
    return tuple(h + n * h * (1.0 + proj) for h in heads)


def mtp_stage_params(model, d, t, ep, mats) -> tuple[np.ndarray, np.ndarray]:
    """(weights per GPU over TP: attention, projection, shared experts, router or dense MLP;
    routed-expert weights per GPU: E / ep experts) of the MTP module."""
    n = depths(model)
    if not n:
        return np.zeros(()), np.zeros(())
    d = np.asarray(d, dtype=float)
    _, act, one = _mlp(model, float(mats))
    from calib.analytic import moe as MOE

    m = MOE.terms(model)
    dense = attention_proj_params(model) + 2.0 * d * d + act - m["k"] * one  # shared + router or MLP
    return n * dense / np.asarray(t, dtype=float), n * (m["E"] / np.asarray(ep, dtype=float)) * one


def mtp_activation_bytes(model, p, per_layer, logits, schedule=0) -> np.ndarray:
    """depths x (one layer's kept activations + one head's fp32 logits) where the stage that
    runs the MTP module sets the memory peak: a single stage, or DualPipe, whose GPU 0 holds
    the first stage (the most micro-batches in flight) and the last (analytic.uneven).  With
    1F1B the last stage holds one micro-batch in flight and never sets the peak: 0."""
    from calib.analytic.bubble import DUALPIPE

    n = depths(model)
    if not n:
        return np.zeros(())
    peak = (np.asarray(p) == 1) | (np.asarray(schedule) == DUALPIPE)
    return np.where(peak, n * (np.asarray(per_layer) + np.asarray(logits)), 0.0)


def device_notes(model, dm) -> list[str]:
    """What a prediction of an MLA model on a fitted device model (``dm``; None: the spec
    path, no note) takes for MLA's host operators and element-wise work (calibrate.device_mla)."""
    if dm is None or not uses_mla(model):
        return []
    if dm.mla is not None:
        return [f"MLA: the traced implementation's host operators and element-wise work, measured on {', '.join(dm.mla.runs)}"]  # fmt: skip
    return [
        "MLA: its GEMMs from the projections' shapes; its host operators and element-wise work taken as the dense "
        "family's (stated default: no dense MLA run traced on this system; HF's DeepseekV3Attention issued 271 "
        "host ops per layer more than LlamaAttention on an H200, fixtures/traces/h200c)"
    ]


def params_note(model, total: float, active: float) -> str:
    """The MoE parameter note, with the MTP module apart where the model has one."""
    text = f"MoE: {total / 1e9:.1f} B parameters, {active / 1e9:.1f} B active per token"
    if depths(model):
        tot, act = mtp_params(model)
        text += f" (main model; MTP module {tot / 1e9:.2f} B more, {act / 1e9:.2f} B active, its blocks in the last stages)"
    return text
