#!/usr/bin/env python3
"""The grouped-GEMM law (calibrate.grouped_gemm): its constants refitted from the H100 kernel
timings, and how it does on the traced MoE runs it was never fitted to.

Split (written before the kernels were timed; fixtures/kernels/h100-grouped/SOURCE.txt):
  calibrate  the 1,940 grouped_mm kernels timed on one H100 (fixtures/kernels/h100-grouped);
  held out   every grouped expert GEMM of the traced MoE training runs (fixtures/traces/h100b,
             h200, h200b, h200c; and h100d, recorded after the fit, with 64-128 rows per expert): each run's traced grouped time over the device model's roofline
             of the same shapes ("one GEMM of the rows"), and over the roofline times the law.
             A law that carries the shapes leaves a ratio that varies less from run to run;
  held out   the same kernels timed on an H200 (fixtures/kernels/h200-grouped), with the H100's
             constants and the H200's datasheet; only the bare call's launch (a host cost) refitted.
Also printed, recorded and not used: FP8 grouped GEMMs (torch._scaled_grouped_mm) on the H100.

Usage: python benchmarks/grouped_gemm_law.py
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from calib.analytic.specs import load_hardware
from calib.calibrate import grouped_gemm as GG
from calib.calibrate.device_facts import facts
from calib.calibrate.device_moe import grouped_times

from calib.api import SystemModel, ingest_run, load_runs

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
#: (folder, GEMM bench, dense runs of the fit): each machine's MoE runs against its own dense fit
MACHINES = (("h100b", "h100", "h100", "h100-hf"), ("h200", "h200", "h200", "h200-hf"),
            ("h200b", "h200", "h200", "h200-hf"), ("h200c", "h200", "h200", "h200-hf"),
            ("h100d", "h100", "h100", "h100-hf"))  # fmt: skip
DENSE = ("g125m-b8", "g760m-b8", "g2p7b-b4", "g1p3b-s2k-b2", "llama-d1024-l16")


def kernels() -> pd.DataFrame:
    hw = load_hardware("h100")
    df = pd.read_csv(ROOT / "kernels" / "h100-grouped" / "grouped.csv.gz")
    return df.assign(peak_tflops=hw.peak_tflops, hbm_tbps=hw.hbm_tbps)


def refit(df: pd.DataFrame) -> None:
    law = GG.fit_law(df)
    print("calibrate: the H100 kernels (" + law["compute_fraction"].note + ")")
    shipped = {
        "compute_fraction": GG.COMPUTE_FRACTION,
        "stream_fraction": GG.STREAM_FRACTION,
        "smooth_p": GG.SMOOTH_P,
    }
    for name, p in law.items():
        ref = (
            f"  (shipped {shipped[name].value:.4g})"
            if name in shipped
            else "  (the bare call's launch, not a kernel's)"
        )
        print(f"  {name:18s} {p.value:.4g} +- {p.stderr:.2g}{ref}")
    t = df["grouped_s"].to_numpy(dtype=float)
    ok = np.isfinite(t)
    one = df["dense_s"].to_numpy(dtype=float)
    print(
        f"  one GEMM of the rows (torch.mm, same total shape): rms log error {np.sqrt(np.mean(np.log(one[ok] / t[ok]) ** 2)):.3f}"
    )
    me = df["routed_rows"] / df["experts"]
    ratio = (df["grouped_s"] / df["dense_s"]).groupby(me).median()
    print("  grouped / one GEMM, median by rows per expert: "
          + ", ".join(f"{int(m)}: {r:.2f}" for m, r in ratio.items()))  # fmt: skip


def held_out() -> None:
    print("\nheld out: traced grouped expert GEMMs, per run (time over the roofline; over roofline x law)")
    rows = []
    for folder, bench, dense_folder, system in MACHINES:
        store = Path(tempfile.mkdtemp(prefix="calib-grouped-"))
        try:
            for name in DENSE:
                ingest_run(ROOT / "traces" / dense_folder / "runs" / name, system=system, store=store)
            for b in (ROOT / "traces" / bench / "gemm-bench").iterdir():
                shutil.copytree(b, store / system / "runs" / b.name)
            dm = SystemModel().fit(load_runs(system=system, store=store)).device_model_
            for run_dir in sorted((ROOT / "traces" / folder / "runs").iterdir()):
                ingest_run(run_dir, system=system, store=store, name="moe-" + run_dir.name)
                (run,) = load_runs(["moe-" + run_dir.name], system=system, store=store, kind="trace")
                f = facts(run)
                g = f.gemms[f.gemms["grouped"].astype(bool)] if f is not None else None
                if g is None or g.empty or f.variant not in ("moe", "moe+mla"):
                    continue
                traced, roof, law = grouped_times(f, dm)
                rows.append((f"{folder}/{run_dir.name}", f.experts, traced / roof, traced / law))
        finally:
            shutil.rmtree(store, ignore_errors=True)
    for name, E, r0, r1 in rows:
        print(f"  {name:40s} E {E:3d}  {r0:.3f}  {r1:.3f}")
    # h100d was recorded after the law was fitted, for few rows per expert: shown apart
    for label, sel in (("earlier runs", [r for r in rows if not r[0].startswith("h100d/")]),
                       ("h100d (64-128 rows per expert)", [r for r in rows if r[0].startswith("h100d/")])):  # fmt: skip
        print(f"  {label}:")
        for i, what in ((2, "one GEMM of the rows"), (3, "roofline x law")):
            x = np.log([r[i] for r in sel])
            print(f"    traced over {what:20s}: geometric mean {np.exp(x.mean()):.3f}, sd(log) {x.std(ddof=1):.3f}, "
                  f"range {np.exp(x.min()):.3f}-{np.exp(x.max()):.3f} over {len(sel)} runs")  # fmt: skip


def on_h200() -> None:
    """Held out: the H100's constants on the same kernels timed on an H200, the launch refitted."""
    from scipy.optimize import least_squares

    hw = load_hardware("h200")
    g = pd.read_csv(ROOT / "kernels" / "h200-grouped" / "grouped.csv.gz")
    even = (g["split"] == "even").to_numpy()
    t = g["grouped_s"].to_numpy(dtype=float)
    print(
        f"\nheld out: the H100's law on {len(g)} kernels timed on an H200 ({hw.peak_tflops:g} TFLOP/s, {hw.hbm_tbps:g} TB/s)"
    )
    for label, hbm in (
        ("the H200's datasheet HBM", hw.hbm_tbps),
        ("the H100's HBM instead", load_hardware("h100").hbm_tbps),
    ):
        law = GG.group_time_s(g["experts"], g["routed_rows"], g["k"], g["n"], hw.peak_tflops, hbm, even=even)
        fit = least_squares(
            lambda x, law=law: np.log((x[0] * 1e-6 + law) / t), [40.0], bounds=([0.0], [200.0])
        )
        print(f"  {label:26s}: rms log error {np.sqrt(np.mean(fit.fun**2)):.3f} (launch {fit.x[0]:.1f} us)")
    print(
        f"  torch.mm on the same total shape: rms log error {np.sqrt(np.mean(np.log(g['dense_s'] / t) ** 2)):.3f}"
    )
    h100 = pd.read_csv(ROOT / "kernels" / "h100-grouped" / "grouped.csv.gz")
    both = h100.merge(
        g, on=["d", "f_e", "proj", "kind", "experts", "routed_rows", "split"], suffixes=("_100", "_200")
    )
    gain = (
        (both["grouped_s_100"] / both["grouped_s_200"])
        .groupby(both["routed_rows"] / both["experts"])
        .median()
    )
    print(
        "  H100 time over H200 time, median by rows per expert: "
        + ", ".join(f"{int(m)}: {r:.2f}" for m, r in gain.items())
    )


def fp8() -> None:
    """Recorded, not used: torch._scaled_grouped_mm (row-wise FP8) against BF16 grouped_mm."""
    g = pd.read_csv(ROOT / "kernels" / "h100-grouped" / "fp8_grouped.csv")
    me = g["routed_rows"] / g["experts"]
    sp = (g["grouped_bf16_s"] / g["grouped_fp8_s"]).groupby(me).median()
    dense = float((g["dense_bf16_s"] / g["dense_fp8_s"]).median())
    print(f"\nFP8 (H100, {len(g)} forward GEMMs): BF16 grouped time over FP8 grouped, median by rows per expert: "
          + ", ".join(f"{int(m)}: {r:.2f}" for m, r in sp.items()) + f"; dense _scaled_mm over torch.mm {dense:.2f}")  # fmt: skip


if __name__ == "__main__":
    refit(kernels())
    held_out()
    on_h200()
    fp8()
