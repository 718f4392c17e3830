"""Calculon's remaining execution-strategy knobs (seed 000's table) as adjustments of a time-model result.

* **TP overlap** (none / pipe / ring; Wang et al. 2022, Calculon [52]): the TP collectives run
  beside the GEMMs they feed.  ``ring`` decomposes each collective into n_t steps, each
  hidden under one GEMM chunk except the first: exposed = max(tp / n_t, tp - W).  ``pipe``
  splits each GEMM in two halves: exposed = max(tp / 2, tp - W / 2).  W is the layers' matmul
  and attention kernel time (``kernel_transformer_s``); the compute the collectives hide under
  slows down by sharing the SMs (Calculon's "comp time up"): + u x hidden, u =
  ``overlap.TP_OVERLAP_SM_SLOWDOWN`` (stated default 0.15, Calculon's NVLink processor_usage).
* **TP redo for SP** (Korthikanti et al. 2022): with sequence parallelism, keep the layer-norm
  outputs sharded and redo their all-gathers in backward.  calib's activation formula
  (34 s b d / t per layer) already keeps them sharded, so ``redo`` adds the two backward
  all-gathers per layer (tp / n_tp, n_tp = 4 collectives of each kind per layer, 6 with full
  recompute) and ``no redo`` adds the gathered copies to memory, 4 s b d (1 - 1/t) bytes per
  layer (nothing under full recompute, which keeps only the layer input).
* **PP RS + AG** (scatter / gather of the pipeline message): always on in calib's time model
  (sends b s d / t per micro-batch).

Either saving shortens the pipeline stage, so the bubble shrinks with it: the iteration
changes by the stage-time change x (1 + (p - 1) / (v m)).
"""

from __future__ import annotations

import numpy as np
from calib.analytic import formulas as F
from calib.analytic import overlap as OV
from calib.analytic.mla import attention_kept_coeffs, op_sac_terms
from calib.analytic.shape_terms import shape_terms

TP_OVERLAP = ("none", "pipe", "ring")


def knob_terms(model, st, r: dict, tp_overlap, tp_redo, trailing: bool = False) -> dict[str, np.ndarray]:
    """Iteration-time and memory changes of the TP-overlap (0 none, 1 pipe, 2 ring) and TP-redo knobs."""

    def ex(x):
        return np.asarray(x, dtype=float)[..., None] if trailing else np.asarray(x, dtype=float)

    t, p, v, b = (x.astype(float) for x in (st.tp, st.pp, st.interleave, st.micro_batch))
    m = st.global_batch / (st.dp * b)
    sp = ex(st.seq_parallel) > 0
    full = ex(st.recompute) == F.FULL
    tp_s, W = ex(r["tp_s"]), ex(r["kernel_transformer_s"])
    ov = np.asarray(tp_overlap)
    exposed = np.select([ov == 1, ov == 2], [np.maximum(tp_s / 2.0, tp_s - W / 2.0),
                        np.maximum(tp_s / ex(t), tp_s - W)], tp_s)  # fmt: skip
    exposed = np.minimum(exposed, tp_s)
    exposed = exposed + np.where(ov > 0, OV.TP_OVERLAP_SM_SLOWDOWN * (tp_s - exposed), 0.0)  # SM sharing
    n_tp = np.where(full, 6.0, 4.0)
    redo = np.asarray(tp_redo, dtype=bool) & sp
    extra_tp = np.where(redo, tp_s / n_tp, 0.0)
    stretch = ex(1.0 + (p - 1.0) / (v * m))
    d_iter = (exposed - tp_s + extra_tp) * stretch
    s, d, a = (np.asarray(x, dtype=float) for x in (model.seq_len, model.d_model, model.n_heads))
    ffn, kv, mats, _ = shape_terms(model)
    per_layer = ex(F.activation_bytes_layer(b, s, d, a, t, st.seq_parallel, st.recompute, st.flash_attention,
                                            ffn / d, kv, mats, model.shape_extras.get("dropout", True), attention_kept_coeffs(model), op_sac_terms(model)))  # fmt: skip
    gathered = ex(4.0 * s * b * d * (1.0 - 1.0 / t))
    d_mem = np.where(sp & ~np.asarray(tp_redo, dtype=bool) & ~full,
                     ex(r["mem_activations_bytes"]) * gathered / np.maximum(per_layer, 1e-30), 0.0)  # fmt: skip
    return {"d_iter_s": d_iter, "d_mem_bytes": d_mem, "tp_exposed_s": exposed + extra_tp}
