"""Assemble a report from its inputs and write it atomically.

``DIR/report.html`` (self-contained), ``DIR/report.md``, ``DIR/figures/*.png`` and
``DIR/data/*.csv`` (the numbers behind each figure) are written into a temporary
sibling directory and renamed into place, so a failed report leaves nothing behind and
an earlier report at ``DIR`` is replaced only by a complete one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from calib.reports import html, markdown
from calib.reports.document import Report, Section, Text
from calib.reports.inputs import Inputs
from calib.reports.predictions import Predictions
from calib.reports.spec import PredictSpec, default_spec

from calib.core.atomic import DirExists, replacing_dir
from calib.core.errors import InputError

REPORT_FILE = "report.html"
#: what a report directory holds; anything else in the output directory means it is not ours to replace
REPORT_ENTRIES = {REPORT_FILE, "report.md", "figures", "data"}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("calib")
    except Exception:  # noqa: BLE001 - metadata missing in a source checkout
        return ""


def summary(inputs: Inputs, pred: Predictions | None) -> list[str]:
    """A few sentences a reader can act on, each traceable to a figure below."""
    from calib.reports.fig_runs import dissection_frame, overview

    out: list[str] = []
    trace = [r for r in inputs.runs if r.meta.kind == "trace" and r.has("buckets")]
    if trace:
        ov = overview(trace)
        lo, hi = ov["comm %"].min(), ov["comm %"].max()
        out.append(f"{len(trace)} traced run(s): communication takes {lo:.0f}-{hi:.0f} % of iteration time "
                   f"(exposed: {ov['exposed comm %'].min():.0f}-{ov['exposed comm %'].max():.0f} %).")  # fmt: skip
        dis = dissection_frame(trace)
        if not dis.empty:
            worst = dis.loc[dis["kernel_pct"].idxmin()]
            out.append(f"Dispatch: in run {worst['run']} only {worst['kernel_pct']:.0f} % of compute time is kernel "
                       f"execution, {100 - worst['kernel_pct']:.0f} % is the device waiting on the host (intra/inter-op "
                       "dispatch; seed 004 measured up to 95 % for small models).")  # fmt: skip
    cal = inputs.calibration
    if cal is not None:
        ar = [c for c in cal.collectives if c.collective == "allreduce"]
        if ar:
            c = max(ar, key=lambda c: c.n_gpus)
            text = f"Calibration {cal.system}: all-reduce plateau bus bandwidth {c.busbw_gbps.value:.1f} GB/s at {c.n_gpus} GPUs"
            if "allreduce" in cal.network:
                n = 512
                text += f"; eff at {n} GPUs {float(cal.network['allreduce'].eff(n)):.3f} (fitted form, extrapolated)"
            out.append(text + ".")
        status = {n: getattr(cal, f"{n}_curve").y_max.status for n in ("k1", "k2", "gemm_efficiency")
                  if getattr(cal, f"{n}_curve") is not None}  # fmt: skip
        defaults = [n for n, s in status.items() if s != "fitted"]
        if defaults:
            out.append(f"Not measured on {cal.system}: {', '.join(defaults)} keep stated defaults "
                       "(trace the target system with shapes recorded to fit them).")  # fmt: skip
    if pred is not None and pred.scaling is not None and not pred.scaling.empty:
        t = pred.scaling
        gmax = int(t["gpus"].max())
        last = t[t["gpus"] == gmax]
        fits = last[~last["oom"]]
        if not fits.empty:
            big = fits.loc[fits["params_b"].idxmax()]
            m = big["model"]
            per = fits[fits["model"] == m].set_index("zero")
            parts = [f"ZeRO-{int(z)} {r['iter_s']:.2f} s/iter, {100 * r['comm_exposed_s'] / r['iter_s']:.0f} % comm, "
                     f"scaling eff {100 * r['scaling_eff']:.0f} %" for z, r in per.iterrows()]  # fmt: skip
            out.append(f"{m} on {gmax} GPUs: " + "; ".join(parts) + ".")
        parts = []
        for (m, z), d in t.groupby(["model", "zero"], sort=False):
            fit_at = d.loc[~d["oom"], "gpus"]
            if fit_at.empty:
                parts.append(f"{m} ZeRO-{int(z)} at any count up to {gmax} GPUs")
            elif d["oom"].any():
                parts.append(f"{m} ZeRO-{int(z)} below {int(fit_at.min())} GPUs")
        if parts:
            out.append("Out of memory: " + "; ".join(parts) + ".")
    if pred is not None and pred.maps is not None:
        ok = pred.maps.tp_pp[pred.maps.tp_pp["valid"] & ~pred.maps.tp_pp["oom"]]
        if len(ok):
            b = ok.loc[ok["iter_s"].idxmin()]
            out.append(f"{pred.maps.spec.model} on {pred.maps.spec.gpus} GPUs: fastest TP × PP layout TP={int(b['tp'])} "
                       f"PP={int(b['pp'])} DP={int(b['dp'])} ({b['iter_s']:.2f} s/iter, {100 * b['comm_share']:.0f} % exposed comm).")  # fmt: skip
    if pred is not None and pred.search is not None and not pred.search.top.empty:
        from calib.reports.fig_strategy import strategy_label

        r = pred.search.top.iloc[0]
        out.append(f"Best of {pred.search.n_strategies:,} strategies for {pred.search.spec.model} on {pred.search.spec.gpus} "
                   f"GPUs: {strategy_label(r)}, {r['iter_s']:.2f} s/iter, MFU {100 * r['mfu']:.1f} %.")  # fmt: skip
    if pred is not None:
        for v in pred.validations:
            s = v.summary
            if s["n_heldout"]:
                out.append(f"Validation, {v.format}: held-out median |err| {s['median_abs_pct']:.1f} %, max "
                           f"{s['max_abs_pct']:.1f} % over {s['n_heldout']} rows.")  # fmt: skip
    return out or ["Nothing to summarise: no runs, calibration or predictions."]


def make_report(
    inputs: Inputs,
    spec: PredictSpec | None,
    pred: Predictions | None = None,
    title: str | None = None,
    step: Callable[[str], None] = lambda name: None,
    extra: tuple[Section, ...] = (),
) -> Report:
    """The report of ``inputs`` and the predictions computed for ``spec`` (``step`` marks progress)."""
    from calib.reports.sections import calibration_section, runs_section
    from calib.reports.sections_predict import scaling_section, strategy_section, validation_section

    step("runs")
    from calib.reports.sections import render_figure
    from calib.reports.style import colour_key

    key_fig = render_figure("colour-key", "Colour key",
                            "One colour per time bucket in every figure of this report.", colour_key())  # fmt: skip
    sections: list[Section] = [Section("colour-key", "Colour key", (key_fig,))]
    if inputs.runs or inputs.calibration is None:
        sections.append(runs_section(list(inputs.runs), inputs.calibration))
    step("calibration")
    max_gpus = max(spec.scaling.gpus) if spec and spec.scaling else 512
    if inputs.calibration is not None or inputs.system:
        sections.append(
            calibration_section(inputs.calibration, inputs.series, inputs.calibration_path, (max_gpus,))
        )
    step("figures")
    if pred is not None:
        for s in (scaling_section(pred), strategy_section(pred), validation_section(pred)):
            if s is not None:
                sections.append(s)
        if pred.notes:
            sections.append(
                Section("prediction-notes", "Prediction notes", tuple(Text(n, "note") for n in pred.notes))
            )
    elif spec is None or spec.empty:
        sections.append(Section("predictions", "Predictions", (Text(
            "Nothing to predict: no prediction spec and no calibration.", "missing"),)))  # fmt: skip
    sections.extend(extra)
    name = title or ("calib report" + (f": {inputs.system}" if inputs.system else ""))
    meta = [
        (
            "generated",
            datetime.now(UTC).replace(microsecond=0).isoformat() + f" by calib {_version()}".rstrip(),
        )
    ]
    if inputs.runs:
        meta.append(("runs", ", ".join(r.meta.name for r in inputs.runs)))
    if inputs.calibration_path is not None:
        meta.append(("calibration", str(inputs.calibration_path)))
    if pred is not None and pred.machine != "-":
        meta.append(("machine", pred.machine))
    if spec is not None:
        meta.append(("prediction spec", spec.source))
    return Report(name, tuple(meta), tuple(summary(inputs, pred)), tuple(sections), tuple(inputs.notes))


def write_report(report: Report, out: Path) -> Path:
    """Write the report into ``out`` atomically (temporary sibling, then rename)."""
    given = out
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise InputError("out", f"{given} exists and is not a directory")
    if out.is_dir():
        names = {p.name for p in out.iterdir()}
        if names and (REPORT_FILE not in names or names - REPORT_ENTRIES):
            raise InputError(
                "out",
                f"{given} is a non-empty directory that holds no calib report; refusing to replace it",
            )
    try:
        with replacing_dir(out, replace=True, may_replace=_holds_report) as tmp:
            (tmp / "figures").mkdir()
            (tmp / "data").mkdir()
            for f in report.figures():
                (tmp / "figures" / f"{f.key}.png").write_bytes(f.png)
                f.data.replace({np.inf: np.nan}).to_csv(tmp / "data" / f"{f.key}.csv", index=False)
            (tmp / REPORT_FILE).write_text(html.render(report), encoding="utf-8")
            (tmp / "report.md").write_text(markdown.render(report), encoding="utf-8")
    except DirExists:
        raise InputError(
            "out", f"{given} changed while the report was written; refusing to replace it"
        ) from None
    except OSError as exc:
        raise InputError("out", f"cannot write {out}: {exc.strerror or exc}") from None
    return out / REPORT_FILE


def _holds_report(out: Path) -> bool:
    """Replace only a directory that is empty or holds a calib report and nothing else."""
    names = {p.name for p in out.iterdir()} if out.is_dir() else None
    return names is not None and (not names or (REPORT_FILE in names and not names - REPORT_ENTRIES))


def resolve_spec(text: str | None, inputs: Inputs) -> PredictSpec | None:
    """The prediction spec as given (a file, 'default' or 'none'); without one, the default
    spec when there is a calibration."""
    from calib.reports.spec import load_spec

    spec = load_spec(text)
    if spec is None and inputs.calibration is not None:
        return default_spec()
    return spec
