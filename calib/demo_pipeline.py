"""The whole pipeline on the bundled fixtures, in a store of its own under ``--out``.

1. ingest the Polaris nccl-tests logs (system ``polaris``), real GPU traces from HTA's
   test data (system ``hta-gpu``) and real CPU/gloo training traces of a tiny GPT at
   three widths and under DDP, DeepSpeed ZeRO-1/3 and FSDP (system ``cpu-gloo``);
2. fit ``polaris`` (collective curves per span, eff_{g->n});
3. predict ZeRO-1/2/3 scaling on 8-512 GPUs for the seed-004 models, the TP x DP and
   TP x PP maps and a strategy search, validate on the published tables;
4. write the report (``OUT/report/report.html``) and say where it is.

Nothing outside ``OUT`` is touched: the store is ``OUT/store``.  A directory that is
not empty is used only if an earlier demo made it (it holds ``.calib-demo``); then its
``store`` and ``report`` are replaced.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from calib.core.atomic import write_text
from calib.core.bundled import ENV, fixtures_dir
from calib.core.errors import InputError

MARKER = ".calib-demo"


@dataclass(frozen=True)
class DemoRun:
    system: str
    name: str
    paths: tuple[str, ...]  # relative to the fixtures directory
    what: str


RUNS = (
    DemoRun("polaris", "polaris-nccl-tests", ("nccl-tests",), "nccl-tests logs, ALCF Polaris, 2 and 8 nodes"),
    DemoRun("hta-gpu", "nccl-ddp-a100", ("traces/hta/nccl_parser_config",), "GPU trace, A100 DDP with NCCL"),
    DemoRun(
        "hta-gpu", "two-ranks-of-128", ("traces/hta/trace_filter",), "GPU traces, 2 ranks of a 128-rank job"
    ),
    DemoRun(
        "cpu-gloo", "ddp-d64-ws2", ("traces/generated/ddp-d64-ws2",), "tiny GPT d=64, DDP, 2 ranks (gloo)"
    ),
    DemoRun("cpu-gloo", "ddp-d128-ws2", ("traces/generated/ddp-d128-ws2",), "tiny GPT d=128, DDP, 2 ranks"),
    DemoRun("cpu-gloo", "ddp-d256-ws2", ("traces/generated/ddp-d256-ws2",), "tiny GPT d=256, DDP, 2 ranks"),
    DemoRun("cpu-gloo", "ds-z1-d128-ws2", ("traces/generated/ds-z1-d128-ws2",), "DeepSpeed ZeRO-1, 2 ranks"),
    DemoRun("cpu-gloo", "ds-z3-d128-ws2", ("traces/generated/ds-z3-d128-ws2",), "DeepSpeed ZeRO-3, 2 ranks"),
    DemoRun(
        "cpu-gloo", "fsdp-full-d128-ws2", ("traces/generated/fsdp-full-d128-ws2",), "FSDP FULL_SHARD, 2 ranks"
    ),
)
SYSTEM = "polaris"


def prepare(out: Path) -> Path:
    """Make ``out`` ready (see module docstring) and return its store path."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError("out", f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise InputError("out", f"{out} is not empty and was not made by `calib demo`; give a new directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text(
            out / MARKER, "made by `calib demo`; its store/ and report/ are replaced by the next demo\n"
        )
    except OSError as exc:
        raise InputError("out", f"cannot write {out}: {exc.strerror or exc}") from None
    store = out / "store"
    if store.exists():
        shutil.rmtree(store)
    return store


def run_demo(out: Path, fixtures: Path | None = None, echo: Callable[[str], None] = print) -> Path:
    """Run the pipeline through the public API; return the report's path.  ``echo`` gets one
    plain line per step."""
    from calib import api
    from calib.reports.spec import default_spec

    fixtures = Path(fixtures or fixtures_dir()).resolve()
    missing = [p for r in RUNS for p in r.paths if not (fixtures / p).exists()]
    if missing:
        raise InputError(
            fixtures,
            f"demo fixtures missing ({', '.join(missing)}): give a complete fixtures directory "
            f"(--fixtures or ${ENV})",
        )
    t_all = time.perf_counter()
    store = prepare(out)
    n = len(RUNS) + 2
    traced = []
    for i, r in enumerate(RUNS, start=1):
        t0 = time.perf_counter()
        run = api.ingest_run([fixtures / p for p in r.paths], system=r.system, name=r.name, store=store)
        if r.system != SYSTEM:
            traced.append(run)
        echo(f"[{i}/{n}] ingest {r.system}/{r.name}: {r.what} ({time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    model = api.SystemModel().fit(api.load_runs(system=SYSTEM, store=store))
    model.save(store=store)
    cal = model.calibration_
    curves = ", ".join(sorted({c.collective for c in cal.collectives}))
    echo(f"[{n - 1}/{n}] fit {SYSTEM}: curves for {curves} at {sorted({c.n_gpus for c in cal.collectives})} GPUs, "
         f"eff g->n for {', '.join(sorted(cal.network))} ({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    t0 = time.perf_counter()
    spec = default_spec()
    path = api.report(Path(out) / "report", runs=traced, model=model, predict=spec, store=store,
                      title=f"calib demo: {SYSTEM} calibration, seed-004 scaling predictions")  # fmt: skip
    n_figures = len(list((path.parent / "figures").glob("*.png")))
    echo(f"[{n}/{n}] report: {n_figures} figures, ZeRO-1/2/3 on 8-512 GPUs for the seed-004 models, "
         f"TP x DP / TP x PP maps, strategy search, validation ({time.perf_counter() - t0:.1f} s)")  # fmt: skip
    echo(f"demo finished in {time.perf_counter() - t_all:.1f} s; store {store}")
    return path
