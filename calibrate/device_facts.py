"""What one traced GPU run says about the device: the inputs of the device-model fit.

Everything here is read from the run's tables and ``run.json`` (no fitting): the model
shape, its implementation family (MLP kind from the operators it ran, weight precision
from the capture), per-iteration kernel time by class, memory-bound bytes grouped by
what they stream (activations of width d or ffn, logits, weights), host operator counts
and issue time, and the unprofiled step time measured beside the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from calib.calibrate.device_model import BF16, FP32_AUTOCAST, GELU, SWIGLU
from calib.calibrate.device_step import layer_params
from calib.ingest.capture.runconfig import MLA_SHAPE_KEYS
from calib.ingest.gemms import GROUPED_OPS, fp8_operands

from calib.core.devices import flagged_classes
from calib.core.rundir import Run

#: kernel classes timed by their own terms (not the streamed-bytes term)
OWN_TERMS = ("gemm", "attention", "optimizer", "memcpy")
GROUPS = ("d", "ffn", "expert", "vocab", "param", "embed", "unsized")
SWIGLU_OPS = ("aten::silu", "aten::silu_", "aten::silu_backward")


@dataclass(frozen=True)
class RunFacts:
    name: str
    d: int
    L: int
    a: int
    kv: int
    ffn: int
    s: int
    V: int
    b: int
    mlp: str
    weights: str
    params: float
    tied: bool  # LM head shares the embedding matrix (from the parameter count)
    step_s: float | None  # unprofiled step (run_config.json), None when not measured
    peak_mem_bytes: float | None
    wall_s: float  # profiled iteration
    busy_s: float  # device busy (union of kernels) in the profiled iteration
    class_s: dict[str, float]  # kernel seconds per class (per iteration)
    groups: pd.DataFrame  # index GROUPS: bytes, kernels, seconds of memory-bound kernels
    host_ops: float
    host_issue_s: float
    gemms: pd.DataFrame  # m, n, k, batch, fp8 (Float8 operands), grouped, dur_s (median per shape), count
    flagged: frozenset[str] = field(default_factory=frozenset)
    #: what the trace shows beyond an eager dense BF16/FP32 run: "fp8", "moe", "compiled"
    #: joined by "+" ("" when none); the device model describes eager dense runs only
    variant: str = ""
    #: routed experts per token of an MoE run (the sidecar's ``topk``, else the grouped expert
    #: GEMMs' rows over the tokens); 0 for a dense run
    top_k: int = 0
    #: routed experts of an MoE run as the capture states them (``E``); 0 when not stated
    experts: int = 0
    #: an MoE run's expert MLP width as the capture states it (``effn``); 0: as wide as ``ffn``
    expert_ffn: int = 0
    #: total width of the shared experts every token passes (``shared`` x ``effn``, or
    #: Qwen2-MoE's one shared MLP ``shffn``); 0: none
    shared_ffn: int = 0
    #: leading layers with a dense MLP (``dense``; DeepSeek-V3's first three)
    dense_layers: int = 0
    #: multi-head latent attention's widths as the capture states them (``qr``, ``kvr``,
    #: ``rope``, ``nope``, ``vh``: runconfig.MLA_SHAPE_KEYS); empty: not MLA
    mla_shape: tuple[tuple[str, int], ...] = ()

    @property
    def mla(self) -> bool:
        return bool(self.mla_shape)

    @property
    def T(self) -> int:
        return self.b * self.s

    @property
    def compiled(self) -> bool:
        """TorchInductor's kernels in the trace (torch.compile)."""
        return "compiled" in self.variant.split("+")

    @property
    def family_key(self) -> str:
        return f"{self.mlp}/{self.weights}" + ("/compiled" if self.compiled else "")


def _int(model: dict, key: str, default: int | None = None) -> int | None:
    v = model.get(key, default)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def facts(run: Run) -> RunFacts | None:
    """The run's facts, or None when it cannot feed the device model (no GPU, no shape)."""
    m = dict(run.meta.model)
    need = ("d", "l", "a", "s", "V", "b")
    if any(_int(m, k) is None for k in need) or not run.has("device_ops") or not run.has("gemms"):
        return None
    buckets = run.table("buckets")
    buckets = buckets[buckets["device"] == "gpu"]
    if buckets.empty:
        return None
    d, L, a, s, V, b = (_int(m, k) for k in need)
    ops = run.table("device_ops")
    it = _steady_iteration(buckets)
    ops = ops[ops["iteration"] == it]
    names = set(ops["op"].astype(str))
    # eager: the silu ops; torch.compile: Inductor's fused kernels name the ops they fuse
    fused_silu = any(n.startswith("triton_") and "silu" in n for n in names)
    mlp = SWIGLU if names & set(SWIGLU_OPS) or fused_silu else GELU
    ffn = _int(m, "ffn") or _ffn_from_gemms(run.table("gemms"), d, b * s, V) or 4 * d
    kv = _int(m, "kv", a)
    prec = str(m.get("precision", "")).lower()
    weights = BF16 if ("bf16" in prec and "autocast" not in prec) else FP32_AUTOCAST
    layers = float(L * layer_params(d, a, kv, ffn, mlp))
    params = _int(m, "params") or layers + V * d
    tied = abs(params - (layers + V * d)) <= abs(params - (layers + 2 * V * d))
    row = buckets[buckets["iteration"] == it].iloc[0]
    kernels = run.table("kernels")
    kernels = kernels[kernels["iteration"] == it]
    class_s = kernels.groupby("kernel_class")["time_s"].sum().to_dict()
    host = run.table("host_steps") if run.has("host_steps") else pd.DataFrame()
    host = host[host["iteration"] == it] if len(host) else host
    measured = dict(run.meta.measured)
    g = run.table("gemms")
    g = g[(g["device"] == "gpu") & (g["dur_s"] > 0)]
    per_it = max(g["iteration"].nunique(), 1)
    g = g.assign(fp8=fp8_operands(g["dtype"]), grouped=g["op"].isin(GROUPED_OPS))
    keys = ["m", "n", "k", "batch", "fp8", "grouped"]
    shapes = (
        g.groupby(keys)["dur_s"].agg(dur_s="median", count="size").reset_index()
        if len(g)
        else pd.DataFrame(columns=[*keys, "dur_s", "count"])
    )
    shapes["count"] = shapes["count"] / per_it
    top_k, effn = _int(m, "topk") or _top_k(g, b * s), _int(m, "effn") or 0
    mla = tuple((k, _int(m, k) or 0) for k in MLA_SHAPE_KEYS) if _int(m, "qr") or _int(m, "kvr") else ()
    return RunFacts(
        name=run.meta.name, d=d, L=L, a=a, kv=kv, ffn=int(ffn), s=s, V=V, b=b, mlp=mlp, weights=weights,
        params=float(params), tied=bool(tied), step_s=_pos(measured.get("step_s_unprofiled")),
        peak_mem_bytes=_pos(measured.get("peak_mem_bytes")), wall_s=float(row["wall_s"]),
        busy_s=float(row["compute_busy_s"]), class_s={str(k): float(v) for k, v in class_s.items()},
        groups=_groups(ops, b * s, d, int(ffn), V, float(params), top_k * b * s, effn),
        host_ops=float(host["n_host_ops"].iloc[0]) if len(host) else float("nan"),
        host_issue_s=float(host["host_issue_s"].iloc[0]) if len(host) else float("nan"),
        gemms=shapes, flagged=frozenset(flagged_classes(run.meta.notes)), variant=variant(names, g, _int(m, "E") or 0, bool(mla)),
        top_k=top_k, experts=_int(m, "E") or 0, expert_ffn=effn, dense_layers=_int(m, "dense") or 0,
        shared_ffn=_int(m, "shffn") or (_int(m, "shared") or 0) * (effn or int(ffn)), mla_shape=mla,
    )  # fmt: skip


def _top_k(g: pd.DataFrame, tokens: int) -> int:
    """Routed experts per token from the grouped expert GEMMs: their longest row count (the
    routed tokens of a forward or data-gradient GEMM) over the tokens; 0 without them."""
    grouped = g[g["op"].isin(GROUPED_OPS)] if len(g) else g
    if not len(grouped) or tokens <= 0:
        return 0
    return int(round(float(grouped["m"].max()) / tokens))


#: a router's top-k beside a token scatter on the device: an MoE layer that loops over its
#: experts with plain matmuls (older HF Mixtral), which shows no grouped GEMM
ROUTING_OPS = frozenset(
    {"aten::index_add_", "aten::scatter_add_", "aten::_index_put_impl_", "aten::index_put_"}
)


def variant(op_names: set[str], gemms: pd.DataFrame, experts: int = 0, mla: bool = False) -> str:
    """The implementation variant a trace shows (``gemms``: the run's GEMM ops with their
    ``fp8`` flag): FP8 GEMMs, MoE (grouped expert GEMMs, a top-k routing beside a token
    scatter, or ``experts`` > 0 stated by the capture), multi-head latent attention
    (``mla``, stated by the capture), or TorchInductor's generated kernels (torch.compile)."""
    tags = []
    if len(gemms) and gemms["fp8"].any():
        tags.append("fp8")
    routed = "aten::topk" in op_names and bool(op_names & ROUTING_OPS)
    if experts > 0 or routed or (len(gemms) and gemms["op"].isin(GROUPED_OPS).any()):
        tags.append("moe")
    if mla:
        tags.append("mla")
    if any(n.startswith("triton_") for n in op_names):
        tags.append("compiled")
    return "+".join(tags)


def _pos(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else None


def _steady_iteration(buckets: pd.DataFrame) -> int:
    """The last profiled iteration: the first may hold queued work of an unprofiled step."""
    its = sorted(buckets["iteration"].unique())
    return int(its[-1])


def _ffn_from_gemms(g: pd.DataFrame, d: int, tokens: int, V: int) -> int | None:
    """The MLP width: the commonest matmul dimension other than tokens, vocabulary, d, 3d."""
    if g.empty:
        return None
    dims = pd.concat([g["m"], g["n"], g["k"]])
    dims = dims[~dims.isin([d, 3 * d, tokens, V]) & (dims > d)]
    return int(dims.value_counts().idxmax()) if len(dims) else None


def group_of(numel, lead, T: int, d: int, ffn: int, V: int, routed: int = 0, f_e: int = 0) -> np.ndarray:
    """The group of each streamed tensor (``numel`` values, ``lead`` rows): by its width per
    token.  An MoE run whose experts are narrower than ``ffn`` (``f_e``) has an "expert"
    group: tensors of the ``routed`` = k T rows whose last width is a multiple of f_e and not
    of d (a width both divide stays "d": the trace cannot tell them apart)."""
    numel, lead = np.asarray(numel, dtype=np.int64), np.asarray(lead, dtype=np.int64)
    per_tok = (numel % T == 0) & (lead % T == 0)
    width = np.where(per_tok, numel // max(T, 1), 0)
    last = numel // np.maximum(lead, 1)
    expert = (
        per_tok & (lead == routed) & (last % f_e == 0) & (last % d != 0)
        if routed > 0 and f_e > 0 and f_e != ffn
        else np.zeros(len(numel), dtype=bool)
    )
    return np.select(
        [numel == 0, per_tok & (width % V == 0), expert, per_tok & (width % ffn == 0), per_tok,
         (numel % V == 0) & (numel // max(V, 1) <= 2 * d)],
        ["unsized", "vocab", "expert", "ffn", "d", "embed"],
        "param",
    )  # fmt: skip


def _groups(ops: pd.DataFrame, T: int, d: int, ffn: int, V: int, params: float, routed: int = 0, f_e: int = 0) -> pd.DataFrame:  # fmt: skip
    """Memory-bound kernels grouped by the tensor they stream (largest input's width,
    :func:`group_of`)."""
    mb = ops[~ops["kernel_class"].isin(OWN_TERMS)]
    # memsets zero buffers of the op that launched them: their bytes are not its inputs
    numel = np.where(mb["kernel_class"].to_numpy() == "memset", 0, mb["numel"].to_numpy(np.int64))
    lead = mb["lead"].to_numpy(np.int64) if "lead" in mb else numel
    grp = group_of(numel, lead, T, d, ffn, V, routed, f_e)
    df = pd.DataFrame(
        {
            "group": grp,
            "bytes": mb["in_bytes"].to_numpy(float) * mb["count"].to_numpy(float),
            "kernels": mb["count"].to_numpy(float),
            "seconds": mb["dur_s"].to_numpy(float),
        }  # fmt: skip
    )
    out = df.groupby("group")[["bytes", "kernels", "seconds"]].sum().reindex(list(GROUPS)).fillna(0.0)
    return out
