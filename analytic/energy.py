"""Energy and power of a training iteration, and the DVFS trade-off (seed 003).

Seed 003 ("energy is additive"): P = f_ops * (e_op + e_mem * mem/ops) plus time-proportional
static power.  Per GPU and iteration, at SM-clock scale s = f / f_max:

    t(s)  = (t_compute / s + t_memory) * (1 + bubble / busy) + t_fixed
    E(s)  = P_static * t(s) + P_overhead * s v(s)^2 * busy(s) + FLOPs * e_flop * v(s)^2 + HBM bits * e_bit
    busy(s) = t_compute / s + t_memory,  v(s) = v_min + (1 - v_min) (s - s_min) / (1 - s_min)

(voltage rises linearly with the clock over the DVFS range, V(f_min) = v_min V(f_max)).
``t_compute`` is the compute-bound busy time (scales 1/f), ``t_memory`` the HBM-bound part
(the HBM clock is fixed, seed 003), the bubble follows the stage time, and ``t_fixed``
(exposed communication, host issue) does not depend on the SM clock.  Dynamic energy per
FLOP ~ C V^2 is frequency-independent at fixed V (seed 003 "idealized frequency
independence"); the V(f)^2 tax at high clocks and static power at low clocks make E(s)
U-shaped, and the clock/control overhead (f V^2 while the clock runs, seed 003's second
deviation) burns power in memory-bound kernels that a faster clock does not speed up, which
moves the optimum down for memory-heavy (long-sequence) layers (seed 003 observation 3).  The power cap bounds the busy power: the highest clock whose busy power stays
under the cap is the one the device runs at (throttling).  Effective dynamic energy per FLOP
is seed 003's TDP / peak with static and overhead power taken out:
(1 - overhead_fraction) (cap - static) / peak(dtype), so that a GPU at peak draws its cap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

import numpy as np
import yaml
from calib.analytic import formulas as F
from calib.analytic.specs import DATA_DIR, HardwareSpec
from calib.analytic.timemodel import (
    ADAM_STEP_BYTES_PER_PARAM,
    attention_proj_params,
    shape_terms,
    stage_params,
)

from calib.core.errors import InputError

ENERGY_FILE = DATA_DIR / "energy.yaml"
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
SOURCED, DEFAULT, DERIVED, FITTED = "sourced", "default", "derived", "fitted"
WEIGHT_PASSES = 3.0  # weight reads per micro-batch: forward, backward (data and weight gradients)
BYTES_WEIGHT = 2.0
OBJECTIVES = ("time", "energy", "cost")


#: the source of f_max when a device states no clock range (clocks relative to the top one)
RELATIVE_CLOCK = "default: no clock range for this device"


@dataclass(frozen=True)
class Quantity:
    """One number with its status (sourced, default, derived, fitted), source and standard error."""

    value: float
    status: str
    source: str
    stderr: float = float("nan")


@dataclass(frozen=True)
class PowerSpec:
    """Per-GPU power data: cap, static power, energy per FLOP (one dtype) and per HBM bit, DVFS range."""

    device: str
    dtype: str
    power_cap_w: Quantity
    static_w: Quantity
    pj_per_flop: Quantity  # dynamic, effective (at f_max)
    overhead_w: Quantity  # clock/control power at f_max while busy
    pj_per_bit_hbm: Quantity
    peak_tflops: Quantity
    f_max_mhz: Quantity
    f_min_mhz: Quantity
    f_step_mhz: float
    v_floor_ratio: Quantity
    pj_per_flop_theory: Quantity | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def clock_mhz_known(self) -> bool:
        """False when the device states no clock range: clocks are then fractions of the top one."""
        return not self.f_max_mhz.source.startswith(RELATIVE_CLOCK)

    @property
    def pj_per_flop_tdp(self) -> float:
        """Seed 003's 'A100 pJ/OP' column: cap / peak (static included)."""
        return self.power_cap_w.value / self.peak_tflops.value

    def scales(self) -> np.ndarray:
        """Clock scales s = f / f_max of the DVFS range (the device's steps, at most 200 points)."""
        fmax, fmin = self.f_max_mhz.value, self.f_min_mhz.value
        n = int(round((fmax - fmin) / self.f_step_mhz)) + 1 if self.f_step_mhz > 0 else 100
        return np.linspace(fmin / fmax, 1.0, int(min(max(n, 2), 200)))

    def voltage(self, s: np.ndarray) -> np.ndarray:
        """V(f) / V(f_max): linear from v_min at the lowest clock to 1 at the highest."""
        s_min = self.f_min_mhz.value / self.f_max_mhz.value
        v0 = self.v_floor_ratio.value
        return v0 + (1.0 - v0) * np.clip((np.asarray(s) - s_min) / max(1.0 - s_min, 1e-9), 0.0, 1.0)

    def rows(self) -> list[tuple[str, float, str, str, float]]:
        """(name, value, status, source, standard error) for display."""
        out = [
            ("power_cap_w", self.power_cap_w),
            ("static_w", self.static_w),
            ("overhead_w", self.overhead_w),
            (f"pj_per_flop_{self.dtype}", self.pj_per_flop),
            ("pj_per_bit_hbm", self.pj_per_bit_hbm),
            (f"peak_tflops_{self.dtype}", self.peak_tflops),
            ("f_max_mhz", self.f_max_mhz),
            ("f_min_mhz", self.f_min_mhz),
            ("v_floor_ratio", self.v_floor_ratio),
        ]
        return [(n, q.value, q.status, q.source, q.stderr) for n, q in out]


def _q(entry, where: str) -> Quantity:
    if not isinstance(entry, dict) or "value" not in entry:
        raise InputError(where, "expected a mapping {value, status, source}")
    v = entry["value"]
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
        raise InputError(where, f"value must be a positive number, got {v!r}")
    return Quantity(float(v), str(entry.get("status", DEFAULT)), str(entry.get("source", "")))


@cache
def _data() -> dict:
    try:
        return yaml.safe_load(ENERGY_FILE.read_text())
    except (OSError, yaml.YAMLError) as exc:  # pragma: no cover - shipped file
        raise InputError(ENERGY_FILE, f"unreadable: {exc}") from None


def device_entry(device: str) -> tuple[str, dict] | None:
    """The energy.yaml entry whose ``match`` strings occur in ``device`` (case-insensitive)."""
    key = "".join(ch for ch in (device or "").lower() if ch.isalnum())
    for name, entry in _data()["devices"].items():
        if any(m.lower() in key for m in entry["match"]):
            return name, entry
    return None


def load_power(hw: HardwareSpec, dtype: str = "bf16", fitted: dict | None = None) -> PowerSpec:
    """The power data of ``hw``'s device: energy.yaml, then a ``calib fit`` power result on top."""
    if dtype not in DTYPES:
        raise InputError("dtype", f"'{dtype}' is not one of {', '.join(DTYPES)}")
    found = device_entry(hw.device)
    if found is None:
        raise InputError(
            "hardware",
            f"no power data for device '{hw.device}' in {ENERGY_FILE.name} (devices: "
            f"{', '.join(_data()['devices'])}); fit one from power samples",
        )
    name, e = found
    where = f"{ENERGY_FILE.name} {name}"
    d = _data()["defaults"]
    cap = _q(e["power_cap_w"], f"{where} power_cap_w")
    peaks = e.get("peak_tflops", {})
    if dtype in peaks:
        peak = _q(peaks[dtype], f"{where} peak_tflops {dtype}")
    elif dtype in ("bf16", "fp16"):
        peak = Quantity(hw.peak_tflops, SOURCED, f"hardware spec {hw.name} peak_tflops ({hw.source[:60]})")
    else:
        raise InputError(
            "dtype", f"no {dtype} peak for {name} in {ENERGY_FILE.name} (has {', '.join(peaks)})"
        )
    frac = _q(d["static_fraction_of_cap"], "static_fraction_of_cap")
    static = Quantity(cap.value * frac.value, DEFAULT, f"{frac.source} (cap {cap.value:g} W)")
    if "static_w" in e:
        static = _q(e["static_w"], f"{where} static_w")
    fmax = _q(e["f_max_mhz"], f"{where} f_max_mhz") if "f_max_mhz" in e else Quantity(
        1.0, DEFAULT, RELATIVE_CLOCK + "; frequencies are relative (1 = highest)")  # fmt: skip
    fr = _q(d["f_min_ratio"], "f_min_ratio")
    fmin = _q(e["f_min_mhz"], f"{where} f_min_mhz") if "f_min_mhz" in e else Quantity(
        fmax.value * fr.value, DEFAULT, fr.source)  # fmt: skip
    step = float(e.get("f_step_mhz", {}).get("value", 0.0))
    phi = _q(d["overhead_fraction"], "overhead_fraction")
    theory = e.get("pj_per_flop_theory", {}).get(dtype)
    notes: list[str] = []
    if fitted:
        static = Quantity(fitted["static_w"]["value"], FITTED, fitted.get("source", "power samples"),
                          fitted["static_w"].get("stderr", float("nan")))  # fmt: skip
        dyn = fitted["dynamic_w"]
        pj = Quantity((1 - phi.value) * dyn["value"] / peak.value, FITTED,
                      f"(1 - overhead_fraction) x fitted dynamic power at full load {dyn['value']:.1f} W / peak {peak.value:g} TFLOP/s",
                      (1 - phi.value) * dyn.get("stderr", float("nan")) / peak.value)  # fmt: skip
        ovh = Quantity(
            phi.value * dyn["value"], DERIVED, f"overhead_fraction x fitted dynamic power; {phi.source}"
        )
        notes.append(f"power fitted from {fitted.get('n_samples', '?')} samples ({fitted.get('source', '')})")
    else:
        pj = Quantity((1 - phi.value) * (cap.value - static.value) / peak.value, DERIVED,
                      "(1 - overhead_fraction) (power_cap_w - static_w) / peak_tflops: seed 003's TDP / peak method")  # fmt: skip
        ovh = Quantity(phi.value * (cap.value - static.value), DERIVED,
                       f"overhead_fraction x (power_cap_w - static_w); {phi.source}")  # fmt: skip
        notes.append(
            f"power: datasheet values for {name} (status default where no source; no power samples fitted)"
        )
    return PowerSpec(
        device=hw.device, dtype=dtype, power_cap_w=cap, static_w=static, pj_per_flop=pj, overhead_w=ovh,
        pj_per_bit_hbm=_q(e["pj_per_bit_hbm"], f"{where} pj_per_bit_hbm"), peak_tflops=peak,
        f_max_mhz=fmax, f_min_mhz=fmin, f_step_mhz=step, v_floor_ratio=_q(d["v_floor_ratio"], "v_floor_ratio"),
        pj_per_flop_theory=_q(theory, f"{where} theory") if theory else None, notes=tuple(notes),
    )  # fmt: skip


@dataclass(frozen=True)
class Work:
    """Per GPU and iteration: FLOPs, HBM bytes, and how the time splits by what bounds it."""

    flops: np.ndarray
    hbm_bytes: np.ndarray
    t_compute_s: np.ndarray  # compute-bound busy time at f_max (scales 1 / f)
    t_memory_s: np.ndarray  # HBM-bound busy time (HBM clock fixed)
    bubble_factor: np.ndarray  # (busy + bubble) / busy: the bubble follows the stage time
    t_fixed_s: np.ndarray  # exposed communication and host time (independent of f)
    #: GEMM efficiency at f_max (roofline, seed 003 "Perf(f) saturates"): the compute-bound time
    #: is max(e t_compute / s, t_compute) -- a kernel at e < 1 of peak is held by a floor that the
    #: SM clock does not move (HBM fixed) down to s = e; 1 = time scales as 1 / f all the way
    compute_eff: np.ndarray | float = 1.0


def work_of(model, system, st, r: dict) -> Work:
    """Split an :func:`~calib.analytic.timemodel.evaluate` result into clock-bound parts."""
    d, L, a, s, V = (np.asarray(x, dtype=float) for x in (model.d_model, model.n_layers, model.n_heads,
                                                          model.seq_len, model.vocab))  # fmt: skip
    t, p, dp, b = (x.astype(float) for x in (st.tp, st.pp, st.dp, st.micro_batch))
    m = st.global_batch / (dp * b)
    ffn, kv, mats, tied = shape_terms(model)
    from calib.analytic.tp2d import weight_split

    aw = attention_proj_params(model)  # attention projection weights per layer (MLA: low rank)
    params = stage_params(d, L, s, V, weight_split(t, st.tp_c, st.tp2d_kind), p, ffn, kv, mats, tied, aw)
    opt_params = params / np.where(st.zero >= 1, dp, 1.0)
    s_loc = s / np.asarray(st.cp, dtype=float)  # a GPU's tokens under context parallelism
    vec = F.vector_traffic_bytes_layer(b, s_loc, d, a, t, st.seq_parallel, st.recompute, st.flash_attention,
                                       system.vector_passes)  # fmt: skip
    hbm = (
        m * (L / p) * vec + m * WEIGHT_PASSES * BYTES_WEIGHT * params + ADAM_STEP_BYTES_PER_PARAM * opt_params
    )
    flops = r["hw_tflops_per_gpu"] * 1e12 * r["iter_s"]
    busy = r["compute_s"] + r["optimizer_s"]
    t_mem = np.minimum(busy, hbm / (system.hw.hbm_tbps * 1e12))
    bubble_factor = 1.0 + r["bubble_s"] / np.maximum(busy, 1e-30)
    fixed = np.maximum(0.0, r["iter_s"] - busy - r["bubble_s"])
    eff = np.clip(np.asarray(r.get("gemm_efficiency", 1.0), dtype=float), 1e-3, 1.0)
    return Work(flops, hbm, busy - t_mem, t_mem, bubble_factor, fixed, eff)


def busy_at(w: Work, s, ex=np.asarray) -> np.ndarray:
    """Busy time at clock scale s: compute-bound work on the roofline max(e t_c / s, t_c) (the SM
    clock only matters once the clock-scaled roof drops below the floor the kernels hit at f_max)
    plus the HBM-bound time (HBM clock fixed, seed 003)."""
    tc = ex(w.t_compute_s)
    return np.maximum(ex(w.compute_eff) * tc / s, tc) + ex(w.t_memory_s)


def at_scales(
    power: PowerSpec, w: Work, scales: np.ndarray, elementwise: bool = False
) -> dict[str, np.ndarray]:
    """Time, energy and power per GPU and iteration at each clock scale (a new last axis), or
    with ``elementwise`` at one scale per configuration (``scales`` broadcasts with ``w``)."""
    s = np.asarray(scales, dtype=float)
    ex = (
        (lambda x: np.asarray(x, dtype=float)[..., None])
        if s.ndim and not elementwise
        else (lambda x: np.asarray(x, dtype=float))
    )
    busy = busy_at(w, s, ex)
    time_s = busy * ex(w.bubble_factor) + ex(w.t_fixed_s)
    v = power.voltage(s)
    e_flop = ex(w.flops) * power.pj_per_flop.value * 1e-12 * v * v
    e_mem = ex(w.hbm_bytes) * 8.0 * power.pj_per_bit_hbm.value * 1e-12
    e_static = power.static_w.value * time_s
    e_ovh = power.overhead_w.value * s * v * v * busy
    busy_w = power.static_w.value + (e_ovh + e_flop + e_mem) / np.maximum(busy, 1e-30)
    energy = e_static + e_ovh + e_flop + e_mem
    e_flop, e_mem = (np.broadcast_to(x, energy.shape) for x in (e_flop, e_mem))
    return {"time_s": time_s, "energy_j": energy, "power_w": energy / np.maximum(time_s, 1e-30),
            "busy_power_w": busy_w, "energy_static_j": e_static, "energy_overhead_j": e_ovh,
            "energy_flop_j": e_flop, "energy_hbm_j": e_mem}  # fmt: skip


def energy_columns(
    power: PowerSpec, w: Work, gpus: np.ndarray, tokens_per_iter: np.ndarray,
    tokens: float | None = None, price_per_gpu_hour: float | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Energy per iteration at the capped top clock, the energy-optimal clock, and to-solution totals."""
    sc = power.scales()
    g = at_scales(power, w, sc)
    ok = g["busy_power_w"] <= power.power_cap_w.value * (1 + 1e-9)
    # the highest clock under the cap (the lowest one if none is: the cap cannot be met)
    top = np.where(ok.any(axis=-1), sc.size - 1 - np.argmax(ok[..., ::-1], axis=-1), 0)
    e_opt_all = np.where(ok, g["energy_j"], np.inf)
    best = np.argmin(e_opt_all, axis=-1)

    def pick(k, idx):
        return np.take_along_axis(g[k], idx[..., None], axis=-1)[..., 0]

    gpus = np.asarray(gpus, dtype=float)
    out = {
        "clock_scale": sc[top], "throttled": top < sc.size - 1,
        "power_w_per_gpu": pick("power_w", top), "energy_j_per_gpu": pick("energy_j", top),
        "energy_kj_per_iter": gpus * pick("energy_j", top) / 1e3, "time_s_at_clock": pick("time_s", top),
        "f_opt_mhz": sc[best] * power.f_max_mhz.value, "energy_kj_per_iter_opt": gpus * pick("energy_j", best) / 1e3,
        "time_s_opt": pick("time_s", best), "f_opt_scale": sc[best],
    }  # fmt: skip
    # seed 003's 'fastest Pareto-optimal' point: the lowest clock under the cap with the top's time
    fast = np.where(ok & (g["time_s"] <= pick("time_s", top)[..., None] * (1 + 1e-9)), g["energy_j"], np.inf)
    kf = np.argmin(fast, axis=-1)
    out["f_fastest_mhz"] = sc[kf] * power.f_max_mhz.value
    out["energy_saving_vs_fastest"] = 1.0 - pick("energy_j", best) / pick("energy_j", kf)
    out["energy_saving_opt"] = 1.0 - out["energy_kj_per_iter_opt"] / out["energy_kj_per_iter"]
    out["slowdown_opt"] = out["time_s_opt"] / out["time_s_at_clock"] - 1.0
    out["energy_j_per_token"] = out["energy_kj_per_iter"] * 1e3 / tokens_per_iter
    if tokens is not None:
        iters = tokens / np.asarray(tokens_per_iter, dtype=float)
        out["iterations"] = iters
        out["time_to_solution_h"] = iters * out["time_s_at_clock"] / 3600.0
        out["gpu_hours"] = out["time_to_solution_h"] * gpus
        out["energy_to_solution_mwh"] = iters * out["energy_kj_per_iter"] / 3.6e6
        if price_per_gpu_hour is not None:
            out["cost"] = out["gpu_hours"] * price_per_gpu_hour
    return out


def dvfs_curve(power: PowerSpec, w: Work) -> dict[str, np.ndarray]:
    """Seed 003's trade-off curve for one configuration: SM clock against time, energy, power."""
    sc = power.scales()
    g = at_scales(power, w, sc)
    return {"f_mhz": sc * power.f_max_mhz.value, **{k: np.asarray(v).reshape(-1) for k, v in g.items()}}


def capped(power: PowerSpec, w: Work, steps: int = 16) -> dict[str, np.ndarray]:
    """Time and energy at the highest clock whose busy power stays under the cap (bisection on
    the clock, vectorised: the busy power rises with the clock)."""
    cap = power.power_cap_w.value
    top = at_scales(power, w, np.float64(1.0))
    over = top["busy_power_w"] > cap
    if not np.any(over):
        return top
    lo = np.full(np.shape(over), power.f_min_mhz.value / power.f_max_mhz.value)
    hi = np.ones(np.shape(over))
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        ok = at_scales(power, w, mid, elementwise=True)["busy_power_w"] <= cap
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return at_scales(power, w, np.where(over, lo, 1.0), elementwise=True)


def objective_values(objective: str, power: PowerSpec | None, w: Work | None, r: dict, gpus, tokens_per_iter):
    """The search's ranking key: seconds per iteration, joules per token or GPU-seconds per token."""
    if objective == "time":
        return r["iter_s"]
    if objective == "cost":
        return np.asarray(gpus, dtype=float) * r["iter_s"] / tokens_per_iter
    if objective == "energy":
        return np.asarray(gpus, dtype=float) * capped(power, w)["energy_j"] / tokens_per_iter
    raise InputError("objective", f"'{objective}' is not one of {', '.join(OBJECTIVES)}")


def energy_of_table(model, system, table, plan, power: PowerSpec, tokens=None, price_per_gpu_hour=None):
    """Energy columns for a :func:`~calib.analytic.predict.predict` table (one row per GPU count)."""
    from calib.analytic.strategy import Strategies
    from calib.analytic.timemodel import evaluate

    st = Strategies.of(
        tp=table["tp"].to_numpy(), pp=table["pp"].to_numpy(), dp=table["dp"].to_numpy(),
        micro_batch=table["micro_batch"].to_numpy(), global_batch=table["global_batch"].to_numpy(),
        interleave=plan.interleave, zero=plan.zero, recompute=plan.recompute, seq_parallel=plan.seq_parallel,
        dp_overlap=plan.dp_overlap, flash_attention=plan.flash_attention,
        # the whole plan: the energy model times the same strategy as the time model
        cp=plan.cp, ep=plan.ep, cp_kind=plan.cp_kind, fp8=plan.fp8, schedule=plan.schedule,
        dist_opt=plan.dist_opt, tp_overlap=plan.tp_overlap, master=plan.master,
    )  # fmt: skip
    r = evaluate(model, system, st)
    w = work_of(model, system, st, r)
    tok = table["global_batch"].to_numpy(dtype=float) * model.seq_len
    cols = energy_columns(power, w, st.gpus, tok, tokens, price_per_gpu_hour)
    cols.update(fitted_band(power, w, st.gpus, cols["clock_scale"]))
    return cols, w


def fitted_band(power: PowerSpec, w: Work, gpus, scale) -> dict[str, np.ndarray]:
    """Energy per iteration with the fitted static power and energy per FLOP at -1 and +1
    standard error (together: the band the power fit's uncertainty spans); empty unless fitted."""
    from dataclasses import replace

    q = (power.static_w, power.pj_per_flop)
    if not all(np.isfinite(x.stderr) for x in q):
        return {}
    out = {}
    for k, sign in (("lo", -1.0), ("hi", 1.0)):
        p = replace(power, static_w=replace(q[0], value=max(0.0, q[0].value + sign * q[0].stderr)),
                    pj_per_flop=replace(q[1], value=max(0.0, q[1].value + sign * q[1].stderr)))  # fmt: skip
        e = np.array(
            [
                at_scales(p, _row(w, i), np.float64(sc))["energy_j"]
                for i, sc in enumerate(np.atleast_1d(scale))
            ]
        )
        out[f"energy_kj_per_iter_{k}"] = np.asarray(gpus, dtype=float) * e.reshape(-1) / 1e3
    return out


def _row(w: Work, i: int) -> Work:
    return Work(*(np.atleast_1d(np.asarray(x, dtype=float))[min(i, np.size(x) - 1)] for x in (
        w.flops, w.hbm_bytes, w.t_compute_s, w.t_memory_s, w.bubble_factor, w.t_fixed_s, w.compute_eff)))  # fmt: skip
