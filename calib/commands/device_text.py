"""The device model's fitted terms as ``calib fit`` / ``calib show`` print them."""

from __future__ import annotations

from calib.calibrate.device_model import DeviceModel
from calib.calibrate.params import Param


def _v(p: Param | None, scale: float = 1.0, unit: str = "", digits: str = ".4g") -> str:
    if p is None:
        return "-"
    text = f"{p.value * scale:{digits}}"
    if p.stderr:
        text += f" ± {p.stderr * scale:{digits}}"
    text += f" {unit}".rstrip()
    return text + (f" [{p.status}]" if p.status != "fitted" else "")


def render(dm: DeviceModel) -> list[str]:
    g = dm.gemm
    L = [
        f"\nDevice model ({dm.device}; rates against {dm.peak_tflops:.4g} TFLOP/s, {dm.hbm_tbps:.4g} TB/s: {dm.peak_source}):",
        f"  GEMM            rate {_v(g.rate_tflops, unit='TFLOP/s')}, operands {_v(g.operand_tbps, unit='TB/s')}, "
        f"fixed {_v(g.fixed_s, 1e6, 'us', '.3g')}",
        f"                  unaligned (dim not a multiple of 8) m x{_v(g.unaligned_m, digits='.3f')}, "
        f"n x{_v(g.unaligned_n, digits='.3f')}, k x{_v(g.unaligned_k, digits='.3f')}",
        f"  attention       {_v(dm.attn_s_per_flop, 1e15, 'fs', '.4g')} per b a s^2 h' (fused, fwd + bwd), "
        f"{_v(dm.attn_s_per_score, 1e15, 'fs', '.4g')} per b a s^2, {_v(dm.attn_s_per_io, 1e12, 'ps', '.3g')} per b a s h' "
        f"(h': head width rounded up to {dm.attn_head_tile})",
        f"  memory-bound    activations {_v(dm.stream_tbps, unit='TB/s')}, weights {_v(dm.weight_tbps, unit='TB/s')}, "
        f"logits {_v(dm.vocab_tbps, unit='TB/s')}; per kernel {_v(dm.kernel_fixed_s, 1e6, 'us', '.3g')}",
        f"  optimizer       {_v(dm.optimizer_tbps, unit='TB/s')} + {_v(dm.optimizer_fixed_s, 1e3, 'ms', '.3g')} per step",
        f"  host            {_v(dm.host_s_per_op, 1e6, 'us/op', '.3g')} (unprofiled); step gap {_v(dm.step_gap_s, 1e3, 'ms', '.3g')}; "
        f"profiler overhead {_v(dm.profiler_overhead, 100, '%', '.3g')}",
        f"  logits memory   {_v(dm.logit_bytes, unit='B per token x vocabulary entry')}",
    ]  # fmt: skip
    if dm.fp8_cast_bytes_per_elem is not None:
        L.append(
            f"  FP8 casts       {_v(dm.fp8_cast_bytes_per_elem, digits='.3g', unit='B per GEMM operand element')} "
            f"({dm.fp8_cast_bytes_per_elem.note})"
        )
    if dm.fp8_gemm_speedup is not None:
        L.append(
            f"  FP8 GEMMs       x{_v(dm.fp8_gemm_speedup, digits='.3f')} the BF16 roofline ({dm.fp8_gemm_speedup.note})"
        )
    if dm.moe is not None:
        mt = dm.moe
        L.append(
            f"  MoE routing     per routed token (token x top-k): {_v(mt.bytes_d, digits='.4g')} B x d + "
            f"{_v(mt.bytes_ffn, digits='.4g')} B x expert ffn; per MoE layer {_v(mt.kernels_layer, digits='.4g')} "
            f"kernels, {_v(mt.host_ops_layer, digits='.4g')} host ops, beyond the dense family; grouped expert "
            f"GEMMs x{_v(mt.grouped_gemm_scale, digits='.3f')} the roofline"
            f"{' x the grouping law (every expert reads its weights, rows padded to a tile)' if mt.grouping_law else ''}"
            f" ({mt.bytes_d.note or ', '.join(mt.runs)})"
        )
    if dm.mla is not None:
        mt = dm.mla
        L.append(
            f"  MLA attention   per layer beyond the dense family: {_v(mt.bytes_d, digits='.4g')} B per token x d, "
            f"{_v(mt.kernels_layer, digits='.4g')} kernels, {_v(mt.host_ops_layer, digits='.4g')} host ops "
            f"({mt.bytes_d.note or ', '.join(mt.runs)})"
        )
    for f in dm.families:
        L.append(
            f"  family {f.key:<20} streamed B per token-layer: {f.bytes_d.value:.4g} x d + {f.bytes_ffn.value:.4g} x ffn; "
            f"host {_v(f.host_s_per_op, 1e6, 'us/op', '.3g')}; activation memory x{_v(f.act_scale, digits='.3f')} "
            f"of the count ({', '.join(f.runs)})"
        )
        if f.compiled:
            gap = f"; step gap {_v(f.step_gap_s, 1e3, 'ms', '.3g')}" if f.step_gap_s is not None else ""
            L.append(
                f"    torch.compile: attention x{_v(f.attn_scale, digits='.3f')} the eager model's; streamed bytes "
                f"x{_v(f.cast_fusion, digits='.3f')} the eager family's (FP8 casts too){gap}; "
                f"{_v(f.stream_tbps, digits='.3g')} TB/s, {_v(f.kernel_fixed_s, 1e6, 'us', '.3g')} per kernel"
            )
            logits = (
                f"{_v(f.logit_bytes, unit='B')} per token x vocabulary entry (the fused loss; {f.logit_bytes.note})"
                if f.logit_bytes is not None
                else "the eager loss's (a calibration saved before stop 34)"
            )
            L.append(f"    torch.compile: logits memory {logits}")
    if dm.runs:
        L.append(
            "  traced runs (unprofiled step, ms): measured / in-sample / leave-one-run-out [90% interval]"
        )
        for r in dm.runs:
            meas = r.get("measured_step_s")
            if not meas:
                continue
            loo = r.get("loo_step_s")
            band = f" [{r['loo_lo_s'] * 1e3:.1f}..{r['loo_hi_s'] * 1e3:.1f}]" if r.get("loo_lo_s") else ""
            L.append(
                f"    {r['run']:<22} {meas * 1e3:8.1f} / {r['insample_step_s'] * 1e3:8.1f} "
                f"({r['insample_step_s'] / meas - 1:+.1%}) / "
                + (f"{loo * 1e3:8.1f} ({loo / meas - 1:+.1%}){band}" if loo else "-")
            )
    return L
