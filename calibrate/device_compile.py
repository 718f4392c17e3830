"""torch.compile (TorchInductor) as its own implementation family of the device model.

A compiled step runs the same cuBLAS GEMMs and fused optimizer as the eager one (their
kernel times agree within 3 % on the H200 twins, fixtures/traces/h200), but Inductor fuses
chains of element-wise ops into generated Triton kernels: fewer bytes streamed per token
and layer, fewer kernels, far fewer host operators, fewer activations kept.  Those are a
:class:`~calib.calibrate.device_model.Family`'s terms, so a compiled run gets a family of
its own, measured from its traces as the eager families are (``device_fit.fit_families``),
with its own streaming bandwidth and fixed cost per kernel, plus four terms measured
against the eager model the dense runs fitted:

* ``attn_scale``: the traced attention kernel time over the device model's prediction
  (on the H200 runs the same cuDNN attention ran 2.6-3.3x slower inside the compiled
  graphs: a property of that software stack, measured, not assumed).  The traces say
  why: eager HF calls SDPA with ``is_causal`` and no mask, the compiled graphs pass an
  explicit [b, 1, s, s] mask with ``is_causal`` false, so the kernel computes the whole
  s x s square (twice the causal work) and adds the mask in its inner loop;
* ``step_gap_s``: the device's idle time per device-bound step (fewer host syncs);
* ``act_scale`` and ``logit_bytes``: activation memory over the hand count and bytes per
  logit element, fitted together on the family's peaks (the compiled loss keeps far fewer
  logit bytes than the eager one; :func:`_memory`);
* ``cast_fusion``: the family's streamed bytes per token-layer-d over the eager family's,
  the share of element-wise traffic compile leaves; FP8 casts traced eagerly
  (device_fp8) are scaled by it when a compiled FP8 step is predicted (a stated
  assumption: compile fuses the casts as it fuses the rest).

Only runs tagged ``compiled`` alone are used (an FP8 or MoE compiled run mixes two
changes).  Without compiled runs a system has no compiled family and predictions of
compiled training are the eager ones, with a note (DeviceModel.family).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from calib.calibrate import device_step as D
from calib.calibrate.device_facts import RunFacts
from calib.calibrate.device_model import STATIC_BYTES_PER_PARAM, DeviceModel, Family, act_count
from calib.calibrate.params import DEFAULT, FITTED, Param

#: the variant tag (device_facts.variant) of a dense torch.compile run
COMPILED = "compiled"


def compiled_runs(runs: Sequence[RunFacts]) -> list[RunFacts]:
    return [f for f in runs if f.variant == COMPILED]


def _mean(xs: Sequence[float], unit: str, note: str) -> Param:
    """device_fit's mean and standard error over runs, with what was averaged in the note."""
    from calib.calibrate.device_fit import _mean_param

    p = _mean_param(list(xs), unit)
    return replace(p, note=f"{note}; {p.note}" if p.note else note)


def _attention_s(dm: DeviceModel, f: RunFacts) -> float:
    return float(f.L * D.attention_layer_s(dm, f.b, f.s, f.d, f.a, 1.0, True))


#: compiled runs with peak memory needed to fit the family's own logit bytes beside its
#: activation scale (two terms and one degree of freedom for their uncertainty; stated)
MIN_LOGIT_RUNS = 3
#: bytes per token x vocabulary entry the compiled loss keeps as the backward starts, counted
#: (not fitted): three bf16 [T, V] tensors -- the logits, the zeroed gradient of the returned
#: logits and the logits' gradient (the H200 traces' kernels, tests/test_device_compile.py; the
#: CPU check fixtures/traces/h200/inductor_logits_cpu.txt); the default below MIN_LOGIT_RUNS
COMPILED_LOGIT_BYTES = 6.0


def _memory(fs: Sequence[RunFacts]) -> tuple[Param | None, Param]:
    """(activation scale, logit bytes) of a compiled family from its runs' peaks.

    The compiled graph holds the loss, and Inductor fuses HF's fp32 upcast, log-softmax and
    NLL into reductions that keep only per-row statistics: the bf16 logits, not the eager
    stack's fp32 copies, stay alive (the traced kernels' shapes, ``docs/calibrate.md``).
    With ``MIN_LOGIT_RUNS`` runs the two are fitted together as the eager ones are
    (device_fit.fit_memory); with fewer, or a fit that leaves no logits, the logit bytes are
    the stated count ``COMPILED_LOGIT_BYTES`` and the activation scale is measured with it."""
    from calib.calibrate.device_fit import fit_memory

    timed = [f for f in fs if f.peak_mem_bytes]
    if len(timed) >= MIN_LOGIT_RUNS:
        key = timed[0].family_key
        act, logit = fit_memory(timed, [key])
        if logit.value > 0 and logit.stderr is not None and np.isfinite(logit.stderr):
            names = ", ".join(f.name for f in timed)
            return (replace(act[key], note=f"measured peak over the hand count, with its own logit bytes ({names})"),
                    replace(logit, note=f"the compiled loss's, fitted with the activation scale ({names})"))  # fmt: skip
    logit = Param(COMPILED_LOGIT_BYTES, unit="B", status=DEFAULT,
                  note=f"counted, three bf16 [T, V] tensors: not fitted (fewer than {MIN_LOGIT_RUNS} compiled runs "
                       "with peak memory, or no logit term left by the fit)")  # fmt: skip
    xs = [
        (f.peak_mem_bytes - f.params * STATIC_BYTES_PER_PARAM[f.weights] - logit.value * f.T * f.V)
        / (f.T * f.L * float(act_count(f.family_key, f.d, f.kv / f.a, f.ffn)))
        for f in timed
    ]
    return (
        _mean(xs, "", "measured peak over the hand count, the counted logit bytes") if xs else None
    ), logit


def fit_compiled_families(runs: Sequence[RunFacts], dm: DeviceModel) -> tuple[Family, ...]:
    """One family per MLP kind and precision of the ``compiled`` runs (module docstring),
    fitted against ``dm`` (the eager model); () when there are none."""
    from calib.calibrate.device_fit import fit_families, fit_stream, host_per_op

    cr = [f for f in compiled_runs(runs) if f.busy_s > 0]
    if not cr:
        return ()
    kinds = fit_stream(cr)
    bw, t0 = kinds["act"], kinds["t0"]
    out = []
    for key in sorted({f.family_key for f in cr}):
        fs = [f for f in cr if f.family_key == key]
        names = ", ".join(f.name for f in fs)
        eager, _ = dm.family(fs[0].mlp, fs[0].weights, compiled=False)
        act, logit = _memory(fs)
        act = act or replace(eager.act_scale, note="no measured peak memory: the eager family's")
        (fam,) = fit_families(fs, bw, t0, {key: act})
        # runs whose graphs kept a fused attention kernel (Inductor may decompose it instead:
        # then its time is in the GEMM and memory-bound classes and the eager term stands)
        fused = [f for f in fs if f.class_s.get("attention", 0.0) > 0]
        attn = _mean([f.class_s["attention"] / _attention_s(dm, f) for f in fused], "",
                     f"traced attention over the device model's ({names})") if fused else None  # fmt: skip
        bound = [f for f in fs if f.step_s and f.host_issue_s < 0.9 * f.wall_s]
        gap = (
            _mean([f.step_s - f.busy_s for f in bound], "s", f"device-bound compiled runs ({names})")
            if bound
            else None
        )
        fusion = Param(
            fam.bytes_d.value / eager.bytes_d.value,
            None if fam.bytes_d.stderr is None else fam.bytes_d.stderr / eager.bytes_d.value,
            "", FITTED, f"streamed bytes per token-layer-d over the eager {eager.key} family's",
        )  # fmt: skip
        out.append(replace(
            fam, compiled=True, stream_tbps=bw, kernel_fixed_s=t0, attn_scale=attn, step_gap_s=gap,
            cast_fusion=fusion, logit_bytes=logit, host_s_per_op=host_per_op(list(runs), dm.profiler_overhead.value, key),
        ))  # fmt: skip
    return tuple(out)
