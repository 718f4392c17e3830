"""``calib show``: print a calibration readably."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from calib.calibrate.calibration import Calibration, Param, Saturating
from calib.core.errors import InputError
from calib.core.store import calibration_path, default_store

DEFAULT_NODES = (128, 256, 540)


def _p(p: Param | None, scale: float = 1.0, fmt: str = "{:.4g}") -> str:
    if p is None:
        return "-"
    text = fmt.format(p.value * scale)
    if p.stderr is not None:
        text += " ± " + fmt.format(p.stderr * scale)
    if p.status != "fitted":
        text += f" [{p.status}]"
    return text


def _q(q) -> str:
    return "-" if q is None else q.summary()


def _curve(name: str, c: Saturating | None, lines: list[str]) -> None:
    if c is None:
        lines.append(f"  {name:<16} -")
        return
    xs = np.array([1e6, 1e8, 1e10])
    ys = c(xs)
    lines.append(
        f"  {name:<16} y_max {_p(c.y_max, fmt='{:.3f}')}, x_half {_p(c.x_half, fmt='{:.3g}')} FLOP, "
        f"gamma {_p(c.gamma, fmt='{:.2f}')}; at 1e6/1e8/1e10 FLOP per matmul: "
        + "/".join(f"{y:.3f}" for y in ys)
        + f"; {_q(c.quality)}"
    )
    notes = {p.note for p in (c.y_max, c.x_half) if p.note and p.status != "fitted"}
    lines.extend(f"      note: {n}" for n in sorted(notes))


def render(cal: Calibration, *, brief: bool = False, nodes: tuple[int, ...] = DEFAULT_NODES) -> str:
    """The calibration as text: parameters with uncertainty, fit quality, predictions, provenance."""
    from calib.calibrate import netmodel
    from calib.calibrate.network import predict_busbw_gbps

    L: list[str] = []
    L.append(f"calibration of {cal.system}  (calib {cal.calib_version or '?'}, created {cal.created})")
    L.append(
        f"  device {cal.device or '-'}; {cal.gpus_per_node} GPU(s) per node; "
        f"peak {cal.peak_tflops if cal.peak_tflops else '-'} TFLOP/s"
    )
    L.append(
        "\nCollective curves (alpha = small-message latency in us, busbw = large-message plateau in GB/s):"
    )
    if not cal.collectives:
        L.append("  none")
    for c in sorted(cal.collectives, key=lambda c: (c.collective, c.n_gpus)):
        L.append(
            f"  {c.collective:<13} {c.n_gpus:>5} GPUs {c.n_nodes:>4} nodes  alpha {_p(c.alpha_s, 1e6, '{:.1f}')}  "
            f"busbw {_p(c.busbw_gbps, 1, '{:.2f}')}  {len(c.segments) or 1} regime(s)  {_q(c.quality)}"
        )
        if not brief:
            for s in c.segments:
                L.append(
                    f"      {s.min_bytes:>12.0f} .. {s.max_bytes:>12.0f} B: alpha {_p(s.alpha_s, 1e6, '{:.1f}')} us,"
                    + (
                        f" busbw {_p(s.busbw_gbps, 1, '{:.2f}')} GB/s"
                        if s.busbw_gbps.value < 1e6
                        else " time flat in size (latency-bound: busbw not resolved)"
                    )
                )
    L.append("\nNetwork scaling eff_{g->n} (large-message busbw at n GPUs / at g GPUs):")
    if not cal.network:
        L.append("  none (no multi-node collective samples)")
    gpn = max(cal.gpus_per_node, 1)
    n_gpus = np.array(nodes, dtype=float) * gpn
    for coll, ns in sorted(cal.network.items()):
        lam = ns.params.get("lambda_s")
        L.append(
            f"  {coll:<13} form {ns.form}, g = {ns.g_gpus} GPUs, per-step latency lambda "
            f"{_p(lam, 1e6, '{:.2f}')} us; {_q(ns.quality)}"
        )
        if ns.measured:
            L.append("      measured eff: " + ", ".join(f"{n} GPUs {e:.3f}" for n, e in ns.measured))
        if ns.form != netmodel.FORM:
            L.append("      eff at " + ", ".join(f"{n} nodes {e:.3f}" for n, e in zip(nodes, ns.eff(n_gpus))))
            continue
        p = {k: v.value for k, v in ns.params.items()}
        s_ref = p["s_ref_bytes"]
        mid = predict_busbw_gbps(ns, n_gpus)
        se = lam.stderr if lam is not None and lam.stderr is not None else 0.0
        lo = predict_busbw_gbps(ns, n_gpus, lambda_s=lam.value + se)
        hi = predict_busbw_gbps(ns, n_gpus, lambda_s=lam.value - se)
        alg = netmodel.algorithm_at({**p, "g_gpus": float(ns.g_gpus)}, n_gpus)
        L.append(f"      predicted busbw at {s_ref / 2**20:.0f} MiB (GB/s; ±1 sigma of lambda):")
        for nn, ng, m, a, b, al, e in zip(nodes, n_gpus, mid, lo, hi, alg, ns.eff(n_gpus)):
            extra = ""
            if p.get("tree_eff", 0) > 0:
                ring = predict_busbw_gbps(ns, np.array([ng]), ring_only=True)[0]
                extra = f"  (ring only: {ring:.1f})"
            L.append(
                f"        {nn:>5} nodes ({int(ng):>5} GPUs): {m:6.1f}  [{a:.1f} .. {b:.1f}]  eff {e:.3f}  {al}{extra}"
            )
    L.append("\nCompute (x = FLOPs per matmul operator):")
    _curve("k1", cal.k1_curve, L)
    _curve("k2", cal.k2_curve, L)
    _curve("GEMM efficiency", cal.gemm_efficiency_curve, L)
    for k, v in sorted(cal.dispatch.items()):
        L.append(f"  {k:<18} {_p(v, 1e6, '{:.2f}')} us" + (f"  ({v.note})" if v.note and not brief else ""))
    if cal.device_model is not None:
        from calib.commands.device_text import render as device_lines

        L.extend(device_lines(cal.device_model))
    if cal.notes:
        L.append("\nNotes:")
        L.extend(f"  - {n}" for n in cal.notes)
    prov = cal.provenance or {}
    if prov.get("runs"):
        L.append("\nProvenance:")
        L.append(f"  runs: {', '.join(r['name'] + ' (' + r['kind'] + ')' for r in prov['runs'])}")
        L.append(
            f"  samples used: {prov.get('samples_used', 0)}; network source: {prov.get('network_source') or '-'}; "
            f"where: {prov.get('where') or '-'}"
        )
        if not brief:
            v = prov.get("versions", {})
            L.append("  versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    return "\n".join(L)


def _parse_nodes(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError("--nodes", f"expected comma-separated node counts, got '{text}'") from None
    if not out or min(out) < 1:
        raise InputError("--nodes", f"node counts must be positive integers, got '{text}'")
    return out


@click.command(name="show")
@click.argument("target")
@click.option(
    "--store",
    type=click.Path(path_type=Path),
    help="Store directory (default ./calib-store or $CALIB_STORE).",
)
@click.option(
    "--nodes",
    default=",".join(map(str, DEFAULT_NODES)),
    show_default=True,
    help="Node counts at which to print the predicted large-message busbw (GB/s).",
)
@click.option("--brief", is_flag=True, help="Leave out per-regime segments, notes of dispatch and versions.")
def show(target: str, store: Path | None, nodes: str, brief: bool):
    """Print a calibration: parameters with standard errors and status, fit quality (R²,
    max relative error, held-out error, points), predicted large-message bus bandwidth
    (GB/s) at --nodes from eff_{g->n}, and provenance.

    TARGET is a system name (its <store>/<system>/<system>.calib.json) or a calibration
    JSON file.
    """
    node_list = _parse_nodes(nodes)
    path = Path(target)
    if not (path.suffix == ".json" or path.is_file()):
        path = calibration_path(store or default_store(), target)
        if not path.is_file():
            raise InputError(target, f"no calibration at {path} (run `calib fit --system {target}` first)")
    cal = Calibration.load(path)
    click.echo(render(cal, brief=brief, nodes=node_list))
