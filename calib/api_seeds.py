"""The seed-experiment part of the public API: energy and DVFS (seed 003), placement on NVLink
domains (seed 002), offload (seeds 000/001) and the power fit.  Mixed into
:class:`calib.api.SystemModel`; see docs/energy.md and docs/seeds.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from calib.analytic.predict import Plan, Prediction
from calib.analytic.search import Space
from calib.analytic.specs import HardwareSpec, ModelSpec
from calib.core.errors import InputError
from calib.resolve import stack_defaults


def _model(model):
    from calib.api import _model as resolve

    return resolve(model)


class SeedsMixin:
    """Methods that need ``self.predict`` and ``self.machine`` of a SystemModel."""

    def energy(
        self,
        model: str | ModelSpec,
        gpus: int | Sequence[int],
        *,
        tokens: float | None = None,
        price_per_gpu_hour: float | None = None,
        dtype: str = "bf16",
        power: str | Path | None = None,
        hardware: str | HardwareSpec | None = None,
        recompute: str = "none",
        **plan: Any,
    ) -> Prediction:
        """:meth:`predict` with energy and power per iteration, the DVFS-optimal clock and, with
        ``tokens``, energy, time, GPU-hours and cost to solution (``calib predict --energy``).
        ``power``: a ``calib fit --power`` JSON; default datasheet values (status default)."""
        from calib.analytic.formulas import recompute_code
        from calib.commands.energy_cli import add_energy

        result = self.predict(model, gpus, hardware=hardware, recompute=recompute, **plan)
        machine, _ = self.machine(hardware)
        plan, _ = stack_defaults(plan, _model(model), machine.hw)  # as predict settled them
        p = Plan(recompute=recompute_code(recompute), **plan)
        out, notes = add_energy(_model(model), machine, result, p, None, None, tokens, price_per_gpu_hour,
                                dtype, str(power) if power else None)  # fmt: skip
        return replace(out, notes=result.notes + notes)

    def dvfs_curve(
        self, model: str | ModelSpec, gpus: int, *, dtype: str = "bf16", power: str | Path | None = None,
        hardware: str | HardwareSpec | None = None, recompute: str = "none", **plan: Any,
    ) -> Any:  # fmt: skip
        """Seed 003's trade-off for one configuration: SM clock (MHz) against time, energy, power."""
        import pandas as pd

        from calib.analytic.energy import dvfs_curve, energy_of_table
        from calib.analytic.formulas import recompute_code
        from calib.commands.energy_cli import power_spec

        result = self.predict(model, [gpus], hardware=hardware, recompute=recompute, **plan)
        machine, _ = self.machine(hardware)
        plan, _ = stack_defaults(plan, _model(model), machine.hw)  # as predict settled them
        pw = power_spec(machine.hw, None, None, dtype, str(power) if power else None)
        _, w = energy_of_table(
            _model(model), machine, result.table, Plan(recompute=recompute_code(recompute), **plan), pw
        )
        return pd.DataFrame(dvfs_curve(pw, w))

    def search_placement(
        self, model: str | ModelSpec, gpus: int | Sequence[int], nvlink_domain: int, *,
        global_batch: int | None = None, top: int = 10, hardware: str | HardwareSpec | None = None, **space: Any,
    ) -> Any:  # fmt: skip
        """The search with placement on NVLink domains of ``nvlink_domain`` GPUs as an axis (seed 002;
        ``calib search --nvlink-domain``): a table ranked by the placed iteration time."""
        from calib.analytic.placement import placement_search

        spec = _model(model)
        batch = global_batch or spec.global_batch
        if batch is None:
            raise InputError("global_batch", f"model {spec.label} has no default global batch; give one")
        machine, _ = self.machine(hardware)
        return placement_search(spec, machine, gpus, batch, Space(**space), nvlink_domain, top)

    def search_offload(
        self, model: str | ModelSpec, gpus: int | Sequence[int], offload_gbps: float, offload_gb: float = 1024.0,
        *, global_batch: int | None = None, top: int = 10, hardware: str | HardwareSpec | None = None, **space: Any,
    ) -> Any:  # fmt: skip
        """The search with weight / activation / optimizer offload as axes (seeds 000/001;
        ``calib search --offload-gbps``): a table ranked by time with exposed offload traffic."""
        from calib.analytic.offload import offload_search

        spec = _model(model)
        batch = global_batch or spec.global_batch
        if batch is None:
            raise InputError("global_batch", f"model {spec.label} has no default global batch; give one")
        machine, _ = self.machine(hardware)
        hw = replace(machine.hw, offload_gb=offload_gb, offload_gbps=offload_gbps)
        return offload_search(spec, replace(machine, hw=hw), gpus, batch, Space(**space), top)[0]


def fit_power(samples: str | Path, out: str | Path) -> dict:
    """Static and dynamic GPU power from NVML samples (``calib fit --power``); writes ``out`` (JSON)."""
    import json

    from calib.commands.energy_cli import fit_power as run

    run("power", None, out, samples)
    return json.loads(Path(out).read_text())
