"""Execution strategies as columns of numpy arrays, and the rules that make one valid.

A :class:`Strategies` holds one array per knob; arrays broadcast together, so the search
can pass layouts as shape (L, 1) and flag combinations as (1, F) and the time model
evaluates the (L, F) grid without materialising it knob by knob.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from calib.analytic.formulas import RECOMPUTE_NAMES
from calib.analytic.specs import ModelSpec

from calib.core.errors import InputError

BOOL_FIELDS = (
    "seq_parallel",
    "dp_overlap",
    "flash_attention",
    "fp8",
    "dist_opt",
    "tp_overlap",
    "fused_layers",
)


@dataclass(frozen=True)
class Strategies:
    """Parallel layout and options, one entry per strategy (broadcastable arrays).

    gpus = tp * pp * dp; global_batch = dp * micro_batch * microbatches.
    ``recompute``: 0 none, 1 selective, 2 full.  ``interleave``: virtual pipeline
    stages per GPU (v).  ``dp_overlap``: DP/ZeRO collectives may hide under backward
    (and forward, ZeRO-3) compute.  ``flash_attention``: fused attention keeps no s x s
    tensors (memory and element-wise traffic).
    """

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    micro_batch: np.ndarray
    global_batch: np.ndarray
    interleave: np.ndarray
    zero: np.ndarray
    recompute: np.ndarray
    seq_parallel: np.ndarray
    dp_overlap: np.ndarray
    flash_attention: np.ndarray
    # today's stacks (analytic.moe, .context, .precision, .bubble, .overlap): context- and
    # expert-parallel sizes, CP kind (0 ring, 1 Ulysses), FP8 GEMMs, pipeline schedule
    # (0 1F1B/interleaved, 1 ZB-H1, 2 DualPipe), distributed optimizer (ZeRO-1 with
    # reduce-scatter + all-gather), TP communication overlap, master weights (0 fp32, 1 bf16)
    cp: np.ndarray
    ep: np.ndarray
    cp_kind: np.ndarray
    fp8: np.ndarray
    schedule: np.ndarray
    dist_opt: np.ndarray
    tp_overlap: np.ndarray
    master: np.ndarray
    # 2D tensor parallelism (seed 002, analytic.tp2d): the TP group as a tp_r x tp_c grid,
    # tp_c = tp / tp_r columns splitting the sequence (1 = Megatron's 1D TP); kind 0 the 2D
    # table (weights over tp_r), 1 SUMMA (weights over the whole grid)
    tp_c: np.ndarray
    tp2d_kind: np.ndarray
    # Calculon's "fused layers" (seed 000's strategy table): element-wise kernels fused
    # (analytic.timemodel.FUSED_VECTOR_PASSES)
    fused_layers: np.ndarray
    # hybrid sharding (FSDP HYBRID_SHARD / _HYBRID_SHARD_ZERO2, DeepSpeed MiCS): ZeRO-2/3
    # states sharded over ``shard`` consecutive DP ranks and replicated across the
    # d c / shard groups (analytic.hybrid); 0 = sharded over the whole DP group
    shard: np.ndarray
    # ZeRO implementation (analytic.dp_exposure): 0 DeepSpeed, 1 PyTorch FSDP
    zero_impl: np.ndarray

    @classmethod
    def of(cls, **kw) -> Strategies:
        defaults = {
            "interleave": 1, "zero": 0, "recompute": 0, "seq_parallel": False, "dp_overlap": False,
            "flash_attention": False, "cp": 1, "ep": 1, "cp_kind": 0, "fp8": False, "schedule": 0,
            "dist_opt": False, "tp_overlap": False, "master": 0, "tp_c": 1, "tp2d_kind": 0, "fused_layers": False,
            "shard": 0, "zero_impl": 0,
        }  # fmt: skip
        vals = {**defaults, **kw}
        out = {}
        for f in fields(cls):
            dtype = bool if f.name in BOOL_FIELDS else np.int64
            out[f.name] = np.asarray(vals[f.name], dtype=dtype)
        return cls(**out)

    @property
    def gpus(self) -> np.ndarray:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def is_modern(self) -> bool:
        """Any of CP, EP, FP8, a zero-bubble/DualPipe schedule, the distributed optimizer or TP overlap."""
        return bool(
            np.any(self.cp > 1) or np.any(self.ep > 1) or np.any(self.fp8) or np.any(self.schedule > 0)
            or np.any(self.dist_opt) or np.any(self.tp_overlap) or np.any(self.master > 0)
        )  # fmt: skip

    @property
    def microbatches(self) -> np.ndarray:
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def shape(self) -> tuple[int, ...]:
        return np.broadcast_shapes(*(getattr(self, f.name).shape for f in fields(self)))

    def row(self, i: int) -> dict:
        """Scalar knobs of strategy ``i`` of a 1-D collection (for display and the peer loop)."""
        b = {f.name: np.broadcast_to(getattr(self, f.name), self.shape).ravel()[i] for f in fields(self)}
        return {k: (bool(v) if isinstance(v, np.bool_) else int(v)) for k, v in b.items()}


def check_config(
    model: ModelSpec,
    gpus: int,
    tp: int,
    pp: int,
    micro_batch: int,
    global_batch: int,
    interleave: int = 1,
    zero: int = 0,
    recompute: int = 0,
    seq_parallel: bool = False,
    cp: int = 1,
    shard: int = 0,
    zero_impl: int = 0,
) -> int:
    """Validate one configuration; return its DP size.  Raise InputError naming the rule."""
    where = f"{gpus} GPUs"
    for name, v in (
        ("tp", tp),
        ("pp", pp),
        ("micro_batch", micro_batch),
        ("global_batch", global_batch),
        ("interleave", interleave),
        ("gpus", gpus),
    ):
        if v < 1:
            raise InputError(name, f"must be a positive integer, got {v}")
    if zero not in (0, 1, 2, 3):
        raise InputError("zero", f"ZeRO stage must be 0, 1, 2 or 3, got {zero}")
    if recompute not in range(len(RECOMPUTE_NAMES)):
        raise InputError("recompute", f"unknown recompute code {recompute}")
    if model.n_heads % tp:
        raise InputError(
            "tp", f"TP={tp} does not divide the {model.n_heads} attention heads of {model.label}"
        )
    if cp < 1:
        raise InputError("cp", f"must be a positive integer, got {cp}")
    if gpus % (tp * cp * pp):
        what = f"TP x CP x PP = {tp} x {cp} x {pp}" if cp > 1 else f"TP x PP = {tp} x {pp}"
        raise InputError("gpus", f"{gpus} GPUs are not divisible by {what} = {tp * cp * pp}")
    if pp > model.n_layers:  # uneven stages, with or without interleaving: analytic.uneven
        raise InputError("pp", f"PP={pp} exceeds the {model.n_layers} layers of {model.label}")
    dp = gpus // (tp * cp * pp)
    if global_batch % (dp * micro_batch):
        raise InputError(
            "global_batch",
            f"{where}: global batch {global_batch} is not divisible by DP x micro-batch = {dp} x {micro_batch} = {dp * micro_batch}",
        )
    m = global_batch // (dp * micro_batch)
    if interleave > 1:
        if pp == 1:
            raise InputError("interleave", "interleaving (virtual pipeline stages) needs PP > 1")
        if interleave > -(-model.n_layers // pp):
            raise InputError(
                "interleave",
                f"v={interleave} exceeds the {-(-model.n_layers // pp)} layers of the largest pipeline stage",
            )
        if m % pp:
            raise InputError(
                "interleave",
                f"{where}: the interleaved schedule needs micro-batches ({m}) divisible by PP={pp}",
            )
    if seq_parallel and tp == 1:
        raise InputError("seq_parallel", "sequence parallelism needs TP > 1")
    if zero_impl not in (0, 1):
        raise InputError("zero_impl", f"0 (DeepSpeed) or 1 (PyTorch FSDP), got {zero_impl}")
    if shard < 0:
        raise InputError("shard", f"must be 0 (the whole DP group) or a positive group size, got {shard}")
    if shard > 0 and zero < 2:
        raise InputError(
            "shard", f"a shard group (hybrid sharding) shards ZeRO-2/3 states; ZeRO-{zero} given"
        )
    if shard > 0 and (dp * cp) % shard:
        raise InputError(
            "shard", f"{where}: shard group {shard} does not divide the DP group of {dp * cp} ranks"
        )
    return dp


def valid_mask(model, st: Strategies) -> np.ndarray:
    """Vectorised :func:`check_config`: True where a strategy is valid (broadcast shape)."""
    L = np.asarray(model.n_layers)
    a = np.asarray(model.n_heads)
    tp, pp, dp, b, B, v, z = st.tp, st.pp, st.dp, st.micro_batch, st.global_batch, st.interleave, st.zero
    ok = (a % tp == 0) & (pp <= L) & (B % (dp * b) == 0) & (z >= 0) & (z <= 3)
    m = B // np.maximum(dp * b, 1)
    ok &= (v == 1) | ((pp > 1) & (v <= -(-L // np.maximum(pp, 1))) & (m % pp == 0))  # analytic.uneven
    ok &= ~st.seq_parallel | (tp > 1)
    g = dp * st.cp  # hybrid sharding: ZeRO-2/3 only, the shard group divides the DP group
    ok &= (st.shard == 0) | ((z >= 2) & (st.shard > 0) & (g % np.maximum(st.shard, 1) == 0))
    # a 2D grid splits the sequence: tp_c | tp, tp_c | s, and the rows run sequence parallel
    ok &= (tp % st.tp_c == 0) & (model.seq_len % st.tp_c == 0) & ((st.tp_c == 1) | st.seq_parallel)
    from calib.analytic.modern import valid_mask_modern

    return ok & valid_mask_modern(model, st, m)
