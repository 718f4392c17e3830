"""Datasheet limits of known accelerators, for physics checks on measured kernels.

Dense (non-sparse) tensor-core peaks (BF16, and FP8 where the device has it) and HBM
bandwidth from the vendors' datasheets (NVIDIA A100/H100/H200 datasheets; the same values
as analytic/data/hardware.yaml's peak_tflops / peak_fp8_tflops).
A kernel class that runs faster than this was counted wrongly, not measured well.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceLimits:
    match: str  # regex on the device name the trace reports
    bf16_tflops: float
    hbm_tbps: float
    source: str
    #: dense FP8 tensor-core peak; None where the device has no FP8 units
    fp8_tflops: float | None = None


DEVICES = (
    DeviceLimits(
        r"H100.*(SXM|HBM3)",
        989.4,
        3.35,
        "NVIDIA H100 SXM datasheet (dense BF16 989 TFLOP/s, 3.35 TB/s)",
        1978.9,
    ),
    DeviceLimits(
        r"H100.*(PCIe|HBM2e)",
        756.0,
        2.0,
        "NVIDIA H100 PCIe datasheet (dense BF16 756 TFLOP/s, 2.0 TB/s)",
        1513.0,
    ),
    DeviceLimits(r"H100", 989.4, 3.35, "NVIDIA H100 SXM datasheet", 1978.9),
    DeviceLimits(r"H200", 989.4, 4.8, "NVIDIA H200 datasheet (dense BF16 989 TFLOP/s, 4.8 TB/s)", 1978.9),
    DeviceLimits(r"A100.*80", 312.0, 2.039, "NVIDIA A100 80GB SXM datasheet (312 TFLOP/s, 2.039 TB/s)"),
    DeviceLimits(r"A100", 312.0, 1.555, "NVIDIA A100 40GB datasheet (312 TFLOP/s, 1.555 TB/s)"),
)

PHYSICS_WARNING = "physics warning: kernel class "


def limits_for(device: str | None) -> DeviceLimits | None:
    if not device:
        return None
    for d in DEVICES:
        if re.search(d.match, device, re.I):
            return d
    return None


def physics_warning(kernel_class: str, text: str) -> str:
    """A run note the fit recognises: the class is left out of calibration."""
    return f"{PHYSICS_WARNING}{kernel_class}: {text} (left out of calibration)"


def flagged_classes(notes: tuple[str, ...] | list[str]) -> set[str]:
    """Kernel classes a run's notes flag as physically impossible."""
    out = set()
    for n in notes:
        i = n.find(PHYSICS_WARNING)
        if i >= 0:
            out.add(n[i + len(PHYSICS_WARNING) :].split(":", 1)[0].strip())
    return out


_CHIP = re.compile(
    r"\b(H100|H200|H20|A100|A800|H800|B200|B100|GB200|V100|MI300X|MI250X?|L40S?|A10G?)\b", re.I
)
_MEM = re.compile(r"(\d+)\s*GB", re.I)


def device_key(name: str | None) -> tuple[str, str, str] | None:
    """(chip, memory GB, form factor) of a device name, for matching the names torch reports
    ("NVIDIA H100 80GB HBM3") with preset names ("NVIDIA H100-SXM5-80GB").  None when the
    chip is not recognised."""
    if not name:
        return None
    text = name.replace("-", " ").replace("_", " ")
    m = _CHIP.search(text)
    if m is None:
        return None
    mem = _MEM.search(text)
    form = "pcie" if re.search(r"pcie|nvl\b", text, re.I) else "sxm"
    return m.group(1).upper(), mem.group(1) if mem else "", form


def same_chip(a: str | None, b: str | None) -> bool:
    """Two device names describe the same accelerator (chip, form factor and, when both
    state it, memory size)."""
    ka, kb = device_key(a), device_key(b)
    if ka is None or kb is None:
        return False
    return ka[0] == kb[0] and ka[2] == kb[2] and (not ka[1] or not kb[1] or ka[1] == kb[1])


def same_device(a: str | None, b: str | None) -> bool:
    """Two device names of one device: equal or contained alphanumerics, or the same chip."""

    def key(text: str | None) -> str:
        return "".join(ch for ch in (text or "").lower() if ch.isalnum())

    ka, kb = key(a), key(b)
    return (bool(ka and kb) and (ka == kb or ka in kb or kb in ka)) or same_chip(a, b)
