"""How much memory ingest may use, and whether a trace fits in it.

Ingest decodes a trace in memory when it fits and streams it in batches when it does
not (``ingest.stream``).  The budget is ``--max-memory`` for the whole ingest on this
machine; parallel executors split it evenly between their workers.  The default is a
fraction of the memory *available to this process*: on HPC nodes a job's cgroup limit
(Slurm, PBS) is often far below the node's RAM, so both are consulted.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from calib.core.errors import InputError

#: share of the available memory the default budget takes
DEFAULT_FRACTION = 0.5
#: peak resident bytes of the in-memory path per byte of inflated JSON (measured on the
#: tiled df_index_resolver trace: 2.9 GB peak for 1.1 GB of JSON), with some margin
IN_MEMORY_BYTES_PER_JSON_BYTE = 3.0
#: peak memory of a streamed trace per complete event: its columns (~40 bytes) and the
#: analysis' arrays over them (285 bytes measured on the tiled 1.1 GB trace: 855 MB peak
#: for 2.47 M complete events, 150 MB of it the interpreter and libraries)
STREAMED_BYTES_PER_EVENT = 300
#: streamed batches are this fraction of a worker's budget (a batch costs ~4x its size
#: while it is decoded), bounded below and above
BATCH_FRACTION = 1 / 32
MIN_BATCH_BYTES = 1 << 20
MAX_BATCH_BYTES = 64 << 20

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(?:i?b)?\s*$", re.I)


@dataclass(frozen=True)
class MemoryBudget:
    """A memory budget in bytes, and where it came from (for messages)."""

    total_bytes: int
    source: str  # "stated: 16G" or "default: 50% of 22.1 GiB available"

    def per_worker(self, workers: int) -> int:
        return max(self.total_bytes // max(workers, 1), 1)


def parse_size(text: str, available: int | None = None) -> int:
    """Bytes from ``"4G"``, ``"512MiB"``, ``"1.5GB"``, ``"1073741824"`` or ``"30%"``.

    Units are binary (K = 1024); a percentage is of the memory available now.
    """
    text = str(text).strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            pct = -1.0
        if not 0 < pct <= 100:
            raise InputError("max_memory", f"percentage must be in (0, 100], got '{text}'")
        return int((available if available is not None else available_bytes()) * pct / 100)
    m = _SIZE_RE.match(text)
    if not m:
        raise InputError("max_memory", f"expected a size such as 8G, 512M or 40%, got '{text}'")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value < MIN_BATCH_BYTES:
        raise InputError("max_memory", f"{text} is too small; give at least 1M")
    return value


def available_bytes() -> int:
    """Memory this process can still use: the smaller of the host's and the cgroup's."""
    host = _meminfo_available()
    group = _cgroup_available()
    candidates = [v for v in (host, group) if v is not None and v > 0]
    return min(candidates) if candidates else 4 << 30


def default_budget() -> MemoryBudget:
    avail = available_bytes()
    return MemoryBudget(
        int(avail * DEFAULT_FRACTION),
        f"default: {DEFAULT_FRACTION:.0%} of {human(avail)} available",
    )


def budget_from_option(text: str | None) -> MemoryBudget:
    if text is None:
        return default_budget()
    return MemoryBudget(parse_size(text), f"stated: {text}")


def inflated_size(path: Path) -> int:
    """Size of the JSON a trace file holds, without reading it all.

    Plain files: their size.  Gzip: the trailer's ISIZE (size modulo 4 GiB); when that
    is implausibly small for JSON (below twice the compressed size, i.e. it wrapped or
    the file has several members) the estimate is 20x the compressed size, a typical
    ratio for Kineto JSON, so that big traces err towards streaming.
    """
    size = path.stat().st_size
    try:
        with path.open("rb") as fh:
            magic = fh.read(2)
            if magic != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
    except OSError:
        return size
    return isize if isize >= 2 * size else 20 * size


def fits_in_memory(path: Path, budget_bytes: int) -> bool:
    """Whether the in-memory path's peak for ``path`` stays within ``budget_bytes``."""
    return inflated_size(path) * IN_MEMORY_BYTES_PER_JSON_BYTE <= budget_bytes


def max_in_memory_json(budget_bytes: int) -> int:
    """The most inflated JSON the in-memory path may hold within ``budget_bytes``."""
    return int(budget_bytes / IN_MEMORY_BYTES_PER_JSON_BYTE)


def batch_bytes(budget_bytes: int) -> int:
    """Inflated bytes per streamed batch for a worker with ``budget_bytes``."""
    return int(min(max(budget_bytes * BATCH_FRACTION, MIN_BATCH_BYTES), MAX_BATCH_BYTES))


def human(nbytes: float) -> str:
    """``1.5 GiB``, ``12 MiB``: sizes for messages."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{int(nbytes)} B"


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """Limit minus usage of this process's memory cgroup (v2, then v1), if limited."""
    pairs = (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    )
    for limit_path, usage_path in pairs:
        try:
            limit_text = Path(limit_path).read_text().strip()
            if limit_text == "max":
                return None
            limit = int(limit_text)
            if limit >= 1 << 60:  # v1's "unlimited"
                return None
            usage = int(Path(usage_path).read_text().strip())
            return max(limit - usage, 0)
        except (OSError, ValueError):
            continue
    return None
