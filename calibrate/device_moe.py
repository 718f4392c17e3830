"""Mixture-of-experts layers as the traced implementation runs them.

An MoE layer keeps the dense layer's attention side and replaces its MLP by routing: the
router GEMM and top-k, a permutation of the k T routed rows into expert order, the grouped
expert GEMMs, the experts' element-wise work on k T rows of the expert width f_e, the
routing-weight product and the un-permutation (a scatter-add) back to token order.  The
grouped GEMMs are timed by the GEMM roofline like any matmul (analytic.device_path); the
memory-bound work around them depends on the implementation (HF transformers' grouped
experts mask and copy whole k T x 2 f_e buffers; Megatron-Core fuses its permutation) and
is measured here, from an MoE run's memory-bound kernels grouped by width
(``device_facts.groups``), as what the run streams and issues beyond the dense family of
its MLP kind and precision:

* ``bytes_d``: bytes per routed token per unit of d beyond the dense family's per-token
  d-wide work (kernels without a width converted at the family's bandwidth, as
  ``device_fit.fit_families`` does);
* ``bytes_ffn``: bytes per routed token per unit of f_e (where the dense family streams
  its ``bytes_ffn`` per token per unit of ffn; the run's dense layers and shared experts
  are dense MLPs and their share at that rate is taken out first);
* ``kernels_layer``, ``host_ops_layer``: memory-bound kernels and host operators per MoE
  layer (the capture's ``dense`` leading layers do not route) beyond the dense family's;
* ``grouped_gemm_scale``: the traced grouped expert GEMMs' time over the dense roofline's
  for the same shapes times their grouping factor (calibrate.grouped_gemm: every expert's
  weights read, its rows padded to a tile): what the traced kernels lose beyond the law.

Each is the mean over the MoE runs (one run: no spread, said in its note).  A system
without MoE runs keeps the hand count (analytic.moe: eight passes of 2 bytes over the
routed rows, and the dense family's ffn bytes for the experts' element-wise work), a
stated default.  Only runs tagged ``moe`` alone are used (an FP8 or compiled MoE run
mixes two changes).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from calib.calibrate.device_facts import RunFacts, group_of
from calib.calibrate.device_model import DeviceModel, MoeTerms

#: the variant tags (device_facts.variant) of an eager MoE run, and of one with multi-head
#: latent attention (DeepSeek-V3; its MLA share is taken out where MLA terms were measured)
MOE, MOE_MLA = "moe", "moe+mla"


def moe_runs(runs: Sequence[RunFacts]) -> list[RunFacts]:
    return [f for f in runs if f.variant in (MOE, MOE_MLA) and f.top_k > 0 and f.busy_s > 0]


def excess(f: RunFacts, dm: DeviceModel) -> dict[str, float]:
    """One MoE run's streamed bytes, kernels and host operators beyond its dense family, per
    routed token and unit of width, or per MoE layer.  The run's dense layers and its shared
    experts are dense MLPs (of width ffn and ``shared_ffn``): the family's ffn bytes on them
    are subtracted before the routed rows' share is taken; so is the MLA terms' share of an
    MLA run (device_mla.layer_share)."""
    from calib.calibrate.device_mla import beyond_dense, layer_share

    fam, unsized, kernels, host = beyond_dense(f, dm)
    gr = f.groups
    L_moe = max(f.L - f.dense_layers, 1)
    f_e = f.expert_ffn or f.ffn
    routed = float(f.T * f.top_k)
    # the shared experts' dense-MLP bytes leave the group their tensors land in
    shared = fam.bytes_ffn.value * f.T * f.shared_ffn * L_moe
    sh_ffn = shared_group(f) in ("ffn", "expert")
    mla = layer_share(dm, f)
    dense_d = fam.bytes_d.value * f.d * f.T * f.L + (0.0 if sh_ffn else shared) + mla["bytes"]
    dense_ffn = fam.bytes_ffn.value * f.T * f.ffn * f.dense_layers + (shared if sh_ffn else 0.0)
    kernels, host = kernels - mla["kernels"], host - mla["host_ops"]
    traced, _, roof = grouped_times(f, dm)
    ffn_bytes = gr.loc["ffn", "bytes"] + (gr.loc["expert", "bytes"] if "expert" in gr.index else 0.0)
    return {
        "grouped_gemm_scale": traced / roof if roof > 0 else float("nan"),
        "bytes_d": (gr.loc["d", "bytes"] + unsized - dense_d) / (routed * f.d * L_moe),
        "bytes_ffn": (ffn_bytes - dense_ffn) / (routed * f_e * L_moe),
        "kernels_layer": kernels / L_moe,
        "host_ops_layer": host / L_moe,
    }


def grouped_times(f: RunFacts, dm: DeviceModel) -> tuple[float, float, float]:
    """A run's grouped expert GEMMs per step: (traced seconds, the device model's one-GEMM
    roofline of the same shapes, that roofline times the grouping law)."""
    g = f.gemms[f.gemms["grouped"].astype(bool)]
    roof = dm.gemm.time_s(g["m"], g["n"], g["k"], g["batch"]) * g["count"]
    traced = float((g["dur_s"] * g["count"]).sum())
    return traced, float(roof.sum()), float((roof * traced_grouping(g, f, dm)).sum())


def traced_grouping(g, f: RunFacts, dm: DeviceModel) -> np.ndarray:
    """The grouping factor (calibrate.grouped_gemm) of each traced grouped GEMM: its routed
    rows are the dimension equal to the run's T x top-k, the other two are the experts' K and N
    (the law is symmetric in them); 1 where the capture did not state E or no dimension is
    the routed rows."""
    from calib.calibrate.grouped_gemm import grouping_factor

    dims = g[["m", "n", "k"]].to_numpy(dtype=float)
    routed = float(f.T * f.top_k)
    hit = dims == routed
    first = hit.argmax(axis=1)
    a = np.where(first == 0, dims[:, 1], dims[:, 0])
    b = np.where(first == 2, dims[:, 1], dims[:, 2])
    experts = np.where(hit.any(axis=1), float(f.experts), 1.0)
    return grouping_factor(experts, routed, a, b, dm.peak_tflops, dm.hbm_tbps)


def shared_group(f: RunFacts) -> str | None:
    """The group (device_facts.group_of) the shared experts' T token rows of width
    ``shared_ffn`` land in (with top-1 routing the routed rows are the token rows)."""
    if f.shared_ffn <= 0:
        return None
    return str(group_of([f.T * f.shared_ffn], [f.T], f.T, f.d, f.ffn, f.V, f.T * f.top_k, f.expert_ffn)[0])


def structure(f: RunFacts) -> str:
    """The MoE layer structure the terms were measured with, as the capture stated it."""
    parts = [f"top-{f.top_k}", f"f_e {f.expert_ffn or f.ffn}"]
    if f.shared_ffn:
        parts.append(f"shared experts {f.shared_ffn} wide")
    if f.dense_layers:
        parts.append(f"{f.dense_layers} of {f.L} layers dense")
    return ", ".join(parts)


def fit_moe(runs: Sequence[RunFacts], dm: DeviceModel) -> MoeTerms | None:
    """The MoE terms (module docstring) from the ``moe`` runs among ``runs``, measured against
    ``dm`` (the eager dense model); None when there are none."""
    from calib.calibrate.device_mla import mean_terms

    mr = moe_runs(runs)
    if not mr:
        return None
    xs = [excess(f, dm) for f in mr]
    names = ", ".join(f"{f.name} ({structure(f)})" for f in mr)
    units = {"bytes_d": "B", "bytes_ffn": "B", "kernels_layer": "kernels", "host_ops_layer": "ops",
             "grouped_gemm_scale": ""}  # fmt: skip
    # an implementation without grouped GEMMs (experts looped over with plain matmuls) has
    # no grouped kernel to measure: the roofline stands for its expert GEMMs
    if not any(np.isfinite(x["grouped_gemm_scale"]) for x in xs):
        del units["grouped_gemm_scale"]
    what = {k: f"beyond the dense family, measured on {names}" for k in units}
    what["grouped_gemm_scale"] = (
        f"traced time over the roofline's times the grouping law's, measured on {names}"
    )
    return MoeTerms(**mean_terms(xs, units, what), runs=tuple(f.name for f in mr), grouping_law=True)
