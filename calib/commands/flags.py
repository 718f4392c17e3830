"""The one table from stage field names to command-line options.

Stages and the API raise ``InputError(field, problem)`` naming the field they are about
(``gpus``, ``micro_batch``; or ``"system NAME"`` for one system); they never know option
names.  The CLI's error handler (:func:`calib.cli.main`) turns the field into the option
the user typed, so the user still reads ``calib: --gpus: ...``.
"""

from __future__ import annotations

from calib.core.errors import InputError

#: stage/API field -> command-line option
FLAGS: dict[str, str] = {
    # the machine and the store (predict, search, validate, report, fit, runs, show)
    "system": "--system",
    "calibration": "--calibration",
    "hardware": "--hardware",
    "store": "--store",
    "ranks_per_node": "--ranks-per-node",
    "out": "--out",
    # the model and the strategy (predict, search)
    "model": "--model",
    "gpus": "--gpus",
    "zero": "--zero",
    "tp": "--tp",
    "pp": "--pp",
    "interleave": "--interleave",
    "micro_batch": "--micro-batch",
    "global_batch": "--global-batch",
    "recompute": "--recompute",
    "seq_parallel": "--seq-parallel",
    "max_tp": "--max-tp",
    "cp": "--cp",
    "cp_kind": "--cp-kind",
    "tp_c": "--tp-cols",
    "tp2d_kind": "--tp2d-kind",
    "shard": "--shard-group",
    "zero_impl": "--zero-impl",
    "ep": "--ep",
    "schedule": "--schedule",
    "fp8": "--precision",
    "master_weights": "--master-weights",
    "objective": "--objective",
    "tokens": "--tokens",
    "nvlink_domain": "--nvlink-domain",
    "offload_gbps": "--offload-gbps",
    "price_per_gpu_hour": "--price-per-gpu-hour",
    # fit
    "where": "--where",
    "peak_tflops": "--peak-tflops",
    "gpus_per_node": "--gpus-per-node",
    "profiler_overhead": "--profiler-overhead",
    # validate
    "calibrate_on": "--calibrate-on",
    "holdout": "--holdout",
    "fit": "--fit",
    "format": "--format",
    # report
    "predict": "--predict",
    # ingest
    "framework": "--framework",
    "zero_stage": "--zero-stage",
    "rules": "--rules",
    "jobs": "--jobs",
    "executor": "--executor",
    "scheduler": "--scheduler",
    "max_memory": "--max-memory",
    # capture and bench
    "collectives": "--collectives",
    "min_bytes": "--min-bytes",
    "max_bytes": "--max-bytes",
    "step_factor": "--step-factor",
    "dtype": "--dtype",
    "iters": "--iters",
    "warmup": "--warmup",
    "repeats": "--repeats",
    "sizes": "--sizes",
    "device": "--device",
}


def flag_for(where: str | None) -> str | None:
    """``where`` with a leading field name replaced by its option (``"system x"`` -> ``"--system x"``)."""
    if not where:
        return where
    head, sep, rest = where.partition(" ")
    flag = FLAGS.get(head)
    return f"{flag}{sep}{rest}" if flag else where


def as_cli(exc: InputError) -> InputError:
    """The same error, its field named as the command-line option."""
    where = flag_for(exc.where)
    if where == exc.where:
        return exc
    out = InputError(where, exc.problem)
    out.exit_code = exc.exit_code
    return out
