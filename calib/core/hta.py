"""The one adapter to HTA (Holistic Trace Analysis: ``traceinsight``, ``import hta``).

HTA is an optional extra (``pip install 'calib[hta]'``) used for cross-checks and report
panels only.  Nothing on calib's core import path imports this module: its two users
(:mod:`calib.ingest.hta_compare`, :mod:`calib.reports.hta_panel`) import it inside the
functions that need HTA, and it imports HTA itself only inside :func:`trace_analysis`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

NS_ROUNDING_ENV = "HTA_DISABLE_NS_ROUNDING"


def available() -> bool:
    """Whether HTA is installed."""
    return importlib.util.find_spec("hta") is not None


@contextlib.contextmanager
def _ns_rounding(enabled: bool) -> Iterator[None]:
    """HTA's ns rounding on or off for the duration (its singleton and, for worker
    processes that re-read it, its environment variable), restored afterwards."""
    from hta.configs.env_options import HTAEnvOptions

    opts = HTAEnvOptions.instance()
    saved_opt, saved_env = opts.disable_ns_rounding(), os.environ.get(NS_ROUNDING_ENV)
    opts.set_disable_ns_rounding(not enabled)
    os.environ[NS_ROUNDING_ENV] = "0" if enabled else "1"
    try:
        yield
    finally:
        opts.set_disable_ns_rounding(saved_opt)
        if saved_env is None:
            os.environ.pop(NS_ROUNDING_ENV, None)
        else:
            os.environ[NS_ROUNDING_ENV] = saved_env


@contextlib.contextmanager
def trace_analysis(
    paths: Sequence[str | Path], *, ns_rounding: bool | None = None, quiet: bool = False
) -> Iterator[Any]:
    """HTA's ``TraceAnalysis`` of the traces (one job's ranks), valid inside the block.

    The files are copied into a temporary directory, which HTA loads as one job (it reads
    each file's rank from its content).  ``ns_rounding``: force HTA's rounding of
    fractional-µs timestamps on or off (None: HTA's default).  ``quiet``: HTA's prints,
    warnings and log lines are swallowed (its results come back regardless).
    """
    from hta.trace_analysis import TraceAnalysis

    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="calib-hta-"))
        for i, p in enumerate(map(Path, paths)):
            shutil.copy(p, Path(tmp) / f"{i}-{p.name}")
        if ns_rounding is not None:
            stack.enter_context(_ns_rounding(ns_rounding))
        if quiet:
            logging.getLogger("hta").setLevel(logging.CRITICAL)
            stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
        yield TraceAnalysis(trace_dir=tmp)
