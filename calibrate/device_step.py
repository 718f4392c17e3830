"""One training step of a transformer on one device, from the fitted device model.

Vectorised over strategies (every argument broadcasts), so the same code times one run
for ``calib fit``'s leave-one-run-out check and millions of strategies for the search.

Per micro-batch and layer (tensor-parallel size t, tokens T = b s):

* GEMMs: every linear layer of the implementation (GELU family: fused QKV, output,
  fc1, fc2; SwiGLU family: q, k, v, output, gate, up, down), each as forward
  (T x out x in), input gradient (T x in x out) and weight gradient (out x in x T),
  timed by the roofline of :class:`~calib.calibrate.device_model.GemmModel`;
* attention: fused (flash) ``c_flop L b a s^2 h' + c_io L b a s h'``; unfused attention
  as two batched GEMMs per direction plus the score tensors streamed by softmax;
* memory-bound kernels: the family's streamed bytes per token-layer (units of d and of
  ffn) at the achieved bandwidth, plus a fixed cost per kernel.

Per step: LM head GEMMs and the loss (bytes per logit), weight casts (bytes per
parameter), the fused optimizer (bytes per parameter), and the host's issue time.
"""

from __future__ import annotations

import numpy as np
from calib.calibrate import device_attention as A
from calib.calibrate.device_model import (
    ADAM_BYTES_PER_PARAM,
    GRAD_BYTES_PER_PARAM,
    STATIC_BYTES_PER_PARAM,
    SWIGLU,
    DeviceModel,
    Family,
    act_count,
)
from calib.calibrate.params import Param
from numpy.typing import ArrayLike


def _f(x: ArrayLike) -> np.ndarray:
    return np.asarray(x, dtype=float)


def _bw(dm: DeviceModel, fam: Family | None) -> float:
    return (fam.stream_tbps if fam is not None and fam.stream_tbps is not None else dm.stream_tbps).value


def _t0(dm: DeviceModel, fam: Family | None) -> float:
    return (
        fam.kernel_fixed_s if fam is not None and fam.kernel_fixed_s is not None else dm.kernel_fixed_s
    ).value


def linears(d, a, kv, ffn, mlp: str, attn=None) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """(in, out, column_parallel) of every linear layer of one transformer layer; ``attn``:
    the attention projections' own list where they are not Q, K, V and O of d / a-wide heads
    (low-rank ones: analytic.mla.attention_linears)."""
    d, a, kv, ffn = _f(d), _f(a), _f(kv), _f(ffn)
    hd = d / a
    if mlp == SWIGLU:
        mlp_lin = [(d, ffn, 1.0), (d, ffn, 1.0), (ffn, d, 0.0)]
        att = [(d, d, 1.0), (d, kv * hd, 1.0), (d, kv * hd, 1.0), (d, d, 0.0)]
    else:
        mlp_lin = [(d, ffn, 1.0), (ffn, d, 0.0)]
        att = [(d, d + 2.0 * kv * hd, 1.0), (d, d, 0.0)]
    att = att if attn is None else [(_f(i), _f(o), float(c)) for i, o, c in attn]
    return att + mlp_lin


def sharded_linears(d, a, kv, ffn, t, mlp: str, attn=None):
    """(in, out) of every linear layer on one of ``t`` tensor-parallel GPUs: a column-
    parallel layer splits its output, a row-parallel one its input."""
    t = _f(t)
    for i, o, col in linears(d, a, kv, ffn, mlp, attn):
        yield np.where(col > 0, i, i / t), np.where(col > 0, o / t, o)


def layer_params(d, a, kv, ffn, mlp: str, attn=None) -> np.ndarray:
    """Weights of one layer (biases and norms are < 0.1 % and left out)."""
    return sum(i * o for i, o, _ in linears(d, a, kv, ffn, mlp, attn))


def gemm_layer_s(
    dm: DeviceModel, T, d, a, kv, ffn, t, mlp: str, passes_fwd=1.0, scale=1.0, attn=None
) -> np.ndarray:
    """GEMM seconds of one layer's forward (``passes_fwd`` times) and backward; ``scale``
    multiplies the fitted FLOP rate (FP8 GEMMs: the FP8 over the bf16 peak); ``attn`` as in
    :func:`linears`."""
    T = _f(T)
    g = dm.gemm
    total = 0.0
    for i_t, o_t in sharded_linears(d, a, kv, ffn, t, mlp, attn):
        fwd = g.time_s(T, np.round(o_t), np.round(i_t), scale=scale)
        dgrad = g.time_s(T, np.round(i_t), np.round(o_t), scale=scale)
        wgrad = g.time_s(np.round(o_t), np.round(i_t), T, scale=scale)
        total = total + passes_fwd * fwd + dgrad + wgrad
    return np.asarray(total)


def fp8_operand_elems_layer(T, d, a, kv, ffn, t, mlp: str, passes_fwd=1.0, attn=None) -> np.ndarray:
    """Operand elements of one layer's linear GEMMs (forward ``passes_fwd`` times, input and
    weight gradients) on one GPU: what FP8 casts (scales, transposes) must touch.  Forward
    X W: T i + i o; input gradient: T o + i o; weight gradient: T i + T o."""
    T = _f(T)
    total = 0.0
    for i_t, o_t in sharded_linears(d, a, kv, ffn, t, mlp, attn):
        total = total + _f(passes_fwd) * (T * i_t + i_t * o_t) + (T * o_t + i_t * o_t) + (T * i_t + T * o_t)
    return np.asarray(total)


def head_gemm_s(dm: DeviceModel, T, d, V, t) -> np.ndarray:
    """The LM head's three GEMMs (forward, input gradient, weight gradient)."""
    Vt = np.ceil(_f(V) / _f(t))
    g = dm.gemm
    return g.time_s(T, Vt, d) + g.time_s(T, d, Vt) + g.time_s(Vt, d, T)


def attention_layer_s(dm: DeviceModel, b, s, d, a, t, flash, passes_fwd=1.0) -> np.ndarray:
    """Attention core (scores, softmax, weighted sum) of one layer, forward + backward."""
    b, s, d, a, t = _f(b), _f(s), _f(d), _f(a), _f(t)
    heads = np.maximum(a / t, 1.0)
    hd = d / a
    hd_pad = A.padded_head(d, a, dm.attn_head_tile)
    # backward is ~2.5x forward; the fitted constants hold forward + backward once
    scale = (passes_fwd + 2.5) / 3.5
    score = dm.attn_s_per_score.value if dm.attn_s_per_score is not None else 0.0
    fused = scale * A.layer_s(dm.attn_s_per_flop.value, dm.attn_s_per_io.value, score, b, heads, s, hd_pad)
    g = dm.gemm
    bh = b * heads
    mm = g.time_s(s, s, hd, bh) + g.time_s(s, hd, s, bh)  # Q K^T and P V
    softmax_bytes = 4.0 * 2.0 * bh * s * s  # scores and probabilities, bf16, read + write
    unfused = (passes_fwd + 2.0) * mm + (passes_fwd + 1.0) * softmax_bytes / (_bw(dm, None) * 1e12)
    return np.where(np.asarray(flash, dtype=bool), fused, unfused)


def stream_layer_s(dm: DeviceModel, fam: Family, T, d, ffn, t, sp, passes_fwd=1.0) -> np.ndarray:
    """Memory-bound kernels of one layer: streamed bytes at the achieved bandwidth."""
    T, d, ffn, t = _f(T), _f(d), _f(ffn), _f(t)
    nbytes = T * (fam.bytes_d.value * d_part(d, t, sp) + fam.bytes_ffn.value * ffn / t)
    return streamed_s(dm, fam, nbytes, fam.kernels_layer.value, passes_fwd)


def act_split(t, sp) -> np.ndarray:
    """How many GPUs of a TP group share the d-wide activations and their element-wise work
    (norms, residuals, dropout): t with sequence parallelism; 1 without it (replicated)."""
    return np.where(np.asarray(sp, dtype=bool), _f(t), 1.0)


def d_part(d, t, sp) -> np.ndarray:
    """The share of d-wide element-wise work one GPU of a TP group does (:func:`act_split`)."""
    return _f(d) / act_split(t, sp)


def streamed_s(dm: DeviceModel, fam: Family, nbytes, kernels, passes_fwd=1.0) -> np.ndarray:
    """Seconds of memory-bound work measured on a training step (``nbytes`` at the family's
    bandwidth plus ``kernels`` fixed costs) when the forward runs ``passes_fwd`` times:
    forward is about a third of the element-wise work."""
    scale = (_f(passes_fwd) + 2.0) / 3.0
    return scale * (_f(nbytes) / (_bw(dm, fam) * 1e12) + _f(kernels) * _t0(dm, fam))


def _kind_bw(dm: DeviceModel, fam: Family, kind: Param | None) -> float:
    return kind.value if kind is not None else _bw(dm, fam)


def head_stream_s(dm: DeviceModel, fam: Family, T, V, t) -> np.ndarray:
    """Loss and logit kernels (softmax, casts, cross-entropy) of one micro-batch."""
    return _f(T) * _f(V) / _f(t) * fam.bytes_vocab.value / (_kind_bw(dm, fam, dm.vocab_tbps) * 1e12)


def step_fixed_s(dm: DeviceModel, fam: Family, layer_params_gpu, embed_entries_gpu) -> np.ndarray:
    """Per-step memory-bound work on the weights: casts and gradient accumulation of the
    layers' parameters and of the embedding matrix (V x d entries), plus fixed kernels."""
    nbytes = _f(layer_params_gpu) * fam.bytes_param.value + _f(embed_entries_gpu) * fam.bytes_embed.value
    return nbytes / (_kind_bw(dm, fam, dm.weight_tbps) * 1e12) + fam.kernels_step.value * _t0(dm, fam)


def optimizer_s(dm: DeviceModel, fam: Family, params_opt) -> np.ndarray:
    """The fused Adam step over the parameters this GPU updates."""
    fixed = dm.optimizer_fixed_s.value if dm.optimizer_fixed_s is not None else 0.0
    return fixed + _f(params_opt) * ADAM_BYTES_PER_PARAM[fam.weights] / (dm.optimizer_tbps.value * 1e12)


def host_s(dm: DeviceModel, fam: Family, layers, microbatches, extra_ops_layer=0.0) -> np.ndarray:
    """Unprofiled host issue time of one step: operators times seconds per operator
    (``extra_ops_layer``: operators per layer beyond the family's, e.g. MoE routing)."""
    ops = (fam.host_ops_layer.value + _f(extra_ops_layer)) * _f(layers) * _f(
        microbatches
    ) + fam.host_ops_step.value
    # a per-step intercept fitted from few layer counts can come out negative: never fewer than none
    return np.maximum(ops, 0.0) * (fam.host_s_per_op or dm.host_s_per_op).value


def step_s(gpu_s: ArrayLike, host: ArrayLike, dm: DeviceModel, fam: Family | None = None) -> np.ndarray:
    """A step takes the longer of the device's work (plus its fixed idle gaps: the
    family's where measured, torch.compile's) and the host's."""
    gap = fam.step_gap_s if fam is not None and fam.step_gap_s is not None else dm.step_gap_s
    return np.maximum(_f(gpu_s) + gap.value, _f(host))


def attn_factor(fam: Family) -> float:
    """The family's traced attention kernel time over the device model's (torch.compile
    runs, device_compile); 1 for the eager families the attention terms were fitted on."""
    return 1.0 if fam.attn_scale is None else float(fam.attn_scale.value)


def act_layer_bytes(fam: Family, d, kv_frac, ffn) -> np.ndarray:
    """Activation bytes kept per token and layer: the hand count times the fitted scale."""
    return fam.act_scale.value * act_count(fam.key, d, kv_frac, ffn)


def state_bytes_per_param(weights: str) -> tuple[float, float, float]:
    """(weights, optimizer states, gradients) bytes per parameter of a traced precision:
    bf16 weights with bf16 Adam moments (2, 4, 2); fp32 weights under autocast with their
    bf16 copy and fp32 moments (6, 8, 4)."""
    opt = 8.0 if weights != "bf16" else 4.0
    return STATIC_BYTES_PER_PARAM[weights] - opt, opt, GRAD_BYTES_PER_PARAM[weights]


def memory_bytes(
    dm: DeviceModel, fam: Family, params_w, params_opt, params_grad, T, layers, d, V, t, acts_scale=1.0,
    *, ffn=None, kv_frac=1.0,
):  # fmt: skip
    """Peak memory per GPU: the larger of the forward peak (weights, optimizer states,
    activations, logits) and the end of backward (weights, states and gradients)."""
    w_b, opt_b, g_b = state_bytes_per_param(fam.weights)
    w, opt, grads = _f(params_w) * w_b, _f(params_opt) * opt_b, _f(params_grad) * g_b
    ffn = 4.0 * _f(d) if ffn is None else _f(ffn)
    acts = act_layer_bytes(fam, d, kv_frac, ffn) * _f(T) * _f(layers) / _f(t) * _f(acts_scale)
    # a torch.compile family fuses the loss and keeps its own logit bytes (device_compile)
    logit_b = (dm.logit_bytes if fam.logit_bytes is None else fam.logit_bytes).value
    logits = logit_b * _f(T) * _f(V) / _f(t)
    fwd_peak = w + opt + acts + logits
    bwd_end = w + opt + grads
    total = np.maximum(fwd_peak, bwd_end)
    return {
        "weights": w,
        "optimizer": opt,
        "grads": np.where(fwd_peak >= bwd_end, 0.0, grads),
        "activations": np.where(fwd_peak >= bwd_end, acts + logits, 0.0),
        "total": total,
        # both sides of the max, for terms added on top (analytic.device_path.adjust_dm_memory)
        "grads_all": grads,
        "activations_all": acts + logits,
    }


def model_params(d, L, a, kv, ffn, V, mlp: str, tied=True) -> np.ndarray:
    """Parameters: layers' linears plus the embedding (twice when the LM head is untied)."""
    emb = _f(V) * _f(d) * np.where(np.asarray(tied, dtype=bool), 1.0, 2.0)
    return _f(L) * layer_params(d, a, kv, ffn, mlp) + emb


def single_gpu(dm: DeviceModel, d, L, a, kv, ffn, s, V, b, mlp: str, tied=True, flash=True,
               params=None, weights: str | None = None, gemm_scale=1.0, compiled: bool | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """One training step on one GPU (no parallelism): time components, step and memory;
    ``gemm_scale`` multiplies the layers' GEMM rate (FP8 GEMMs, casts not included);
    ``compiled``: the torch.compile family (default the model's view)."""
    fam, _ = dm.family(mlp, weights, compiled)
    T = _f(b) * _f(s)
    P = model_params(d, L, a, kv, ffn, V, mlp, tied) if params is None else _f(params)
    layer = (gemm_layer_s(dm, T, d, a, kv, ffn, 1.0, mlp, 1.0, gemm_scale) + attn_factor(fam) * attention_layer_s(dm, b, s, d, a, 1.0, flash)
             + stream_layer_s(dm, fam, T, d, ffn, 1.0, False))  # fmt: skip
    head = head_gemm_s(dm, T, d, V, 1.0) + head_stream_s(dm, fam, T, V, 1.0)
    emb = _f(V) * _f(d) * np.where(np.asarray(tied, dtype=bool), 1.0, 2.0)
    gpu = _f(L) * layer + head + step_fixed_s(dm, fam, P - emb, emb) + optimizer_s(dm, fam, P)
    host = host_s(dm, fam, L, 1.0)
    mem = memory_bytes(dm, fam, P, P, P, T, L, d, V, 1.0, ffn=ffn, kv_frac=_f(kv) / _f(a))
    return {"step_s": step_s(gpu, host, dm, fam), "gpu_s": gpu, "host_s": host, "mem_bytes": mem["total"]}
