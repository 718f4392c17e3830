"""GPU power and clock samples (NVML) beside a capture's traces.

A background thread reads, every ``interval_s``, the board power
(``nvmlDeviceGetPowerUsage``, mW), the SM and memory clocks (``nvmlDeviceGetClockInfo``,
MHz) and utilisation (``nvmlDeviceGetUtilizationRates``, %) of the device this rank uses,
and writes them to ``power_rank<R>.csv`` in the run directory -- the file ``calib fit
--power`` calibrates static and dynamic power from.  Seed 003 reads NVML total-power
samples at ~2 ms with ``nvmlDeviceGetSamples``; polling at 20 ms is coarser but needs no
sample-buffer handling.

Without the ``pynvml`` module (package ``nvidia-ml-py``) or without an NVIDIA GPU nothing is
sampled and the run's ``run_config.json`` says why (``power.status = "absent"``).

File format (one header comment, then CSV)::

    # calib power samples v1; device=<name>; interval_ms=20; source=NVML
    t_s,gpu,power_w,sm_clock_mhz,mem_clock_mhz,gpu_util_pct,mem_util_pct
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

POWER_FORMAT = "calib power samples v1"
COLUMNS = ("t_s", "gpu", "power_w", "sm_clock_mhz", "mem_clock_mhz", "gpu_util_pct", "mem_util_pct")


def power_file_name(rank: int) -> str:
    return f"power_rank{rank}.csv"


def nvml_status() -> tuple[bool, str]:
    """(available, why not): pynvml importable and at least one NVIDIA device."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return False, "pynvml (package nvidia-ml-py) is not installed: no GPU power samples recorded"
    try:
        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - NVMLError when no driver / no GPU
        return False, f"NVML unavailable ({exc}): no GPU power samples recorded"
    if n < 1:
        return False, "NVML reports no GPU: no power samples recorded"
    return True, ""


class PowerSampler:
    """Samples one device's power and clocks on a thread; :meth:`stop` writes the CSV."""

    def __init__(self, out_dir: str | Path, rank: int, device_index: int, interval_s: float = 0.02) -> None:
        self.path = Path(out_dir) / power_file_name(rank)
        self.index, self.interval_s = device_index, interval_s
        self.rows: list[tuple] = []
        self.device = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PowerSampler:
        import pynvml  # type: ignore[import-not-found]

        h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        name = pynvml.nvmlDeviceGetName(h)
        self.device = name.decode() if isinstance(name, bytes) else str(name)
        t0 = time.perf_counter()

        def loop() -> None:
            while not self._stop.is_set():
                u = pynvml.nvmlDeviceGetUtilizationRates(h)
                self.rows.append((
                    time.perf_counter() - t0, self.index, pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM), u.gpu, u.memory,
                ))  # fmt: skip
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="calib-power", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop sampling, write the file; the ``power`` entry of run_config.json."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        write_samples(self.path, self.rows, self.device, self.interval_s)
        return {"status": "sampled", "file": self.path.name, "samples": len(self.rows), "device": self.device}


def write_samples(path: Path, rows: list[tuple], device: str, interval_s: float) -> None:
    lines = [
        f"# {POWER_FORMAT}; device={device}; interval_ms={interval_s * 1e3:g}; source=NVML",
        ",".join(COLUMNS),
    ]
    lines += [",".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in r) for r in rows]
    path.write_text("\n".join(lines) + "\n")


def start_sampling(out_dir: str | Path, rank: int, enabled: bool | None) -> tuple[PowerSampler | None, dict]:
    """A running sampler when NVML and a GPU are there (and ``enabled`` is not False); else the reason."""
    if enabled is False:
        return None, {"status": "off", "note": "power sampling turned off"}
    ok, why = nvml_status()
    if not ok:
        return None, {"status": "absent", "note": why}
    try:
        import torch

        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - fall back to the first device
        index = 0
    return PowerSampler(out_dir, rank, index).start(), {"status": "sampling"}
