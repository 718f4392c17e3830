"""Calculon's TP-overlap and TP-redo knobs (seed 000's strategy table), hand-worked."""

from __future__ import annotations

import numpy as np
import pytest
from calib.analytic.knobs import knob_terms
from calib.analytic.specs import ModelSpec
from calib.analytic.strategy import Strategies

MODEL = ModelSpec("m", 1024, 8, 8, 1024, 1000)
# TP 4, PP 2, v 1, 8 micro-batches: the bubble stretch is 1 + (2 - 1) / 8 = 1.125
ST = Strategies.of(tp=4, pp=2, dp=1, micro_batch=1, global_batch=8, seq_parallel=True, recompute=1)
R = {"tp_s": 1.0, "kernel_transformer_s": 0.6, "mem_activations_bytes": 8e9}


def test_tp_overlap():
    k = knob_terms(MODEL, ST, R, np.array([0, 1, 2]), np.array([True, True, True]))
    redo = 1.0 / 4.0  # two backward all-gathers of the 4 AG + 4 RS per layer: tp_s / 4
    # none: nothing hidden; pipe: max(1/2, 1 - 0.3) = 0.7; ring: max(1/4, 1 - 0.6) = 0.4; the
    # hidden 0.3 / 0.6 s slow the compute by SM sharing, Calculon's processor_usage 0.15 of them
    assert k["tp_exposed_s"] == pytest.approx([1.0 + redo, 0.745 + redo, 0.49 + redo])
    assert k["d_iter_s"] == pytest.approx(np.array([redo, redo - 0.3 * 0.85, redo - 0.6 * 0.85]) * 1.125)
    assert k["d_mem_bytes"] == pytest.approx([0, 0, 0])


def test_tp_redo_off_costs_memory():
    k = knob_terms(MODEL, ST, R, np.array(0), np.array(False))
    # selective recompute with SP keeps 34 s b d / t per layer; no redo adds 4 s b d (1 - 1/4)
    assert k["d_mem_bytes"] == pytest.approx(8e9 * (4 * 0.75) / (34 / 4))
    assert k["d_iter_s"] == 0.0
    # without sequence parallelism there is nothing to redo
    st = Strategies.of(tp=4, pp=2, dp=1, micro_batch=1, global_batch=8, recompute=1)
    assert knob_terms(MODEL, st, R, np.array(0), np.array(True))["d_iter_s"] == 0.0


def test_main_search_tp_overlap_sm_sharing():
    """The plain search's TP overlap (--tp-comm-overlap): 0.6 of the collectives hide under the
    layer's compute (analytic.overlap), and the hidden part slows that compute by 0.15 of itself:
    with communication well under compute, TP seconds become 1 - 0.6 + 0.6 x 0.15 = 0.49 of them."""
    from calib.analytic.machine import default_calibration
    from calib.analytic.overlap import exposed_with_sharing
    from calib.analytic.specs import load_hardware, load_model
    from calib.analytic.timemodel import System, evaluate

    assert float(exposed_with_sharing(10.0, 30.0, 0.6)) == pytest.approx(4.0 + 0.15 * 6.0)  # 4.9 ms of 10
    assert float(exposed_with_sharing(10.0, 5.0, 0.6)) == pytest.approx(7.0 + 0.15 * 3.0)  # window-bound
    hw = load_hardware("dgx-h100")
    sysm = System(default_calibration(hw), hw)
    kw = dict(tp=8, pp=1, dp=1, micro_batch=1, global_batch=4, seq_parallel=True)
    off = evaluate(load_model("gpt3-175b"), sysm, Strategies.of(**kw))
    on = evaluate(load_model("gpt3-175b"), sysm, Strategies.of(**kw, tp_overlap=True))
    assert float(off["tp_s"]) < 0.5 * float(off["compute_s"])  # collectives fit under the compute
    assert float(on["tp_s"]) == pytest.approx(0.49 * float(off["tp_s"]))
    assert float(off["iter_s"] - on["iter_s"]) == pytest.approx(0.51 * float(off["tp_s"]))
