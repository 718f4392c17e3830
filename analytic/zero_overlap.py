"""How much of ZeRO-3's parameter all-gather / gradient reduce-scatter hides under compute.

ZeRO-3 (FSDP FULL_SHARD) gathers each layer's parameters just before it runs and
reduce-scatters its gradients just after; with prefetch the gather of the next layer is
issued while the current one computes (PyTorch FSDP ``forward_prefetch`` /
``backward_prefetch``, DeepSpeed's prefetch bucket).  Prefetching one layer ahead can
hide at most the compute of one layer per gathered layer, and never all of it:

* the first layer's gather (forward) and the last layer's reduce-scatter (backward) have
  nothing to hide under;
* NCCL kernels share the SMs and HBM with the compute they overlap (they slow each
  other), and the rate limiter that bounds in-flight gathers stalls compute when the
  collective is late.

The collectives themselves are timed one by one (:func:`analytic.timemodel.comm_times`,
``dp_ag_z3_s`` / ``dp_rs_z3_s``), each paying the ring's latency over the whole DP group --
the per-collective cost that grows with the DP size even when the bytes per GPU do not.
How many there are is the implementation's (:func:`collective_counts`):

* FSDP gathers and reduce-scatters one flat parameter per wrapped module: a stage of n
  layers issues n + 1 of each per pass (each layer and the embedding);
* DeepSpeed's ZeRO-3 all-gathers parameter by parameter (``partition_parameters.py``
  ``_allgather_params_coalesced``: one ``all_gather`` per partitioned tensor, launched in a
  loop), and tensors below ``stage3_param_persistence_threshold`` (default 1e5 elements)
  are never partitioned -- so each layer's weight matrices are gathered one by one
  (:func:`layer_matrices`: fused QKV and output projection, or MLA's five projections; the
  MLP's ``mats`` matrices, or a MoE layer's E / ep local experts' ``mats`` each, its shared
  experts' and its router; biases and norms persist) plus
  the embedding; it reduce-scatters gradients in buckets of ``reduce_bucket_size``
  (default 5e8 elements), at least one per micro-batch.

So the exposed time of a window of ``comm`` seconds of collectives under ``compute``
seconds of work is modelled with an overlap fraction f:

    exposed = max(comm - f * compute, (1 - f) * comm)

f = 1 is perfect hiding (the previous model: max(0, comm - compute)); f = 0 is no
overlap.  The first term holds when the collectives outlast what compute can cover, the
second when they are short: a (1 - f) share of them is always exposed.

``ZERO3_OVERLAP_FRACTION`` = 0.75 is a **stated default**, not a fit: with prefetch one
layer ahead, every layer but the first hides its gather under the previous layer's
compute, and the SM/HBM contention of concurrent NCCL kernels costs a share of the
rest; 0.75 (a quarter exposed) is the assumption stated here, to be replaced by a value
fitted from traces when they exist.  Hand-worked values: tests/test_validation_defects.py.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

#: default fraction of ZeRO-3 collective time that compute can hide (see module docstring)
ZERO3_OVERLAP_FRACTION = 0.75
#: DeepSpeed ZeRO-3 defaults (docs: "stage3_param_persistence_threshold": 1e5,
#: "reduce_bucket_size": 5e8, both in elements)
DS_PERSISTENCE_THRESHOLD = 1e5
DS_REDUCE_BUCKET = 5e8
#: DeepSpeed ZeRO-3 default ``stage3_max_live_parameters`` (elements;
#: deepspeed/runtime/zero/config.py ``max_live_parameters: int = Field(1e9, ...)``)
DS_MAX_LIVE_PARAMETERS = 1e9


def layer_matrices(d, ffn, kv_frac, mats, model=None, ep=1.0, moe_share=None) -> list[tuple]:
    """One layer's weight matrices as (elements, how many per layer, split over TP).

    Attention: the fused QKV (1 + 2 kv/a) d^2 and the output projection d^2, or with
    multi-head latent attention its projections (analytic.mla.attention_linears: q_a, q_b,
    kv_a, kv_b, o; four with a full-rank query).  A dense layer: ``mats`` MLP matrices d x
    ffn.  A MoE layer (``model`` with experts): E / ep local experts of ``mats`` matrices d x
    f_e, whole (expert TP 1), the shared experts as one MLP of width n_sh f_e (Hugging Face
    modeling_deepseek ``shared_experts``) and the router d x E.  With dense and MoE layers both,
    each kind's counts are weighted by its share of the layers (DeepSeek-V3: 3 dense of 61;
    ``moe_share`` overrides it).  ``ffn``: the dense layers' own MLP width (not averaged)."""
    from calib.analytic import mla, moe

    d, ffn, kv, mats = (np.asarray(x, dtype=float) for x in (d, ffn, kv_frac, mats))
    lin = None if model is None else mla.attention_linears(model)
    if lin is None:
        out = [((1.0 + 2.0 * kv) * d * d, 1.0, True), (d * d, 1.0, True)]
    else:
        out = [(i * o, 1.0, True) for i, o, _ in lin]
    m = moe.terms(model) if model is not None else {"E": 0.0}
    if not m["E"]:
        return [*out, (d * ffn, mats, True)]
    share = m["L_moe"] / float(model.n_layers) if moe_share is None else moe_share
    one = d * m["f_e"]
    return [
        *out,
        (d * ffn, mats * (1.0 - share), True),
        (one, mats * m["E"] / np.asarray(ep, dtype=float) * share, False),
        (m["n_sh"] * one, mats * share * (m["n_sh"] > 0), True),
        (d * m["E"], share, True),
    ]


def mtp_matrices(d, ffn, kv_frac, mats, model=None, ep=1.0) -> list[tuple]:
    """One MTP depth's matrices (analytic.mla "MTP"): a block of the last layer's kind (MoE
    where the model has experts: its layers are dense first) and the projection 2d x d, split
    over TP as the weights count it (mla.mtp_stage_params); none without MTP."""
    from calib.analytic import mla, moe

    if model is None or not mla.depths(model):
        return []
    block = layer_matrices(d, ffn, kv_frac, mats, model, ep, 1.0 if moe.is_moe(model) else None)
    return [*block, (2.0 * np.asarray(d, dtype=float) ** 2, 1.0, True)]


def _gathers(matrices, t) -> np.ndarray:
    return sum(
        count * (elems / np.where(split, t, 1.0) >= DS_PERSISTENCE_THRESHOLD)
        for elems, count, split in matrices
    )


def collective_counts(
    layers, stage_params, d, ffn, kv_frac, mats, t, deepspeed, model=None, ep=1.0, mtp=0.0
) -> tuple[np.ndarray, np.ndarray]:
    """(all-gathers, reduce-scatters) per pass of one stage's ZeRO-3 parameters (module
    docstring): FSDP n + 1 each; DeepSpeed one gather per weight matrix of at least
    DS_PERSISTENCE_THRESHOLD elements on this TP rank (:func:`layer_matrices`; without
    ``model`` fused QKV, projection and ``mats`` MLP matrices), plus the embedding, and
    ceil(stage parameters / DS_REDUCE_BUCKET) reduce-scatters (at least one).  ``mtp``: MTP
    depths the stage holds, each one module more (FSDP) or its :func:`mtp_matrices` (DeepSpeed)."""
    n, t = (np.asarray(x, dtype=float) for x in (layers, t))
    per_module = n + 1.0
    mats_layer = _gathers(layer_matrices(d, ffn, kv_frac, mats, model, ep), t)
    ds_ag = np.maximum(n * mats_layer, 0.0) + 1.0
    if np.any(np.asarray(mtp) > 0):
        per_module = per_module + mtp
        ds_ag = ds_ag + np.asarray(mtp, dtype=float) * _gathers(
            mtp_matrices(d, ffn, kv_frac, mats, model, ep), t
        )
    ds_rs = np.maximum(np.ceil(np.asarray(stage_params, dtype=float) / DS_REDUCE_BUCKET), 1.0)
    ds = np.asarray(deepspeed, dtype=bool)
    return np.where(ds, ds_ag, per_module), np.where(ds, ds_rs, per_module)


def largest_matrix(d, t, ffn, kv_frac, model=None, mats=2.0, ep=1.0) -> np.ndarray:
    """Parameters of a layer's largest weight matrix on one TP rank (:func:`layer_matrices`;
    without ``model`` the fused QKV or one MLP matrix; with MTP also its projection)."""
    t = np.asarray(t, dtype=float)
    sizes = [
        np.where(np.asarray(count) > 0, elems / np.where(split, t, 1.0), 0.0)
        for elems, count, split in layer_matrices(d, ffn, kv_frac, mats, model, ep)
        + mtp_matrices(d, ffn, kv_frac, mats, model, ep)
    ]
    return np.maximum.reduce(np.broadcast_arrays(*sizes))


def live_gathered_params(two_layers, largest_matrix, deepspeed) -> np.ndarray:
    """Gathered (unsharded) parameters ZeRO-3 holds at once on one GPU.

    FSDP: two wrapped layers, the one computing and the one prefetched
    (``memory.GATHERED_LAYERS``).  DeepSpeed gathers and releases module by module (each
    ``Linear``), and its prefetcher stops once ``stage3_max_live_parameters`` are resident
    (``PartitionedParameterCoordinator``): at most that many, but at least the largest
    matrix, which has to be whole to run -- and never more than the two layers.
    """
    two = np.asarray(two_layers, dtype=float)
    ds = np.minimum(two, np.maximum(DS_MAX_LIVE_PARAMETERS, np.asarray(largest_matrix, dtype=float)))
    return np.where(np.asarray(deepspeed, dtype=bool), ds, two)


def exposed_s(
    comm_s: ArrayLike, compute_s: ArrayLike, fraction: ArrayLike = ZERO3_OVERLAP_FRACTION
) -> np.ndarray:
    """Exposed seconds of ``comm_s`` of collectives overlapped with ``compute_s`` of work.

    ``max(comm - f * compute, (1 - f) * comm)``; f in [0, 1].
    """
    c = np.asarray(comm_s, dtype=float)
    w = np.asarray(compute_s, dtype=float)
    f = np.asarray(fraction, dtype=float)
    if np.any((f < 0.0) | (f > 1.0)):
        raise ValueError(f"overlap fraction must be in [0, 1], got {f}")  # a constant, not user input
    return np.maximum(c - f * w, (1.0 - f) * c)
