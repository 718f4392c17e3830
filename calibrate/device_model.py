"""The physical compute model of one device: part of the calibration contract.

What one training step costs on one GPU, from the device's physics, every number fitted
from traces (and ``calib bench gemm``) with its uncertainty:

* **GEMMs** from their shapes: ``t = t_fixed + max(FLOPs / (rate * a), bytes / bw)``,
  a roofline with a per-kernel fixed cost, where ``a`` < 1 for a dimension that is not a
  multiple of 8 elements (cuBLAS then falls back to unaligned ``align1`` kernels: HF
  GPT-2's vocabulary 50257 runs at ~100-150 TFLOP/s while aligned layers run ~800).
* **attention** (fused, flash): ``c_flop * L b a s^2 h' + c_score * L b a s^2 + c_io * L b a
  s h'``, h' the head dimension padded to the kernels' multiple (:mod:`device_attention`).
* **memory-bound kernels** (element-wise, casts/copies, normalisation, cross-entropy)
  from the bytes they stream at the achieved bandwidth plus a fixed cost per kernel; how
  many bytes per token and layer an implementation streams is measured from its traces
  (:class:`Family`), not assumed.
* **optimizer** (fused Adam): bytes per parameter at the achieved bandwidth.
* **host**: seconds per host operator (unprofiled); a step takes the longer of the
  device's work plus the step's fixed gaps and the host's issue time.
* **memory**: weights and optimizer states by precision, activations per token-layer
  per unit of d, logits per token per vocabulary entry (fitted from peak memory).

Efficiencies are fractions of ``peak_tflops`` / ``hbm_tbps`` (the device's datasheet, or
the measured best when no datasheet is known).  Transfer to other hardware follows one
rule (:meth:`DeviceModel.on`): rates scale with the peak FLOP/s, bandwidths with HBM
bandwidth, host costs stay (same host software).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from calib.calibrate.device_attention import LEGACY_HEAD_TILE
from calib.calibrate.params import FitQuality, Param
from numpy.typing import ArrayLike

from calib.core.strict import reject_unknown

ALIGN_ELEMS = 8  # cuBLAS tensor-core kernels need 16-byte aligned rows: 8 bf16 elements
GELU, SWIGLU = "gelu", "swiglu"
FP32_AUTOCAST, BF16 = "fp32-autocast", "bf16"
#: bytes per parameter the fused Adam step streams: read p, g, m, v, write p, m, v
ADAM_BYTES_PER_PARAM = {FP32_AUTOCAST: 28.0, BF16: 14.0}
#: bytes per parameter held across the step at the activation peak (weights + Adam m, v;
#: gradients are freed by zero_grad(set_to_none) before forward) plus, under autocast, the
#: bf16 weight copies autograd keeps for backward
STATIC_BYTES_PER_PARAM = {FP32_AUTOCAST: 4.0 + 8.0 + 2.0, BF16: 2.0 + 4.0}
#: gradients appear during backward while activations are freed; after backward they are
#: all present: weights + Adam + gradients (+ the fused step's scratch, not modelled)
GRAD_BYTES_PER_PARAM = {FP32_AUTOCAST: 4.0, BF16: 2.0}
#: Activation bytes autograd keeps per token and layer, counted by hand from the HF
#: implementations (docs/calibrate.md): (per unit of d, per unit of d x kv/a, per unit of
#: ffn).  GPT-2 under autocast: layer-norm inputs in fp32 (4d each), bf16 copies of the
#: linears' inputs, sdpa's q, k, v and output, GELU-tanh's four saved tensors (8 ffn) and
#: the down projection's input.  Llama in bf16: RMSNorm's fp32 input and bf16 copies, the
#: same attention tensors, SwiGLU's gate, up, silu and product (8 ffn).  A fitted scale
#: (Family.act_scale) carries what the count misses.
ACT_COUNT = {f"{GELU}/{FP32_AUTOCAST}": (18.0, 4.0, 10.0), f"{SWIGLU}/{BF16}": (22.0, 4.0, 8.0)}


def act_count(key: str, d: ArrayLike, kv_frac: ArrayLike, ffn: ArrayLike) -> np.ndarray:
    """Hand-counted activation bytes per token and layer of family ``key`` (the same MLP
    kind's count for an implementation never counted)."""
    c = ACT_COUNT.get(key) or next((v for k, v in ACT_COUNT.items() if k.split("/")[0] == key.split("/")[0]),
                                   ACT_COUNT[f"{GELU}/{FP32_AUTOCAST}"])  # fmt: skip
    d = np.asarray(d, dtype=float)
    return c[0] * d + c[1] * d * np.asarray(kv_frac, dtype=float) + c[2] * np.asarray(ffn, dtype=float)


def _p(d: Mapping[str, Any] | None) -> Param | None:
    return Param.from_json(d) if d else None


@dataclass(frozen=True)
class GemmModel:
    """t = fixed_s + max(FLOPs / (rate * align), operand bytes / operand_tbps)."""

    rate_tflops: Param
    operand_tbps: Param
    fixed_s: Param
    unaligned_m: Param
    unaligned_n: Param
    unaligned_k: Param
    quality: FitQuality | None = None

    def time_s(self, m: ArrayLike, n: ArrayLike, k: ArrayLike, batch: ArrayLike = 1, scale: float = 1.0,
               bw_scale: float = 1.0, bytes_per_elem: float = 2.0) -> np.ndarray:  # fmt: skip
        """Seconds of one (batched) matmul C[m,n] = A[m,k] B[k,n]; arrays broadcast."""
        m, n, k, b = (np.asarray(x, dtype=float) for x in (m, n, k, batch))
        align = (
            np.where(m % ALIGN_ELEMS != 0, self.unaligned_m.value, 1.0)
            * np.where(n % ALIGN_ELEMS != 0, self.unaligned_n.value, 1.0)
            * np.where(k % ALIGN_ELEMS != 0, self.unaligned_k.value, 1.0)
        )
        flops = 2.0 * m * n * k * b
        nbytes = bytes_per_elem * (m * k + k * n + m * n) * b
        compute = flops / (self.rate_tflops.value * 1e12 * scale * align)
        stream = nbytes / (self.operand_tbps.value * 1e12 * bw_scale)
        return np.where(flops > 0, self.fixed_s.value + np.maximum(compute, stream), 0.0)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> GemmModel:
        reject_unknown(d, cls, "device_model.gemm")
        keys = ("rate_tflops", "operand_tbps", "fixed_s", "unaligned_m", "unaligned_n", "unaligned_k")
        return cls(**{k: Param.from_json(d[k]) for k in keys}, quality=FitQuality.from_json(d.get("quality")))


@dataclass(frozen=True)
class Family:
    """What one implementation (HF GPT-2 with GELU, HF Llama with SwiGLU, ...) makes the
    device and host do per token and layer, measured from its traces.

    Memory-bound bytes are the launching ops' input bytes: activations of width d (or
    3d, d + 2 kv) per token-layer per unit of d, of width ffn per unit of ffn, logits per
    token per vocabulary entry, and weights (autocast casts) per parameter.
    """

    mlp: str  # gelu or swiglu
    weights: str  # fp32-autocast or bf16
    bytes_d: Param  # streamed bytes per token per layer per unit of d
    bytes_ffn: Param  # streamed bytes per token per layer per unit of ffn
    bytes_vocab: Param  # streamed bytes per token per vocabulary entry (LM head, loss)
    bytes_param: Param  # streamed bytes per layer parameter per step (weight casts, gradient casts)
    bytes_embed: Param  # streamed bytes per embedding entry (V x d) per step (casts, tied-gradient adds)
    kernels_layer: Param  # memory-bound kernels per layer
    kernels_step: Param  # memory-bound kernels per step outside the layers
    host_ops_layer: Param  # host operators (all nesting levels) per layer
    host_ops_step: Param  # host operators per step outside the layers
    act_scale: Param  # measured activation memory over the hand count (ACT_COUNT)
    host_s_per_op: Param | None = None  # unprofiled host seconds per operator (None: the device's)
    stream_tbps: Param | None = (
        None  # achieved bandwidth of this family's memory-bound kernels (None: the device's)
    )
    kernel_fixed_s: Param | None = None  # fixed seconds per memory-bound kernel (None: the device's)
    runs: tuple[str, ...] = ()
    #: torch.compile (TorchInductor) runs of this MLP kind and precision (device_compile): the
    #: same GEMMs and optimizer, its own fused memory-bound kernels, host ops, activations,
    #: and the three terms below, each measured against the eager model on its traces
    compiled: bool = False
    attn_scale: Param | None = None  # traced attention kernel time over the device model's
    step_gap_s: Param | None = None  # device idle per device-bound step (None: the device's)
    cast_fusion: Param | None = None  # streamed bytes per token-layer over the eager family's
    logit_bytes: Param | None = None  # bytes per logit element at the memory peak (None: the device's)

    @property
    def key(self) -> str:
        return f"{self.mlp}/{self.weights}" + ("/compiled" if self.compiled else "")

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Family:
        return _terms_from_json(cls, d, "device_model.families")


@dataclass(frozen=True)
class MoeTerms:
    """What a traced mixture-of-experts implementation's layer streams and issues beyond the
    dense family's layer, per routed token (a token times its top-k experts), measured from
    MoE traces (:mod:`device_moe`): bytes per routed token per unit of d (permutation,
    gathers, scatter-adds, routing-weight products) and per unit of the expert width (the
    experts' element-wise work and masks), memory-bound kernels and host operators per MoE
    layer, and how much slower its grouped expert GEMMs run than the dense roofline."""

    bytes_d: Param
    bytes_ffn: Param
    kernels_layer: Param
    host_ops_layer: Param
    runs: tuple[str, ...] = ()
    #: traced grouped expert GEMMs' time over the roofline of the same shapes (None: 1)
    grouped_gemm_scale: Param | None = None
    #: the scale is measured beyond the grouping law (calibrate.grouped_gemm; from stop 33);
    #: False in calibrations fitted before it, whose scale holds the grouping itself
    grouping_law: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MoeTerms:
        return _terms_from_json(cls, d, "device_model.moe")


@dataclass(frozen=True)
class MlaTerms:
    """What a traced multi-head latent attention (DeepSeek-V2/V3) layer streams and issues
    beyond the dense family's layer (Q, K, V, O of full heads), measured from a dense MLA
    trace (:mod:`device_mla`): bytes per token-layer per unit of d (the latents' norms, the
    heads' split into rotary and plain parts, their concatenation), memory-bound kernels and
    host operators per layer."""

    bytes_d: Param
    kernels_layer: Param
    host_ops_layer: Param
    runs: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> MlaTerms:
        return _terms_from_json(cls, d, "device_model.mla")


def _terms_from_json(cls, d: Mapping[str, Any], where: str):
    """A dataclass of fitted terms (Params) and the runs they were measured on, from JSON."""
    reject_unknown(d, cls, where)
    out = {k: (Param.from_json(v) if isinstance(v, dict) else v) for k, v in d.items()}
    out["runs"] = tuple(d.get("runs", ()))
    return cls(**out)


@dataclass(frozen=True)
class DeviceModel:
    """One device's fitted compute model (see the module docstring)."""

    device: str
    peak_tflops: float  # the FLOP/s the GEMM rate is measured against (datasheet or measured)
    hbm_tbps: float  # the HBM bandwidth the streaming bandwidths are measured against
    peak_source: str
    gemm: GemmModel
    attn_s_per_flop: Param  # seconds per (L b a s^2 h') of fused attention, forward + backward
    attn_s_per_io: Param  # seconds per (L b a s h')
    stream_tbps: Param  # achieved bandwidth of memory-bound kernels (input bytes)
    kernel_fixed_s: Param  # fixed device cost per memory-bound kernel
    optimizer_tbps: Param  # achieved bandwidth of the fused optimizer step
    host_s_per_op: Param  # unprofiled host seconds per operator
    step_gap_s: Param  # device idle per step when the device is the bottleneck
    profiler_overhead: Param  # profiled / unprofiled host time - 1
    logit_bytes: Param  # bytes per logit element at the memory peak (logits, fp32 loss, grads)
    families: tuple[Family, ...] = ()
    runs: tuple[Mapping[str, Any], ...] = ()  # per-run fit table: measured, in-sample, leave-one-out
    notes: tuple[str, ...] = ()
    #: achieved bandwidth of the kernels on weights (casts, gradient adds: long contiguous
    #: tensors) and on logits (softmax, cross-entropy: reductions); None: ``stream_tbps``
    weight_tbps: Param | None = None
    vocab_tbps: Param | None = None
    optimizer_fixed_s: Param | None = None  # per-step fixed cost of the fused optimizer
    #: traced FP8 GEMMs' speed over the BF16 roofline (None: no FP8 traced; the datasheet ratio)
    fp8_gemm_speedup: Param | None = None
    #: seconds per (L b a s^2) of fused attention: the exponentials and softmax bookkeeping
    #: per score element, independent of the head width (None: a calibration from before
    #: stop 23, fitted without it)
    attn_s_per_score: Param | None = None
    #: the head-dimension multiple h' was rounded to when the attention terms were fitted
    attn_head_tile: int = LEGACY_HEAD_TILE
    #: memory-bound traffic per FP8 GEMM operand element (amax, scale, cast, transposes),
    #: measured from eager FP8 traces (device_fp8); None: Transformer Engine's fused casts
    fp8_cast_bytes_per_elem: Param | None = None
    #: predict torch.compile'd training (a view set per prediction, never fitted): the
    #: compiled families where traced, else the eager ones with a note
    compiled: bool = False
    #: the traced MoE implementation's routing work (device_moe); None: hand counts
    moe: MoeTerms | None = None
    #: the traced multi-head latent attention's work beyond the dense family (device_mla);
    #: None: an MLA model's layers issue and stream what the dense family's do
    mla: MlaTerms | None = None
    #: the FP8, MoE and MLA runs the per-run table (``runs``) leaves out: measured values, shape
    #: and their variant terms measured without them (device_check.variant_rows); the
    #: analytic device path predicts them when the table is shown
    variant_runs: tuple[Mapping[str, Any], ...] = ()

    def family(
        self, mlp: str, weights: str | None = None, compiled: bool | None = None
    ) -> tuple[Family, str | None]:
        """The measured family for an MLP kind (and weight precision, when given) and
        implementation (eager, or torch.compile: ``compiled``, default the model's view), or
        a stand-in with a note: the nearest family's memory-bound work and host ops, the
        requested MLP and precision, and the hand-counted activation memory (scale 1)."""
        want = self.compiled if compiled is None else compiled
        pool = [f for f in self.families if f.compiled == want]
        fits = [f for f in pool if f.mlp == mlp and (weights is None or f.weights == weights)]
        if fits:
            return fits[0], None
        if want:
            fam, note = self.family(mlp, weights, compiled=False)
            why = f"no torch.compile family of a {mlp} model fitted: predicted with the {fam.key} family"
            return fam, why if note is None else f"{why}; {note}"
        eager = pool
        if not eager:
            raise ValueError("device model has no measured eager families")
        near = [f for f in eager if f.mlp == mlp] or [f for f in eager if f.weights == weights]
        base = (near or list(eager))[0]
        want = f"{mlp}/{weights or base.weights}"
        scale = Param(
            1.0, unit="", status="default", note=f"no traced {want} model: activation memory as counted"
        )
        fam = replace(base, mlp=mlp, weights=weights or base.weights, act_scale=scale)
        return fam, f"no traced {want} model: memory-bound work and host ops taken from the {base.key} family"

    def on(
        self, peak_tflops: float | None, hbm_tbps: float | None, flops_ratio: float | None = None
    ) -> DeviceModel:
        """The same model on other hardware: rates scale with the peak FLOP/s ratio (or
        ``flops_ratio``, e.g. that of the devices' measured achievable matmul), including
        all of fused attention's terms, bandwidths with the HBM bandwidth ratio; host costs
        are unchanged."""
        fs = flops_ratio if flops_ratio else (peak_tflops / self.peak_tflops) if peak_tflops else 1.0
        bs = (hbm_tbps / self.hbm_tbps) if hbm_tbps else 1.0
        if fs == 1.0 and bs == 1.0:
            return self

        def sc(p: Param, f: float) -> Param:
            return replace(p, value=p.value * f, stderr=None if p.stderr is None else p.stderr * f)

        gemm = replace(
            self.gemm, rate_tflops=sc(self.gemm.rate_tflops, fs), operand_tbps=sc(self.gemm.operand_tbps, bs)
        )
        return replace(
            self,
            peak_tflops=peak_tflops or self.peak_tflops,
            hbm_tbps=hbm_tbps or self.hbm_tbps,
            gemm=gemm,
            attn_s_per_flop=sc(self.attn_s_per_flop, 1.0 / fs),
            # the row term too: FlashAttention loads its tiles asynchronously under the
            # tensor-core work, and the five runs traced on both an H100 and an H200 (same SMs
            # and clocks, 1.43x the HBM bandwidth) spent the same time in attention kernels
            # (ratio 0.98-1.02; tests/test_h200_device.py), so nothing of it moves with HBM
            attn_s_per_io=sc(self.attn_s_per_io, 1.0 / fs),
            # the exponentials run on the special-function units, not the tensor cores;
            # no datasheet here states their rate, so they move with the FLOP/s (stated)
            attn_s_per_score=None if self.attn_s_per_score is None else sc(self.attn_s_per_score, 1.0 / fs),
            stream_tbps=sc(self.stream_tbps, bs),
            optimizer_tbps=sc(self.optimizer_tbps, bs),
            weight_tbps=None if self.weight_tbps is None else sc(self.weight_tbps, bs),
            vocab_tbps=None if self.vocab_tbps is None else sc(self.vocab_tbps, bs),
            # a family's own bandwidth (torch.compile's fused kernels) moves as the device's
            families=tuple(
                f if f.stream_tbps is None else replace(f, stream_tbps=sc(f.stream_tbps, bs))
                for f in self.families
            ),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> DeviceModel | None:
        if not d:
            return None
        reject_unknown(d, cls, "device_model")
        out = dict(d)
        for k, v in d.items():
            if isinstance(v, dict) and "value" in v:
                out[k] = Param.from_json(v)
        out["gemm"] = GemmModel.from_json(d["gemm"])
        out["families"] = tuple(Family.from_json(f) for f in d.get("families", ()))
        out["moe"] = MoeTerms.from_json(d["moe"]) if d.get("moe") else None
        out["mla"] = MlaTerms.from_json(d["mla"]) if d.get("mla") else None
        out["runs"] = tuple(d.get("runs", ()))
        out["variant_runs"] = tuple(d.get("variant_runs", ()))
        out["notes"] = tuple(d.get("notes", ()))
        return cls(**out)


@dataclass(frozen=True)
class Shape:
    """The shape facts the device model needs (all broadcastable arrays)."""

    d: np.ndarray
    L: np.ndarray
    a: np.ndarray
    kv: np.ndarray
    ffn: np.ndarray
    s: np.ndarray
    V: np.ndarray
    b: np.ndarray
    t: np.ndarray = field(default_factory=lambda: np.asarray(1.0))  # tensor-parallel size


#: the fitted terms whose standard errors propagate into a prediction's interval
_DEVICE_TERMS = (
    "attn_s_per_flop",
    "attn_s_per_score",
    "attn_s_per_io",
    "stream_tbps",
    "weight_tbps",
    "vocab_tbps",
    "optimizer_fixed_s",
    "kernel_fixed_s",
    "optimizer_tbps",
    "host_s_per_op",
    "step_gap_s",
    "fp8_cast_bytes_per_elem",
)
_GEMM_TERMS = ("rate_tflops", "operand_tbps", "fixed_s", "unaligned_m", "unaligned_n", "unaligned_k")
_FAMILY_TERMS = ("bytes_d", "bytes_ffn", "bytes_vocab", "bytes_param", "bytes_embed", "host_s_per_op", "stream_tbps",
                 "kernel_fixed_s", "host_ops_layer", "act_scale", "attn_scale", "step_gap_s", "cast_fusion")  # fmt: skip


def _bumped(p: Param | None) -> Param | None:
    if p is None or not p.stderr or not np.isfinite(p.stderr):
        return None
    return replace(p, value=p.value + p.stderr)


def perturbations(dm: DeviceModel):
    """The model with one fitted term moved up by its standard error, for every term that
    has one: the finite differences a prediction's parameter uncertainty is built from."""
    for name in _DEVICE_TERMS:
        p = _bumped(getattr(dm, name))
        if p is not None:
            yield replace(dm, **{name: p})
    for name in _GEMM_TERMS:
        p = _bumped(getattr(dm.gemm, name))
        if p is not None:
            yield replace(dm, gemm=replace(dm.gemm, **{name: p}))
    for i, fam in enumerate(dm.families):
        for name in _FAMILY_TERMS:
            p = _bumped(getattr(fam, name))
            if p is not None:
                fams = list(dm.families)
                fams[i] = replace(fam, **{name: p})
                yield replace(dm, families=tuple(fams))


def interval_half_width(rel_sigma_param: ArrayLike, loo_errors: ArrayLike, level: float = 0.90) -> np.ndarray:
    """Relative half-width of a prediction interval: Student-t over the leave-one-run-out
    errors (their RMS, bias included) combined with the parameters' propagated error.

    With k leave-one-out errors e_i: t_{(1+level)/2, k-1} * sqrt(rms(e)^2 + sigma_p^2) *
    sqrt(1 + 1/k), the small-sample prediction interval; without any, a normal quantile
    times the parameter error alone (then it understates the model's own error).
    """
    from scipy.special import ndtri, stdtrit  # t and normal quantiles (scipy.stats costs 0.3 s to import)

    e = np.asarray(loo_errors, dtype=float)
    e = e[np.isfinite(e)]
    sp = np.asarray(rel_sigma_param, dtype=float)
    if len(e) >= 2:
        k = len(e)
        q = stdtrit(k - 1, 0.5 + level / 2.0)
        return q * np.sqrt(np.mean(e * e) + sp * sp) * np.sqrt(1.0 + 1.0 / k)
    return ndtri(0.5 + level / 2.0) * sp
