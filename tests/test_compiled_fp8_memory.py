"""Peak memory of FP8 linears under torch.compile (analytic.precision.compiled_fp8_saved_bytes),
on the real H200 traces (fixtures/traces/h200).

What the rule rests on is read from the traces' kernels (TorchInductor's kernels record
their inputs' shapes and dtypes): the compiled FP8 backward casts every weight again
(the eager implementation saves the forward's cast), and neither compiled backward
recomputes a norm, so the norm outputs the BF16 graph keeps are kept by the FP8 graph as
their FP8 casts.  The two compiled FP8 runs' peaks never enter a fit (memory is fitted on
the dense runs and the compiled BF16 runs), so their memory errors are held out.
Disclosure: the rule was written after their errors (+13.1 and +16.4 %) were known;
its bytes are counted from the kernels, not fitted to the peaks.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.test_device_compile import FP8_COMPILED, MEASURED, _spec, fitted  # noqa: F401

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "h200"
BF16_TWIN = {"llama-fp8-compiled-d2048-s4k": "llama-bf16-compiled-d2048-s4k",
             "llama-fp8-compiled-d4096-s2k": "llama-bf16-compiled-d4096-s2k"}  # fmt: skip


def _backward_kernels(run: str) -> list[dict]:
    """The args (shapes, dtypes) of the Inductor kernels launched inside the compiled backward."""
    with gzip.open(H200 / "runs" / run / "rank0.pt.trace.json.gz") as fh:
        ev = json.load(fh)["traceEvents"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in ev
             if e.get("cat") == "cpu_op" and e["name"] == "CompiledFunctionBackward"]  # fmt: skip
    return [
        {"name": e["name"], **e["args"]}
        for e in ev
        if e.get("cat") == "cpu_op"
        and e["name"].startswith("triton")
        and any(a <= e["ts"] <= b for a, b in spans)
    ]


def _weight_casts(kernels: list[dict]) -> int:
    """Kernels that read one 2-D BF16 tensor and write its FP8 cast (same or transposed shape)."""
    n = 0
    for k in kernels:
        shapes = [(tuple(d), t) for d, t in zip(k["Input Dims"], k["Input type"], strict=False) if d]
        bf = [d for d, t in shapes if "BFloat16" in t and len(d) == 2]
        f8 = [d for d, t in shapes if "Float8" in t]
        n += (
            len(shapes) <= 3
            and all(len(d) <= 2 for d, _ in shapes)
            and any(d in f8 or d[::-1] in f8 for d in bf)
        )
    return n


@pytest.mark.parametrize("run", FP8_COMPILED)
def test_the_compiled_fp8_backward_casts_every_weight_again(run):
    """Two profiled steps x L layers x 7 linears (q, k, v, o, gate, up, down): 224 casts at
    16 layers, 112 at 8; the BF16 twin's backward casts nothing to FP8."""
    sh = MEASURED[run]["shape"]
    assert _weight_casts(_backward_kernels(run)) == 2 * sh["l"] * 7
    assert _weight_casts(_backward_kernels(BF16_TWIN[run])) == 0


@pytest.mark.parametrize("run", [*FP8_COMPILED, *BF16_TWIN.values()])
def test_no_compiled_backward_recomputes_a_norm(run):
    """RMSNorm's forward kernels compute rsqrt; no backward kernel does, so the norm outputs
    are kept from the forward (BF16 in the BF16 graph, their FP8 casts in the FP8 graph)."""
    assert not [k for k in _backward_kernels(run) if "rsqrt" in k["name"]]


def test_saved_bytes_by_hand():
    """-(d + ffn): the two norm outputs 2 -> 1 byte (-2 d), the MLP product 2 -> 1 (-ffn),
    the attention output's FP8 cast kept beside its BF16 (+d); d 2048, ffn 5632: -7680."""
    from calib.analytic.precision import compiled_fp8_saved_bytes

    assert float(compiled_fp8_saved_bytes(2048, 5632)) == -7680.0


def test_compiled_fp8_memory_held_out(fitted):  # noqa: F811 (the fixture imported above)
    """Observed +2.6 % and +2.7 % (+0.3 and +1.0 % until stop 34, when the compiled BF16 family
    took the eager loss's logit bytes and a lower activation scale; +13.1 and +16.4 % before the rule: the FP8 weight copy
    added and the BF16 inputs kept).  Against the compiled BF16 prediction of the same
    shape, the FP8 one is lower by exactly (d + ffn) T L bytes and no weight copy."""
    _, model = fitted
    for name in FP8_COMPILED:
        sh = MEASURED[name]["shape"]
        kw = dict(gpus=[1], micro_batch=sh["b"], flash_attention=True, compiled=True)
        fp8 = model.predict(_spec(name), fp8=True, **kw).table.iloc[0]
        bf16 = model.predict(_spec(name), **kw).table.iloc[0]
        assert abs(fp8["mem_total_gb"] / MEASURED[name]["peak_mem_gb"] - 1.0) <= 0.03, name
        T, L = sh["b"] * sh["s"], sh["l"]
        assert (bf16["mem_total_gb"] - fp8["mem_total_gb"]) * 1e9 == pytest.approx(
            (sh["d"] + sh["ffn"]) * T * L, rel=1e-6
        )
        assert fp8["mem_weights_gb"] == pytest.approx(bf16["mem_weights_gb"], rel=1e-12)
