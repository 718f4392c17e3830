"""The machine to model, from a fitted calibration, a hardware spec, or both.

:func:`build_system` is a pure function of the two (loading them by name, from the store
or a file, is the API layer's job: :mod:`calib.resolve`):

* a calibration alone: the hardware spec (HBM size and bandwidth for memory and the
  optimizer step) is the preset whose device matches the calibration's;
* a hardware spec alone: ``Calibration.defaults`` from the spec; every efficiency is a
  stated default and the output says so.
* both, on different hardware: the calibration is *transferred* -- its fitted compute
  shapes (GEMM efficiency, k1, k2, dispatch) are kept; peak, link bandwidths and the
  eff_{g->n} scaling come from the new spec's defaults, with each bus bandwidth keeping
  the measured/nominal ratio of the traced system (a network's per-step latency is a
  property of that network and is not carried over).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from calib.analytic.specs import HardwareSpec, hardware_for_device, load_hardware
from calib.analytic.timemodel import System
from calib.calibrate.calibration import DEFAULT, Calibration, CollectiveCurve, Param

from calib.core.errors import InputError

#: provenance key under which a validation fit stores its element-wise traffic factor (a
#: :class:`System` setting, not a calibration curve; analytic.vfit.fitted_calibration)
VECTOR_PASSES_KEY = "vector_passes"


#: ... and the attention core's efficiency over the GEMMs' (System.attn_eff_ratio)
ATTN_EFF_RATIO_KEY = "attn_eff_ratio"
SAVED_KEYS = (VECTOR_PASSES_KEY, ATTN_EFF_RATIO_KEY)


#: physical range of each stored System setting: (lowest, highest, lowest allowed itself)
_SAVED_RANGE = {VECTOR_PASSES_KEY: (0.0, 1e3, True), ATTN_EFF_RATIO_KEY: (0.0, 1e2, False)}


def saved_setting(cal: Calibration, key: str) -> float | None:
    """The System setting (``vector_passes``, ``attn_eff_ratio``) a validation fit stored in
    ``cal`` (None without one); a value that is not a finite number in its physical range is
    refused in one line naming the calibration and key."""
    vp = (cal.provenance or {}).get(key)
    if vp is None:
        return None
    v = vp.get("value") if isinstance(vp, dict) else vp
    lo, hi, lo_ok = _SAVED_RANGE.get(key, (0.0, np.inf, True))
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)
    ok = ok and (v >= lo if lo_ok else v > lo) and v <= hi
    if not ok:
        rel = ">=" if lo_ok else ">"
        raise InputError(
            cal.system, f"provenance.{key}.value must be a number {rel} {lo:g} and <= {hi:g}, got {v!r:.40}"
        )
    return float(v)


def _saved_hardware(cal: Calibration) -> HardwareSpec | None:
    """The preset a validation fit ran on (``provenance.validation_hardware``), when it is this device."""
    name = (cal.provenance or {}).get("validation_hardware")
    if not name:
        return None
    try:
        hw = load_hardware(str(name))
    except InputError:
        return None
    return hw if hw.device == cal.device and hw.gpus_per_node == cal.gpus_per_node else None


def achievable_fraction(hw: HardwareSpec | None) -> float | None:
    """The device's measured maximum achievable matmul over its peak (None: not measured)."""
    if hw is None or hw.mamf_tflops is None:
        return None
    return float(hw.mamf_tflops) / float(hw.peak_tflops)


def default_calibration(hw: HardwareSpec) -> Calibration:
    """``Calibration.defaults`` from a hardware spec (stated default efficiencies).  The GEMM
    plateau is the device's measured maximum achievable matmul over its peak where the spec
    has one (a large GEMM's best on that device: A100 0.87, H100 0.80, MI300X 0.51), else
    the generic 0.75."""
    frac = achievable_fraction(hw)
    note = (
        f"default from hardware spec '{hw.name}': measured max achievable matmul "
        f"{hw.mamf_tflops:g} / peak {hw.peak_tflops:g} TFLOP/s (no measurements of this run)"
        if frac is not None
        else ""
    )
    return Calibration.defaults(
        hw.name,
        gpus_per_node=hw.gpus_per_node,
        peak_tflops=float(hw.peak_tflops),
        intra_busbw_gbps=hw.intra_busbw_gbps,
        inter_busbw_gbps=hw.inter_busbw_gbps,
        device=hw.device,
        source=f"hardware spec '{hw.name}'",
        gemm_y_max=frac,
        gemm_y_max_note=note,
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
        gemm_efficiency_curve=carried_gemm_curve(cal.gemm_efficiency_curve, target, source)
        or base.gemm_efficiency_curve,
        k1_curve=cal.k1_curve or base.k1_curve,
        k2_curve=cal.k2_curve or base.k2_curve,
        dispatch=cal.dispatch or base.dispatch,
        device_model=cal.device_model,  # moved to the target device by System.device_model
        provenance={
            "transferred_from": cal.system,
            "target_hardware": target.name,
            "source": dict(cal.provenance),
            # fitted settings of the software stack travel with the fitted efficiencies
            # (element-wise traffic in HBM passes, attention over GEMM efficiency)
            **{k: cal.provenance[k] for k in SAVED_KEYS if k in (cal.provenance or {})},
        },
        notes=(*cal.notes, f"transferred from {cal.system} to hardware spec '{target.name}'"),
    )


def achievable_ratio(target: HardwareSpec | None, source: HardwareSpec | None) -> float | None:
    """How much more of its peak the target's GEMMs reach than the source's: the ratio of the
    devices' measured maximum achievable matmul fractions (None unless both are measured)."""
    ft, fs = achievable_fraction(target), achievable_fraction(source)
    return None if ft is None or fs is None else ft / fs


def carried_gemm_curve(curve, target: HardwareSpec, source: HardwareSpec | None):
    """A fitted GEMM-efficiency curve moved to ``target``: the fraction of peak scales with
    :func:`achievable_ratio` (the fitted shapes' distance from the device's own best matmul
    carries over, not the fraction of a datasheet peak), capped at 1."""
    r = achievable_ratio(target, source)
    if curve is None or r is None or r == 1.0:
        return curve
    y = curve.y_max
    moved = replace(
        y,
        value=min(y.value * r, 1.0),
        stderr=None if y.stderr is None else y.stderr * r,
        note=f"{y.note}; x {r:.3f} = achievable matmul fraction {target.name} / {source.name}".lstrip("; "),
    )
    return replace(curve, y_max=moved)


def _fill_collectives(cal: Calibration, hw: HardwareSpec, notes: list[str]) -> Calibration:
    """Collectives the calibration has no samples for: the hardware spec's nominal bus
    bandwidths (status default), so a fit from traces alone still predicts many GPUs."""
    if not (np.isfinite(hw.intra_busbw_gbps) and np.isfinite(hw.inter_busbw_gbps)):
        return cal
    base = default_calibration(hw)
    missing = sorted({c.collective for c in base.collectives if not cal.curves_for(c.collective)})
    if not missing:
        return cal
    extra = tuple(c for c in base.collectives if c.collective in missing)
    notes.append(
        f"no collective samples for {', '.join(missing)}: hardware spec '{hw.name}' bandwidths "
        f"({hw.intra_busbw_gbps:.0f} GB/s intra-node, {hw.inter_busbw_gbps:.0f} GB/s inter-node bus bandwidth), "
        "status default"
    )
    gpn = cal.gpus_per_node if cal.collectives else hw.gpus_per_node
    return replace(cal, collectives=(*cal.collectives, *extra), gpus_per_node=gpn)


def _is_derived(ns) -> bool:
    p = ns.params.get("derived")
    return p is not None and p.value > 0


def compute_slots(cal: Calibration) -> Param | None:
    """The effective compute slots per node the fit found (the calibration's field), if any."""
    p = cal.compute_slots_per_node
    return p if p is not None and p.value > 0 else None


def same_device(a: str | None, b: str | None) -> bool:
    """Device names equal up to case, punctuation and list order ("Xeon, cpu" == "xeon")."""

    def keys(text: str | None) -> set[str]:
        return {"".join(ch for ch in part.lower() if ch.isalnum()) for part in (text or "").split(",")} - {""}

    ka, kb = keys(a), keys(b)
    return bool(ka and kb and (ka <= kb or kb <= ka))


def host_spec(cal: Calibration) -> HardwareSpec:
    """A hardware spec from the calibration alone, for a device no preset describes (a CPU host).

    Only valid when k2 was measured on traces: the time model then needs no memory
    bandwidth (element-wise and optimizer kernels are inside 1 - k2).  Device memory is
    unknown, so the out-of-memory verdict is off (infinite memory), and the output says so.
    """
    gpn = int(cal.gpus_per_node)
    return HardwareSpec(
        name=cal.system,
        device=cal.device or "unknown",
        peak_tflops=float(cal.peak_tflops or 1.0),
        hbm_gb=float("inf"),
        hbm_tbps=float("inf"),
        gpus_per_node=gpn,
        scale_up_gbps=float("inf"),
        node_nic_gbps=float("inf"),
        runtime_reserve_gb=0.0,
        source=f"calibration {cal.system} (no hardware preset for device '{cal.device}')",
        note="memory size and bandwidth unknown: no out-of-memory verdict",
    )


def build_system(
    cal: Calibration | None,
    hw: HardwareSpec | None,
    *,
    ranks_per_node: int | None = None,
    origin: str | None = None,
) -> tuple[System, list[str]]:
    """The :class:`System` of a calibration and/or a hardware spec; also notes for the output.

    ``origin`` names where the calibration came from (a file) in notes and errors.
    ``ranks_per_node``: ranks placed on one node (default: one per device, the
    calibration's GPUs per node); more ranks than the node's compute slots time-share them.
    """
    if ranks_per_node is not None and ranks_per_node < 1:
        raise InputError("ranks_per_node", f"must be a positive integer, got {ranks_per_node}")
    if cal is None and hw is None:
        raise InputError("system", "say which machine: a fitted calibration or a hardware spec")
    notes: list[str] = []
    if cal is None:
        cal = default_calibration(hw)
        g, k1, k2 = cal.gemm_efficiency_curve, cal.k1_curve, cal.k2_curve
        notes.append(
            f"efficiencies are stated defaults from hardware spec '{hw.name}' (no measurements): "
            f"GEMM {g.y_max.value:.3g} of peak "
            f"({'measured max achievable matmul' if hw.mamf_tflops else 'generic'}; half at "
            f"{g.x_half.value:.0e} FLOP per matmul), attention core at the GEMM efficiency, "
            f"k1 {k1.y_max.value:g}, k2 {k2.y_max.value:g}, busbw {hw.intra_busbw_gbps:.0f} GB/s intra / "
            f"{hw.inter_busbw_gbps:.0f} GB/s inter-node"
        )
        return _node(System(cal, hw), ranks_per_node, notes), notes
    where = origin or f"calibration of {cal.system}"
    own = _saved_hardware(cal) or hardware_for_device(cal.device, cal.gpus_per_node)
    notes.append(
        f"calibration {origin} (system {cal.system})" if origin else f"calibration of system {cal.system}"
    )
    traced_k2 = System(cal, own or host_spec(cal)).k2_covers_other_kernels
    if hw is None:
        if own is None and not traced_k2:
            raise InputError(
                where,
                f"calibration device '{cal.device}' matches no hardware preset; give a hardware spec for HBM "
                "size and bandwidth",
            )
        if own is None:
            own = host_spec(cal)
            notes.append(
                f"no hardware preset for device '{cal.device}': spec from the calibration (peak "
                f"{own.peak_tflops:.4g} TFLOP/s, {own.gpus_per_node} devices per node); device memory unknown, "
                "so no out-of-memory verdict (give a hardware spec for one)"
            )
        hw = own
    elif own is None and same_device(hw.device, cal.device) and cal.gpus_per_node == hw.gpus_per_node:
        notes.append(f"hardware spec '{hw.name}' describes the calibrated device: memory and links from it")
    elif own is None or own.device != hw.device or cal.gpus_per_node != hw.gpus_per_node:
        cal = transfer(cal, hw, own)
        notes.append(
            f"transferred to hardware spec '{hw.name}': fitted efficiencies kept, peak and bandwidths from the spec"
        )
    if is_default(cal):
        frac, curve = achievable_fraction(hw), cal.gemm_efficiency_curve
        if frac is not None and curve is not None and cal.device_model is None:  # the spec path's default
            y = default_calibration(hw).gemm_efficiency_curve.y_max
            cal = replace(cal, gemm_efficiency_curve=replace(curve, y_max=y))
        notes.append(
            "the calibration's GEMM efficiency is a stated default (no fit)"
            + (
                f": the device's measured maximum achievable matmul, {frac:.3g} of peak"
                if frac is not None
                else ""
            )
        )
    cal = _fill_collectives(cal, hw, notes)
    derived = sorted(c for c, ns in cal.network.items() if ns.form == "nccl" and _is_derived(ns))
    if derived:
        notes.append(
            f"no samples for {', '.join(derived)} across nodes: times derived from the fitted network "
            "(NCCL's ring step curve of the measured collectives)"
        )
    # a GPU runs one rank at full speed: compute slots (time-sharing) describe CPU hosts
    slots = compute_slots(cal) if cal.device_model is None else None
    machine = System(cal, hw, compute_slots_per_node=slots.value if slots is not None else None)
    vp, ratio = saved_setting(cal, VECTOR_PASSES_KEY), saved_setting(cal, ATTN_EFF_RATIO_KEY)
    if vp is not None:
        machine = replace(machine, vector_passes=vp)
        notes.append(f"element-wise traffic {vp:.3g} HBM passes, fitted by a validation")
    if ratio is not None:
        machine = replace(machine, attn_eff_ratio=ratio)
        notes.append(f"attention core at {ratio:.3g} x the GEMM efficiency, fitted by a validation")
    dm = cal.device_model
    if machine.k2_covers_other_kernels and (dm is None or not dm.families):  # a device model replaces k1, k2
        notes.append(
            "k2 measured on traces: element-wise, normalisation and optimizer kernels are inside its 1 - k2 share "
            "(no separate memory-traffic or optimizer-step terms)"
        )
    return _node(machine, ranks_per_node, notes), notes


def _node(machine: System, ranks_per_node: int | None, notes: list[str]) -> System:
    """Place ``ranks_per_node`` ranks on each node; say when they time-share its compute."""
    if ranks_per_node is not None:
        machine = replace(machine, ranks_per_node=int(ranks_per_node))
    slots = machine.slots_per_node
    if machine.gpus_per_node > slots:
        notes.append(
            f"{machine.gpus_per_node} ranks per node on {slots:.3g} compute slots (devices, or cores / threads per "
            f"rank, as calibrated): a full node runs everything {machine.gpus_per_node / slots:.2f}x slower "
            "(time-sharing)"
        )
    return machine
