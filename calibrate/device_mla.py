"""Multi-head latent attention (DeepSeek-V2/V3) as the traced implementation runs it.

MLA replaces the four projections of full heads by five low-rank ones (q_a, q_b, kv_a,
kv_b, o).  Their GEMMs are timed from their shapes like any matmul (``device_step.linears``
with ``attn=``); the attention core from its head widths.  What the shapes do not give is
the element-wise work and the host operators around them: RMSNorms of the two latents, the
split of each head into a rotary and a plain part, RoPE on the rotary parts, the broadcast
of the shared rotary key and the concatenations that rebuild full heads.  HF's
DeepseekV3Attention issues 271 host operators per layer more than HF's LlamaAttention
(270.6-271.1 beyond the Llama family's 646 in all three dense MLA runs of fixtures/traces/h200c):
a constant of the implementation, which in an eager step bound by its host is most of
what MLA costs beyond its GEMMs.

Measured here, from a dense MLA run (every layer an MLP, so nothing routes), as what the
run streams and issues beyond the dense family of its MLP kind and precision:

* ``bytes_d``: bytes per token-layer per unit of d (every memory-bound group but the
  logits' and the weights', kernels without a width converted at the family's bandwidth as
  ``device_fit.fit_families`` does);
* ``kernels_layer``, ``host_ops_layer``: memory-bound kernels and host operators per layer.

Each is the mean over the dense MLA runs (one run: no spread, said in its note).  An MoE
run with MLA (DeepSeek-V3) has its MLA share taken out before its routing terms are
measured (``device_moe.excess``).  A system without a dense MLA run keeps the dense
family's counts for an MLA model's layers, a stated default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from calib.calibrate import device_step as D
from calib.calibrate.device_facts import RunFacts
from calib.calibrate.device_model import DeviceModel, Family, MlaTerms
from calib.calibrate.params import Param

#: the variant tag (device_facts.variant) of an eager dense MLA run
MLA = "mla"
_UNITS = {"bytes_d": "B", "kernels_layer": "kernels", "host_ops_layer": "ops"}


def mla_runs(runs: Sequence[RunFacts]) -> list[RunFacts]:
    return [f for f in runs if f.variant == MLA and f.busy_s > 0]


def beyond_dense(f: RunFacts, dm: DeviceModel) -> tuple[Family, float, float, float]:
    """Run ``f``'s eager dense family, its width-less kernels' bytes (converted at the
    family's bandwidth, as ``device_fit.fit_families`` counts them), and the memory-bound
    kernels and host operators it ran beyond the family's L layers and step: what a variant's
    terms (this module's, device_moe's) are measured from."""
    from calib.calibrate.device_fit import unsized_bytes

    fam, _ = dm.family(f.mlp, f.weights, compiled=False)
    gr = f.groups
    unsized = unsized_bytes(gr, D._bw(dm, fam), D._t0(dm, fam))
    kernels = float(gr["kernels"].sum()) - fam.kernels_layer.value * f.L - fam.kernels_step.value
    host = f.host_ops - fam.host_ops_layer.value * f.L - fam.host_ops_step.value
    return fam, unsized, kernels, host


def mean_terms(
    xs: Sequence[dict[str, float]], units: dict[str, str], what: dict[str, str]
) -> dict[str, Param]:
    """Each key of ``units``: the mean over runs ``xs`` with its spread (device_fit._mean_param),
    its note saying what it is (``what``)."""
    from calib.calibrate.device_fit import _mean_param

    out = {}
    for key, unit in units.items():
        p = _mean_param([x[key] for x in xs], unit)
        out[key] = replace(p, note=f"{what[key]}; {p.note}" if p.note else what[key])
    return out


def excess(f: RunFacts, dm: DeviceModel) -> dict[str, float]:
    """One dense MLA run's streamed bytes, kernels and host operators beyond its dense
    family, per token-layer and unit of d, or per layer."""
    fam, unsized, kernels, host = beyond_dense(f, dm)
    gr = f.groups
    dense = (fam.bytes_d.value * f.d + fam.bytes_ffn.value * f.ffn) * f.T * f.L
    layer_bytes = gr.loc["d", "bytes"] + gr.loc["ffn", "bytes"] + unsized
    return {
        "bytes_d": (layer_bytes - dense) / (f.T * f.d * f.L),
        "kernels_layer": kernels / f.L,
        "host_ops_layer": host / f.L,
    }


def fit_mla(runs: Sequence[RunFacts], dm: DeviceModel) -> MlaTerms | None:
    """The MLA terms (module docstring) from the dense ``mla`` runs among ``runs``, measured
    against ``dm`` (the eager dense model); None when there are none."""
    mr = mla_runs(runs)
    if not mr:
        return None
    what = f"beyond the dense family, measured on {', '.join(f.name for f in mr)}"
    terms = mean_terms([excess(f, dm) for f in mr], _UNITS, dict.fromkeys(_UNITS, what))
    return MlaTerms(**terms, runs=tuple(f.name for f in mr))


def layer_share(dm: DeviceModel, f: RunFacts) -> dict[str, float]:
    """What ``dm``'s MLA terms account for in run ``f`` (an MLA run), in the units of
    ``device_moe.excess``'s totals: bytes, kernels and host operators; zeros without them."""
    mt = dm.mla
    if mt is None or not f.mla:
        return {"bytes": 0.0, "kernels": 0.0, "host_ops": 0.0}
    return {
        "bytes": mt.bytes_d.value * f.T * f.d * f.L,
        "kernels": mt.kernels_layer.value * f.L,
        "host_ops": mt.host_ops_layer.value * f.L,
    }
