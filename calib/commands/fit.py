"""``calib fit``: fit a system's calibration from its stored runs and samples."""

from __future__ import annotations

from pathlib import Path

import click

from calib.core.errors import InputError
from calib.core.store import calibration_path, check_name, default_store


@click.command(name="fit")
@click.option(
    "--system", required=True, help="System whose stored runs to fit (as given to `calib ingest --system`)."
)
@click.option(
    "--store",
    type=click.Path(path_type=Path),
    help="Store directory (default ./calib-store or $CALIB_STORE).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Write the calibration JSON here (default <store>/<system>/<system>.calib.json).",
)
@click.option(
    "--where",
    "where_items",
    multiple=True,
    metavar="KEY=VALUE",
    help="Use only matching samples/runs, e.g. setup=5, nccl_version=2.21, nnodes=2,8, run=NAME (repeatable).",
)
@click.option(
    "--peak-tflops",
    type=float,
    help="Dense peak of one device in TFLOP/s (e.g. 312 for A100 BF16): the GEMM-efficiency denominator. "
    "Default: the best sustained throughput of the system's `calib bench gemm` samples.",
)
@click.option(
    "--gpus-per-node",
    type=int,
    help="Devices per node: GPUs, or on a CPU host cores / threads per rank (default: from the collective "
    "samples' rank lines). Ranks beyond it on one node time-share its compute.",
)
@click.option(
    "--profiler-overhead",
    type=float,
    help="Profiled / unprofiled step time of the traced runs (e.g. 1.15; the medians of the 'active' and "
    "'after' step_times_s of the capture's run_config.json). Its excess is taken out of the traces' "
    "dispatch time so the fit describes unprofiled steps.",
)
@click.option(
    "--power",
    "power_file",
    metavar="FILE",
    help="Fit static and dynamic GPU power from NVML samples (power_rank<R>.csv of calib capture) instead of "
    "the traces; writes <store>/<system>/<system>.power.json (or --out), used by predict --energy.",
)
def fit(
    system: str,
    store: Path | None,
    out: Path | None,
    where_items: tuple[str, ...],
    peak_tflops: float | None,
    gpus_per_node: int | None,
    profiler_overhead: float | None,
    power_file: str | None,
):
    """Fit the efficiency factors of SYSTEM and write NAME.calib.json.

    \b
    From nccl-tests samples: per collective and scale, the time against message size
    as piecewise alpha-beta (time = alpha [s] + bytes * bus factor / busbw [GB/s], one
    segment per NCCL protocol regime), and across nodes a model with NCCL's structure
    (ring steps of the per-rank chunk, tree with NCCL's latency shape, all-to-all with the
    hardware spec's topology contention; docs/network.md).  NCCL versions and setups are
    never pooled: the note says which one the fit used.  From traces: k1 (kernel share of compute), k2
    (GEMM+attention share of kernel time) and GEMM efficiency as functions of FLOPs per
    matmul, and host dispatch seconds per operator.  Every parameter carries its
    standard error and status (fitted, default, unidentifiable, fixed); every fit its
    R^2, residuals and number of points.  Missing data keeps a stated default.

    \b
    From `calib bench gemm` samples: without --peak-tflops the peak is the best
    sustained matmul throughput measured (stated as such), and the benchmarked shapes
    join the traced matmuls on the GEMM-efficiency curve.  From traces of one model at
    several ranks per node: the effective compute slots per node (ranks beyond them
    time-share the node's cores or devices).
    """
    from calib.calibrate.fit import fit_system
    from calib.calibrate.select import parse_where
    from calib.resolve import network_topology, system_runs

    check_name("system", system)
    if power_file:
        from calib.commands.energy_cli import fit_power

        click.echo(fit_power(system, store, out, power_file))
        return
    if peak_tflops is not None and not peak_tflops > 0:
        raise InputError("--peak-tflops", f"must be positive, got {peak_tflops}")
    if profiler_overhead is not None and not profiler_overhead > 0:
        raise InputError("--profiler-overhead", f"must be a positive ratio, got {profiler_overhead}")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise InputError("--gpus-per-node", f"must be a positive integer, got {gpus_per_node}")
    store = store or default_store()
    if not Path(store).is_dir():
        raise InputError(
            "--store", f"{store} does not exist (ingest runs first: calib ingest PATH --system {system})"
        )
    topology, topology_note = network_topology(system)
    cal = fit_system(
        system_runs(store, system),
        system,
        topology=topology,
        topology_note=topology_note,
        where=parse_where(where_items),
        peak_tflops=peak_tflops,
        gpus_per_node=gpus_per_node,
        profiler_overhead=profiler_overhead,
    )
    target = out or calibration_path(store, system)
    if target.exists() and target.is_dir():
        raise InputError("--out", f"{target} is a directory")
    try:
        cal.save(target)
    except OSError as exc:
        raise InputError(
            "--out" if out else str(target), f"cannot write the calibration: {exc.strerror or exc}"
        ) from None
    from calib.commands.show import render

    click.echo(render(cal, brief=True))
    click.echo(f"\ncalibration written to {target}")
