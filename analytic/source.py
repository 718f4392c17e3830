"""Where the machine description comes from: a fitted calibration, a hardware spec, or both.

* ``--system NAME`` / ``--calibration FILE``: the fitted calibration; the hardware spec
  (HBM size and bandwidth for memory and the optimizer step) is the preset whose device
  matches the calibration's, or ``--hardware``.
* ``--hardware SPEC`` alone: ``Calibration.defaults`` from the spec; every efficiency is a
  stated default and the output says so.
* both, on different hardware: the calibration is *transferred* -- its fitted compute
  shapes (GEMM efficiency, k1, k2, dispatch) are kept; peak, link bandwidths and the
  eff_{g->n} scaling come from the new spec's defaults, with each bus bandwidth keeping
  the measured/nominal ratio of the traced system (a network's per-step latency is a
  property of that network and is not carried over).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from analytic.specs import HardwareSpec, hardware_for_device, load_hardware
from analytic.timemodel import System
from calibrate.calibration import DEFAULT, Calibration, CollectiveCurve, Param
from ingest import store as store_mod
from ingest.errors import InputError


def default_calibration(hw: HardwareSpec) -> Calibration:
    """``Calibration.defaults`` from a hardware spec (stated default efficiencies)."""
    return Calibration.defaults(
        hw.name,
        gpus_per_node=hw.gpus_per_node,
        peak_tflops=float(hw.peak_tflops),
        intra_busbw_gbps=hw.intra_busbw_gbps,
        inter_busbw_gbps=hw.inter_busbw_gbps,
        device=hw.device,
        source=f"hardware spec '{hw.name}'",
    )


def is_default(cal: Calibration) -> bool:
    """True when the GEMM efficiency (the dominant factor) is a stated default, not a fit."""
    curve = cal.gemm_efficiency_curve
    return curve is None or curve.y_max.status == DEFAULT


def transfer(cal: Calibration, target: HardwareSpec, source: HardwareSpec | None) -> Calibration:
    """Carry a fitted calibration to new hardware (see module docstring)."""
    base = default_calibration(target)
    curves = []
    for c in base.collectives:
        measured = [m for m in cal.curves_for(c.collective) if (m.n_nodes > 1) == (c.n_nodes > 1)]
        if not measured or source is None:
            curves.append(c)
            continue
        ref = max(measured, key=lambda m: m.n_gpus)
        nominal = source.inter_busbw_gbps if c.n_nodes > 1 else source.intra_busbw_gbps
        ratio = ref.busbw_gbps.value / nominal
        nominal_new = target.inter_busbw_gbps if c.n_nodes > 1 else target.intra_busbw_gbps
        note = f"{ref.busbw_gbps.value:.1f} GB/s measured on {cal.system} ({ratio:.2f} of nominal) scaled to {target.name}"
        curves.append(
            CollectiveCurve(
                collective=c.collective,
                n_gpus=c.n_gpus,
                n_nodes=c.n_nodes,
                gpus_per_node=c.gpus_per_node,
                alpha_s=ref.alpha_s,
                busbw_gbps=Param(ratio * nominal_new, unit="GB/s", status=DEFAULT, note=note),
                source=f"transferred from {cal.system}",
            )
        )
    return replace(
        base,
        system=f"{cal.system}->{target.name}",
        collectives=tuple(curves),
        gemm_efficiency_curve=cal.gemm_efficiency_curve or base.gemm_efficiency_curve,
        k1_curve=cal.k1_curve or base.k1_curve,
        k2_curve=cal.k2_curve or base.k2_curve,
        dispatch=cal.dispatch or base.dispatch,
        provenance={
            "transferred_from": cal.system,
            "target_hardware": target.name,
            "source": dict(cal.provenance),
        },
        notes=(*cal.notes, f"transferred from {cal.system} to hardware spec '{target.name}'"),
    )


def resolve_system(
    system: str | None = None,
    calibration: str | Path | None = None,
    hardware: str | None = None,
    store: str | Path | None = None,
) -> tuple[System, list[str]]:
    """Build the :class:`System` from CLI-style options; also return notes for the output."""
    if system and calibration:
        raise InputError("--calibration", "give either --system or --calibration, not both")
    if not (system or calibration or hardware):
        raise InputError(
            "--system", "say which machine: --system NAME, --calibration FILE or --hardware SPEC"
        )
    hw = load_hardware(hardware) if hardware else None
    notes: list[str] = []
    if not (system or calibration):
        cal = default_calibration(hw)
        g, k1, k2 = cal.gemm_efficiency_curve, cal.k1_curve, cal.k2_curve
        notes.append(
            f"efficiencies are stated defaults from hardware spec '{hw.name}' (no measurements): "
            f"GEMM {g.y_max.value:g} of peak (half at {g.x_half.value:.0e} FLOP per matmul), "
            f"k1 {k1.y_max.value:g}, k2 {k2.y_max.value:g}, busbw {hw.intra_busbw_gbps:.0f} GB/s intra / "
            f"{hw.inter_busbw_gbps:.0f} GB/s inter-node"
        )
        return System(cal, hw), notes
    if system:
        path = store_mod.calibration_path(Path(store) if store else store_mod.default_store(), system)
        if not path.is_file():
            raise InputError(
                "--system",
                f"no calibration for system '{system}' at {path} (run `calib fit --system {system}`)",
            )
    else:
        path = Path(calibration)
    cal = Calibration.load(path)
    own = hardware_for_device(cal.device, cal.gpus_per_node)
    notes.append(f"calibration {path} (system {cal.system})")
    if hw is None:
        if own is None:
            raise InputError(
                path,
                f"calibration device '{cal.device}' matches no hardware preset; add --hardware SPEC for HBM size and bandwidth",
            )
        hw = own
    elif own is None or own.device != hw.device or cal.gpus_per_node != hw.gpus_per_node:
        cal = transfer(cal, hw, own)
        notes.append(
            f"transferred to hardware spec '{hw.name}': fitted efficiencies kept, peak and bandwidths from the spec"
        )
    if is_default(cal):
        notes.append("the calibration's GEMM efficiency is a stated default (no fit)")
    return System(cal, hw), notes
