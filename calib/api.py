"""calib's public Python API, in the scikit-learn spirit.

    import calib

    runs = calib.load_runs(system="polaris", store="calib-store")    # or calib.ingest_run(paths, ...)
    model = calib.SystemModel().fit(runs)                            # fitted attributes end in _
    model.busbw("allreduce", 16)                                     # Param: value, stderr, status
    model.predict("gpt-13b", gpus=[8, 64, 512], zero=3).table        # one row per GPU count
    model.search("gpt3-175b", gpus=4096, hardware="selene").top
    model.save("polaris.calib.json"); calib.SystemModel.load("polaris.calib.json")
    calib.validate("fixtures/published/megatron_sc21_table1_weak_scaling.csv", calibrate_on="1,4,7,10")
    calib.report("report/", model=model, runs=runs)

This layer (with :mod:`calib.resolve` and :mod:`calib.report_data`) opens the store,
resolves names and orchestrates the stages, which are pure functions of typed inputs.
Bad input raises :class:`calib.core.errors.InputError` naming the argument it is about.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from calib.analytic.machine import build_system, compute_slots, default_calibration
from calib.analytic.predict import Plan, Prediction
from calib.analytic.search import SearchResult, Space
from calib.analytic.specs import HardwareSpec, ModelSpec, load_hardware, load_model
from calib.analytic.timemodel import System
from calib.analytic.validate import Validation
from calib.api_seeds import SeedsMixin, fit_power  # noqa: F401 - public API
from calib.calibrate.calibration import Calibration, Param
from calib.core.errors import InputError
from calib.core.rundir import Run, read_run, write_run
from calib.core.store import calibration_path, check_name, run_dir
from calib.reports.inputs import Inputs
from calib.reports.spec import PredictSpec
from calib.resolve import (
    attention_default,
    gather,
    load_calibration,
    measured_series,
    resolve_run,
    stack_defaults,
    store_path,
    system_runs,
)

__all__ = [
    "NotFittedError",
    "SystemModel",
    "demo",
    "ingest_run",
    "load_hardware",
    "load_model",
    "load_runs",
    "report",
    "validate",
]


class NotFittedError(ValueError, AttributeError):
    """A fitted attribute (``name_``) was read before :meth:`SystemModel.fit` or ``load``."""


def load_runs(
    source: str | Path | Sequence[str | Path] | None = None,
    *,
    system: str | None = None,
    store: str | Path | None = None,
    kind: str | None = None,
) -> list[Run]:
    """Stored runs: every run of ``system`` in the store, or the run directories / run names
    in ``source``.  ``kind`` keeps one kind ("trace", "nccl-tests", "bench")."""
    if source is None:
        if not system:
            raise InputError("system", "give a system name or run directories")
        runs = system_runs(store, system)
    else:
        items = [source] if isinstance(source, (str, Path)) else list(source)
        runs = [resolve_run(a, store_path(store), system) for a in items]
    return [r for r in runs if kind is None or r.meta.kind == kind]


def ingest_run(
    paths: str | Path | Sequence[str | Path],
    *,
    system: str | None = None,
    name: str | None = None,
    framework: str | None = None,
    zero_stage: int | None = None,
    model: dict[str, Any] | None = None,
    rules: str | Path | None = None,
    jobs: int = 1,
    store: str | Path | None = None,
    out: str | Path | None = None,
) -> Run:
    """Traces (one run, all ranks) or nccl-tests logs into a run, written to the store (or
    to the directory ``out``) and returned.  ``model``: the shape, e.g. ``{"d": 768, "l": 12}``."""
    from calib.ingest.executors import ExecutorSpec
    from calib.ingest.orchestrate import IngestOptions
    from calib.ingest.orchestrate import ingest as run_ingest
    from calib.ingest.rules import load_rules

    for field_name, value in (("system", system), ("name", name)):
        if value:
            check_name(field_name, value)
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    options = IngestOptions(system=system, name=name, framework=framework, zero_stage=zero_stage,
                            model=dict(model or {}), rules=load_rules(rules))  # fmt: skip
    meta, tables = run_ingest(items, options, executor=ExecutorSpec(jobs=jobs))
    target = Path(out) if out is not None else run_dir(store_path(store), meta.system, meta.name)
    write_run(target, meta, tables)
    return read_run(target)


def _model(model: str | ModelSpec) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


class SystemModel(SeedsMixin):
    """The calibrated performance model of one system.

    Parameters are stored as given and used by :meth:`fit` (``where``, ``peak_tflops``,
    ``gpus_per_node``, ``profiler_overhead``: see :func:`calib.calibrate.fit.fit_system`)
    and by prediction (``hardware``: a preset or spec file to transfer the fit to or to
    read HBM from; ``ranks_per_node``).  Fitted attributes end in ``_``; every fitted
    quantity is a :class:`~calib.calibrate.calibration.Param` (value, stderr, status) or a
    curve of them.
    """

    def __init__(
        self,
        *,
        where: dict[str, Sequence[str]] | None = None,
        peak_tflops: float | None = None,
        gpus_per_node: int | None = None,
        profiler_overhead: float | None = None,
        hardware: str | None = None,
        ranks_per_node: int | None = None,
    ) -> None:
        self.where = where
        self.peak_tflops = peak_tflops
        self.gpus_per_node = gpus_per_node
        self.profiler_overhead = profiler_overhead
        self.hardware = hardware
        self.ranks_per_node = ranks_per_node

    def get_params(self) -> dict[str, Any]:
        keys = ("where", "peak_tflops", "gpus_per_node", "profiler_overhead", "hardware", "ranks_per_node")
        return {k: getattr(self, k) for k in keys}

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if v is not None)
        fitted = f"  # fitted: {self.calibration_.system}" if "calibration_" in self.__dict__ else ""
        return f"SystemModel({given}){fitted}"

    # -- fitting, saving, loading ---------------------------------------------------------

    def fit(self, runs: Sequence[Run], system: str | None = None) -> SystemModel:
        """Fit every factor the runs support (nccl-tests samples, traces, benchmarks)."""
        from calib.calibrate.fit import fit_system

        runs = list(runs)
        names = sorted({r.meta.system for r in runs if r.meta.system})
        if system is None:
            if len(names) != 1:
                raise InputError(
                    "system", f"the runs belong to {len(names)} systems ({', '.join(names)}); name one"
                )
            system = names[0]
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise InputError("peak_tflops", f"must be positive, got {self.peak_tflops}")
        if self.profiler_overhead is not None and not self.profiler_overhead > 0:
            raise InputError("profiler_overhead", f"must be a positive ratio, got {self.profiler_overhead}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise InputError("gpus_per_node", f"must be a positive integer, got {self.gpus_per_node}")
        where = {k: tuple(str(x) for x in ([v] if isinstance(v, (str, int)) else v))
                 for k, v in (self.where or {}).items()}  # fmt: skip
        from calib.resolve import network_topology

        topology, topology_note = network_topology(system)
        cal = fit_system(runs, system, where=where, peak_tflops=self.peak_tflops,
                         gpus_per_node=self.gpus_per_node, profiler_overhead=self.profiler_overhead,
                         topology=topology, topology_note=topology_note)  # fmt: skip
        return self._set(cal, None, stated_defaults=False)

    def _set(self, cal: Calibration, path: Path | None, *, stated_defaults: bool) -> SystemModel:
        self.calibration_ = cal
        self.path_ = path
        self._stated_defaults = stated_defaults
        return self

    @classmethod
    def from_calibration(cls, calibration: Calibration, **params: Any) -> SystemModel:
        return cls(**params)._set(calibration, None, stated_defaults=False)

    @classmethod
    def load(cls, path: str | Path, **params: Any) -> SystemModel:
        """A fitted model from a calibration JSON file (as :meth:`save` writes it)."""
        cal, path = load_calibration(None, path)
        return cls(**params)._set(cal, path, stated_defaults=False)

    @classmethod
    def from_store(cls, system: str, store: str | Path | None = None, **params: Any) -> SystemModel:
        """The fitted calibration of ``system`` in the store."""
        cal, path = load_calibration(system, None, store)
        return cls(**params)._set(cal, path, stated_defaults=False)

    @classmethod
    def from_hardware(cls, hardware: str, **params: Any) -> SystemModel:
        """No measurements: every efficiency a stated default of the hardware spec."""
        model = cls(hardware=hardware, **params)
        return model._set(default_calibration(load_hardware(hardware)), None, stated_defaults=True)

    def save(self, path: str | Path | None = None, *, store: str | Path | None = None) -> Path:
        """Write the calibration JSON (default: the store's ``<system>/<system>.calib.json``)."""
        cal = self._fitted()
        target = Path(path) if path is not None else calibration_path(store_path(store), cal.system)
        if target.is_dir():
            raise InputError("out", f"{target} is a directory")
        try:
            cal.save(target)
        except OSError as exc:
            raise InputError(str(target), f"cannot write the calibration: {exc.strerror or exc}") from None
        self.path_ = target
        return target

    # -- fitted attributes ------------------------------------------------------------------

    def _fitted(self) -> Calibration:
        cal = self.__dict__.get("calibration_")
        if cal is None:
            raise NotFittedError("this SystemModel is not fitted: call fit(runs), or load a calibration")
        return cal

    system_ = property(lambda self: self._fitted().system, doc="The system name.")
    collectives_ = property(lambda self: self._fitted().collectives, doc="Collective curves (alpha, busbw).")
    network_ = property(lambda self: dict(self._fitted().network), doc="eff_{g->n} per collective.")
    gemm_efficiency_ = property(
        lambda self: self._fitted().gemm_efficiency_curve, doc="GEMM efficiency curve."
    )
    k1_ = property(lambda self: self._fitted().k1_curve, doc="Kernel share of compute (curve).")
    k2_ = property(lambda self: self._fitted().k2_curve, doc="Transformer-kernel share of kernel time.")
    dispatch_ = property(lambda self: dict(self._fitted().dispatch), doc="Host dispatch s per operator.")
    peak_tflops_ = property(lambda self: self._fitted().peak_tflops, doc="Dense peak, TFLOP/s.")
    gpus_per_node_ = property(lambda self: self._fitted().gpus_per_node, doc="Devices per node.")
    compute_slots_ = property(lambda self: compute_slots(self._fitted()), doc="Compute slots per node.")
    notes_ = property(lambda self: self._fitted().notes, doc="What the fit decided, and why.")
    device_model_ = property(
        lambda self: self._fitted().device_model,
        doc="The physical compute model fitted from GPU traces (terms with stderr; per-run checks in .runs).",
    )

    def busbw(self, collective: str, n_gpus: int) -> Param:
        """The fitted large-message bus bandwidth (GB/s, with stderr) of ``collective`` at ``n_gpus``."""
        curves = [c for c in self._fitted().curves_for(collective) if c.n_gpus == n_gpus]
        if not curves:
            have = sorted({c.n_gpus for c in self._fitted().curves_for(collective)})
            raise InputError("gpus", f"no fitted {collective} curve at {n_gpus} GPUs (fitted at {have})")
        return curves[0].busbw_gbps

    # -- prediction -------------------------------------------------------------------------

    def machine(self, hardware: str | HardwareSpec | None = None) -> tuple[System, list[str]]:
        """The analytic :class:`System` (calibration + hardware spec) and notes on how it was built."""
        cal = self._fitted()
        hw = hardware or self.hardware
        spec = load_hardware(hw) if isinstance(hw, str) else hw
        origin = str(self.path_) if self.path_ is not None else None
        return build_system(None if self._stated_defaults else cal, spec,
                            ranks_per_node=self.ranks_per_node, origin=origin)  # fmt: skip

    def predict(
        self,
        model: str | ModelSpec,
        gpus: int | Sequence[int],
        *,
        hardware: str | HardwareSpec | None = None,
        recompute: str = "none",
        **plan: Any,
    ) -> Prediction:
        """Iteration time, memory and scaling of one strategy at each GPU count.

        ``plan``: ``zero``, ``tp``, ``pp``, ``micro_batch``, ``global_batch``, ``interleave``,
        ``seq_parallel``, ``dp_overlap``, ``flash_attention``, and ``cp``, ``ep``, ``cp_kind``,
        ``fp8``, ``schedule``, ``dist_opt``, ``tp_overlap``, ``master``, 2D TP ``tp_c`` and
        ``tp2d_kind``, ``fused_layers``, hybrid sharding ``shard``, torch.compile ``compiled``
        (codes as in :class:`calib.analytic.predict.Plan`).
        """
        from calib.analytic.formulas import recompute_code
        from calib.analytic.predict import predict as run_predict

        unknown = sorted(set(plan) - set(Plan.__dataclass_fields__))
        if unknown:
            raise InputError(
                unknown[0], f"not a strategy field (known: {', '.join(Plan.__dataclass_fields__)})"
            )
        spec = _model(model)
        machine, notes = self.machine(hardware)
        counts = [gpus] if isinstance(gpus, int) else list(gpus)
        plan, fnotes = stack_defaults(plan, spec, machine.hw)  # analytic.vdefaults, said in notes
        result = run_predict(spec, machine, counts, Plan(recompute=recompute_code(recompute), **plan))
        return replace(result, notes=notes + fnotes + result.notes)

    def search(
        self,
        model: str | ModelSpec,
        gpus: int | Sequence[int],
        *,
        global_batch: int | None = None,
        top: int = 10,
        hardware: str | HardwareSpec | None = None,
        objective: str = "time",
        dtype: str = "bf16",
        power: str | Path | None = None,
        compiled: bool = False,
        **space: Any,
    ) -> SearchResult:
        """Every valid strategy on ``gpus``, ranked by ``objective`` (time, energy or cost;
        ``space``: :class:`Space` fields; ``compiled``: torch.compile'd training, the device
        model's compiled family)."""
        from calib.analytic.device_path import compiled_view
        from calib.analytic.formulas import RECOMPUTE_NAMES
        from calib.analytic.search import search as run_search

        spec = _model(model)
        batch = global_batch or spec.global_batch
        if batch is None:
            raise InputError("global_batch", f"model {spec.label} has no default global batch; give one")
        machine, _ = self.machine(hardware)
        machine, _ = compiled_view(machine, spec, compiled)
        space["flash_attention"], fnotes = attention_default(space.get("flash_attention"), spec, machine.hw)
        pw = None
        if objective == "energy":
            from calib.commands.energy_cli import power_spec

            pw = power_spec(machine.hw, None, None, dtype, str(power) if power else None)
        res = run_search(spec, machine, gpus, batch, Space(**space), top, objective=objective, power=pw)

        def named(df):
            from calib.analytic.bubble import SCHEDULES

            if df.empty:
                return df
            return df.assign(recompute=[RECOMPUTE_NAMES[i] for i in df["recompute"]],
                             schedule=[SCHEDULES[i] for i in df["schedule"]])  # fmt: skip

        return replace(
            res, top=named(res.top), best_per_gpus=named(res.best_per_gpus), notes=(*fnotes, *res.notes)
        )

    def validate(self, table: str | Path, **options: Any) -> Validation:
        """:func:`validate` with this model's machine for every row."""
        return validate(table, model=self, **options)

    def report(self, out: str | Path, **options: Any) -> Path:
        """:func:`report` of this model (and ``runs``, ``predict`` ...)."""
        return report(out, model=self, **options)


def validate(
    table: str | Path,
    *,
    model: SystemModel | None = None,
    fmt: str = "auto",
    calibrate_on: str | None = None,
    holdout: float | None = None,
    loo: bool = False,
    fit: str = "network",
    seed: int = 0,
    override_hardware: bool = False,
) -> Validation:
    """Predict every row of a measured table (canonical or published) and report errors on
    the held-out rows; without ``model`` each row's ``hardware`` column names the machine.
    A ``model`` whose hardware disagrees with that column is refused unless
    ``override_hardware`` (then each row's ``hardware_override`` records it)."""
    from calib.analytic.validate import hardware_conflicts
    from calib.analytic.validate import validate as run_validate
    from calib.analytic.vtable import read_table
    from calib.core.bundled import table_or_published

    table = table_or_published(table)
    df, _ = read_table(str(table), fmt)
    base = model.machine()[0] if model is not None else None
    if base is not None and not override_hardware and hardware_conflicts(df, base):
        named = ", ".join(f"'{h}' ({n} rows)" for h, n in hardware_conflicts(df, base).items())
        raise InputError(
            "model",
            f"the table's hardware column says {named} but the model's machine is '{base.hw.name}'; "
            "pass override_hardware=True to model every row on it",
        )
    return run_validate(df, str(table), base, calibrate_on, holdout, loo, fit, seed)


def report(
    out: str | Path,
    *,
    runs: Sequence[Run | str | Path] = (),
    model: SystemModel | None = None,
    system: str | None = None,
    calibration: str | Path | None = None,
    predict: str | PredictSpec | None = None,
    store: str | Path | None = None,
    title: str | None = None,
    step: Callable[[str], None] = lambda name: None,
) -> Path:
    """Write the HTML/PNG/CSV/Markdown report into the directory ``out``; return the HTML's path.

    ``predict``: a spec file, 'default', 'none' or a :class:`PredictSpec` (default: the
    default spec when there is a calibration)."""
    from calib.report_data import predictions
    from calib.reports.build import make_report, resolve_spec, write_report

    given = [r for r in runs if isinstance(r, Run)]
    names = [r for r in runs if not isinstance(r, Run)]
    if model is not None:
        cal = model._fitted()
        base = gather(names, store, None, None)
        series, note = measured_series(cal, store_path(store))
        inputs = Inputs(base.runs, cal.system, cal, model.path_, store_path(store), series,
                        base.notes + ((note,) if note else ()))  # fmt: skip
    else:
        inputs = gather(names, store, system, calibration)
    if given:
        inputs = replace(inputs, runs=tuple(given) + inputs.runs)
    spec = predict if isinstance(predict, PredictSpec) else resolve_spec(predict, inputs)
    pred = predictions(inputs, spec, step) if spec is not None and not spec.empty else None
    return write_report(make_report(inputs, spec, pred, title, step), Path(out))


def demo(out: str | Path, fixtures: str | Path | None = None, echo: Callable[[str], None] = print) -> Path:
    """The whole pipeline on the bundled fixtures, in a store of its own under ``out``."""
    from calib.demo_pipeline import run_demo

    return run_demo(Path(out), Path(fixtures) if fixtures else None, echo=echo)
