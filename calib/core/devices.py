"""Datasheet limits of known accelerators, for physics checks on measured kernels.

Dense (non-sparse) tensor-core peaks and HBM bandwidth from the vendors' datasheets
(NVIDIA A100/H100/H200 datasheets; the same values as analytic/data/hardware.yaml).
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


DEVICES = (
    DeviceLimits(
        r"H100.*(SXM|HBM3)", 989.4, 3.35, "NVIDIA H100 SXM datasheet (dense BF16 989 TFLOP/s, 3.35 TB/s)"
    ),
    DeviceLimits(
        r"H100.*(PCIe|HBM2e)", 756.0, 2.0, "NVIDIA H100 PCIe datasheet (dense BF16 756 TFLOP/s, 2.0 TB/s)"
    ),
    DeviceLimits(r"H100", 989.4, 3.35, "NVIDIA H100 SXM datasheet"),
    DeviceLimits(r"H200", 989.4, 4.8, "NVIDIA H200 datasheet (dense BF16 989 TFLOP/s, 4.8 TB/s)"),
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
