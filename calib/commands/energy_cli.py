"""Energy options shared by ``calib predict --energy``, ``calib search --objective`` and ``calib fit --power``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from calib.core.errors import InputError
from calib.core.store import default_store, system_dir

ENERGY_COLUMNS = {
    "gpus": "GPUs", "clock_scale": "clock", "power_w_per_gpu": "W/GPU", "energy_kj_per_iter": "kJ/iter",
    "energy_j_per_token": "J/token", "f_opt_mhz": "opt MHz", "energy_saving_opt": "saving@opt",
    "slowdown_opt": "slowdown@opt",
}  # fmt: skip
SOLUTION_COLUMNS = {
    "gpus": "GPUs", "time_to_solution_h": "hours", "gpu_hours": "GPU-hours",
    "energy_to_solution_mwh": "MWh", "cost": "cost",
}  # fmt: skip


def power_path(store: str | Path | None, system: str) -> Path:
    return system_dir(Path(store or default_store()), system) / f"{system}.power.json"


def read_power_fit(path: str | Path) -> dict:
    """A ``calib fit --power`` result; one-line InputError naming the file when it is not one."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(p, "no such file") from None
    except (OSError, ValueError) as exc:
        raise InputError(p, f"not a power fit JSON: {exc}") from None
    for k in ("static_w", "dynamic_w"):
        v = data.get(k).get("value") if isinstance(data.get(k), dict) else None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
            raise InputError(
                p, f"field {k} must be {{value, stderr}} with a finite value >= 0 (calib fit --power)"
            )
    return data


def power_spec(hw, system: str | None, store, dtype: str, power_file: str | None):
    """The power data: the given fit, else the system's stored fit, else datasheet values."""
    from calib.analytic.energy import load_power

    fitted = None
    if power_file:
        fitted = read_power_fit(power_file)
    elif system and power_path(store, system).exists():
        fitted = read_power_fit(power_path(store, system))
    return load_power(hw, dtype, fitted)


def add_energy(model, machine, result, plan, system, store, tokens, price, dtype, power_file):
    """``result`` with the energy columns added, and notes on where the power numbers come from."""
    from dataclasses import replace

    from calib.analytic.energy import energy_of_table

    if tokens is not None and not 0 < tokens < float("inf"):
        raise InputError("tokens", f"must be a positive finite number, got {tokens}")
    if price is not None and (not 0 <= price < float("inf") or tokens is None):
        raise InputError("price_per_gpu_hour", "must be non-negative and given with a token budget")
    power = power_spec(machine.hw, system, store, dtype, power_file)
    cols, _ = energy_of_table(model, machine, result.table, plan, power, tokens, price)
    table = result.table.assign(**{k: np.broadcast_to(v, (len(result.table),)) for k, v in cols.items()})
    notes = list(power.notes)
    notes.append(
        "power: "
        + "; ".join(
            f"{n} {v:.4g}" + (f" +- {e:.2g}" if np.isfinite(e) else "") + f" ({st})"
            for n, v, st, _, e in power.rows()
            if n != "v_floor_ratio"
        )
    )

    if not power.clock_mhz_known:
        table = table.drop(columns=["f_opt_mhz", "f_fastest_mhz"])
        notes.append(relative_clock_note(machine.hw.device))
    if table["throttled"].any():
        notes.append("power cap: some configurations run below the top clock (busy power above the cap)")
    return replace(result, table=table), notes


def relative_clock_note(device: str) -> str:
    return (f"power: no SM clock range for {device} in energy.yaml: the energy-optimal clock is given as a "
            "fraction of the top clock (f_opt_scale, 'opt f/fmax'), not in MHz")  # fmt: skip


def energy_text(table: pd.DataFrame) -> str:
    cols = dict(ENERGY_COLUMNS)
    if "f_opt_mhz" not in table:  # the device states no clock range: the optimum relative to the top
        cols = {("f_opt_scale" if k == "f_opt_mhz" else k): ("opt f/fmax" if k == "f_opt_mhz" else v)
                for k, v in cols.items()}  # fmt: skip
    e = table[list(cols)].rename(columns=cols).copy()
    for c in ("saving@opt", "slowdown@opt"):
        e[c] = (e[c] * 100).round(1).astype(str) + "%"
    if "opt MHz" in e:
        e["opt MHz"] = e["opt MHz"].round(0)
    if "energy_kj_per_iter_lo" in table:  # the power fit's 1-sigma band
        lo, hi = table["energy_kj_per_iter_lo"], table["energy_kj_per_iter_hi"]
        e.insert(e.columns.get_loc("kJ/iter") + 1, "fit band", [f"{a:.4g}..{b:.4g}" for a, b in zip(lo, hi)])
    out = ["energy per iteration (all GPUs) at the top clock under the power cap; DVFS optimum", _ind(e)]
    if "time_to_solution_h" in table:
        cols = {k: v for k, v in SOLUTION_COLUMNS.items() if k in table}
        out += ["", "to solution", _ind(table[list(cols)].rename(columns=cols).round(3))]
    return "\n".join(out) + "\n"


def _ind(df: pd.DataFrame) -> str:
    return "\n".join(
        "  " + line for line in df.to_string(index=False, float_format=lambda v: f"{v:.4g}").splitlines()
    )


def fit_power(system: str, store, out, samples_file) -> str:
    """``calib fit --power``: static and dynamic power from NVML samples; the JSON path and a summary."""
    from calib.analytic.energy import load_power
    from calib.analytic.specs import hardware_for_device
    from calib.calibrate.power import fit_static_dynamic, read_power_samples
    from calib.core.atomic import write_text

    df, meta = read_power_samples(samples_file)
    device = meta.get("device", "")
    hw = hardware_for_device(device)
    if hw is None:
        raise InputError(samples_file, f"device '{device}' of the samples matches no hardware preset")
    spec = load_power(hw)
    s = df["sm_clock_mhz"].to_numpy() / spec.f_max_mhz.value
    activity = df["gpu_util_pct"].to_numpy() / 100.0 * s * spec.voltage(s) ** 2
    fit = fit_static_dynamic(df["power_w"].to_numpy(), activity, Path(samples_file).name)
    fit |= {"device": device, "model": "power = static + dynamic x util x (f/f_max) x V(f)^2",
            "f_max_mhz": spec.f_max_mhz.value, "v_floor_ratio": spec.v_floor_ratio.value}  # fmt: skip
    target = Path(out) if out else power_path(store, system)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text(target, json.dumps(fit, indent=2) + "\n")
    except OSError as exc:
        raise InputError(str(target), f"cannot write the power fit: {exc.strerror or exc}") from None
    st, dy = fit["static_w"], fit["dynamic_w"]
    return (
        f"power fit for {system} ({device}, {fit['n_samples']} samples, R^2 {fit['r2']:.4f}): "
        f"static {st['value']:.1f} +- {st['stderr']:.1f} W, dynamic at full load {dy['value']:.1f} +- "
        f"{dy['stderr']:.1f} W (fitted)\npower fit written to {target}"
    )


PLACED = [
    "rank",
    "gpus",
    "tp",
    "tp_c",
    "pp",
    "dp",
    "micro_batch",
    "interleave",
    "zero",
    "recompute",
    "iter_s",
]


def axis_search(
    model, machine, counts, B, space, top, domain, offload_gbps, offload_gb, as_json, notes
) -> str:
    """``calib search --nvlink-domain`` (placement axis) or ``--offload-gbps`` (offload knobs)."""
    from dataclasses import replace

    from calib.commands import output

    if domain and offload_gbps is not None:
        raise InputError("nvlink_domain", "give either a placement axis or an offload axis, not both")
    if domain:
        from calib.analytic.placement import placement_search

        df = placement_search(model, machine, counts, B, space, domain, top)
        cols = PLACED + ["placement", "comm_placed_s", "iter_placed_s"]
        a = df.attrs
        head = (f"placement on NVLink domains of {domain} GPUs (innermost group first), ranked by placed time: "
                f"{a.get('n_strategies', 0):,} strategies each under its best placement in {a.get('seconds', 0.0):.3f} s")  # fmt: skip
    else:
        from calib.analytic.offload import offload_search

        if offload_gbps < 0 or offload_gb < 0:
            raise InputError("offload_gbps", "offload bandwidth and capacity must be >= 0")
        hw = replace(machine.hw, offload_gb=offload_gb, offload_gbps=offload_gbps)
        df, n, fit = offload_search(model, replace(machine, hw=hw), counts, B, space, top)
        if not df.empty:
            df.insert(0, "rank", range(1, len(df) + 1))
        cols = PLACED + ["weight_offload", "activation_offload", "optimizer_offload", "tp_overlap", "tp_redo", "offload_exposed_s",
                         "iter_offload_s", "hbm_gb", "offload_gib", "offload_required_gbps"]  # fmt: skip
        head = (f"offload {offload_gb:g} GB per GPU at {offload_gbps:g} GB/s per direction: {n:,} strategies, "
                f"{fit:,} fit in HBM + offload memory")  # fmt: skip
    if as_json:
        return output.dumps({"notes": notes, "top": output.records(df)})
    if df.empty:
        return head + "\nno strategy fits\n"
    body = df[[c for c in cols if c in df]].to_string(index=False, float_format=lambda v: f"{v:.4g}")
    return "\n".join([head, _ind_text(body), *[f"note: {x}" for x in notes]]) + "\n"


def _ind_text(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def seeds_section(offload_results: Path | None):
    """``calib report --seeds``: the seed panels (the offload one from a benchmark JSON, if given)."""
    from calib.reports.fig_seeds import seeds_section as make

    data = None
    if offload_results is not None:
        try:
            data = json.loads(Path(offload_results).read_text())
            data["family"], data["bandwidth"]  # noqa: B018 - the fields the panel draws
        except FileNotFoundError:
            raise InputError(offload_results, "no such file") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(offload_results, f"not a seed001_offload.py JSON: {exc}") from None
    return make(data)
