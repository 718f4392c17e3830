"""Store benchmark results as a run of kind ``bench``, as nccl-tests logs are stored.

The fit then finds them next to ingested traces and nccl-tests samples of the same
system: ``<store>/<system>/runs/<name>/`` with a ``samples`` or ``gemm_samples`` table.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from calib.core.schema import KIND_BENCH, RunMeta
from calib.core.store import save_run


def default_name(prefix: str) -> str:
    """``<prefix>-<host>-<UTC timestamp>``: unique per benchmark invocation."""
    host = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())[:40]
    return f"{prefix}-{host}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}"


def write_bench_run(
    store: Path,
    system: str | None,
    name: str,
    table: str,
    df: pd.DataFrame,
    *,
    world_size: int,
    backend: str | None,
    devices: Sequence[str],
    notes: Sequence[str] = (),
    replace: bool = False,
    on_wait=None,  # noqa: ANN001 - calib.core.store.save_run's
) -> Path:
    """Write ``df`` as table ``table`` of a bench run; returns the run directory.

    A run of that name in the store raises ``RunExists`` unless ``replace`` (then it is
    replaced atomically), as for ingested runs.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        calib_version = version("calib")
    except PackageNotFoundError:  # pragma: no cover - source tree without install
        calib_version = "0.0.0+src"
    meta = RunMeta(
        name=name,
        kind=KIND_BENCH,
        system=system,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        calib_version=calib_version,
        world_size=world_size,
        ranks=tuple(range(world_size)),
        backend=backend,
        devices=tuple(devices),
        notes=tuple(notes),
    )
    return save_run(store, meta, {table: df}, replace=replace, on_wait=on_wait)
