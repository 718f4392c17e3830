"""``calib show``: print a calibration readably."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from calib.calibrate.calibration import Calibration, Param, Saturating
from calib.core.collective_names import busbw_factor
from calib.core.errors import InputError
from calib.core.store import calibration_path, default_store

DEFAULT_NODES = (128, 256, 540)
DEFAULT_SIZES = "1M,16M,64M,256M,1G"
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: nccl-tests order, then the rest
ORDER = ("allreduce", "allgather", "alltoall", "reducescatter", "broadcast", "reduce", "sendrecv")


def predictions(cal: Calibration, nodes: tuple[int, ...], sizes: tuple[int, ...]) -> list[dict]:
    """Predicted time and bus bandwidth per collective, node count and size, with a +-1 sigma band.

    Across nodes the network model's time with every fitted parameter moved one standard
    error towards slower (``busbw_lo_gbps``) and faster (``busbw_hi_gbps``).
    """
    gpn = max(int(cal.gpus_per_node), 1)
    colls = [c for c in ORDER if c in cal.network] + sorted(set(cal.network) - set(ORDER))
    if not colls:
        colls = sorted({c.collective for c in cal.collectives}, key=lambda c: (c not in ORDER, c))
    S = np.array(sizes, dtype=float)
    out = []
    for coll in colls:
        net = cal.network.get(coll)
        for nn in nodes:
            n = nn * gpn
            t = np.asarray(cal.collective_time_s(coll, S, n), dtype=float)
            algo = np.full(S.shape, "-", dtype=object)
            t_lo, t_hi = t, t
            if net is not None and net.form == "nccl" and nn > 1:
                t, algo = net.model_time_s(S, float(n))
                t_lo = net.model_time_s(S, float(n), shift=1.0)[0]
                t_hi = net.model_time_s(S, float(n), shift=-1.0)[0]
            f = float(busbw_factor(coll, n)) if n > 1 else 1.0
            f = 1.0 if not np.isfinite(f) else f
            for b, tt, lo, hi, a in zip(S, t, t_lo, t_hi, algo):
                rec = {
                    "collective": coll,
                    "nodes": int(nn),
                    "gpus": int(n),
                    "bytes": int(b),
                    "time_s": float(tt) if np.isfinite(tt) else None,
                    "busbw_gbps": _busbw(b * f, tt),
                    "busbw_lo_gbps": _busbw(b * f, max(lo, hi)) if tt > 0 else None,
                    "busbw_hi_gbps": _busbw(b * f, min(lo, hi)) if tt > 0 else None,
                    "algorithm": str(a),
                }
                if net is not None and net.params.get("derived") is not None and net.params["derived"].value:
                    rec["note"] = net.params["derived"].note
                out.append(rec)
    return out


def _busbw(bus_bytes: float, t_s: float) -> float | None:
    """Bus bandwidth in GB/s; None where the time gives none (<= 0, or a value that is not
    a finite number: a hand-edited calibration can make a time vanish)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        bw = bus_bytes / t_s / 1e9 if t_s > 0 else np.nan
    return float(bw) if np.isfinite(bw) else None


def render_predictions(preds: list[dict]) -> str:
    L = ["Predicted collectives (busbw GB/s [-1 sigma .. +1 sigma]; time; algorithm):"]
    for coll in dict.fromkeys(p["collective"] for p in preds):
        rows = [p for p in preds if p["collective"] == coll]
        note = next((p["note"] for p in rows if p.get("note")), "")
        L.append(f"  {coll}" + (f"  ({note})" if note else ""))
        for p in rows:
            bw = p["busbw_gbps"]
            lo, hi = (("-" if v is None else f"{v:.2f}") for v in (p["busbw_lo_gbps"], p["busbw_hi_gbps"]))
            text = "-" if bw is None else f"{bw:7.2f} [{lo} .. {hi}]"
            ms = "-" if p["time_s"] is None else f"{p['time_s'] * 1e3:10.3f}"
            L.append(
                f"    {p['nodes']:>5} nodes ({p['gpus']:>5} GPUs) {_size(p['bytes']):>6}: {text:<28} "
                f"{ms:>10} ms  {p['algorithm']}"
            )
    return "\n".join(L)


def _size(b: int) -> str:
    for unit, f in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if b >= f and b % f == 0:
            return f"{b // f}{unit}"
    return str(b)


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
    L.append("\nNetwork model (NCCL structure across nodes; eff_{g->n} = busbw at n GPUs / at g, 1 GiB):")
    if not cal.network:
        L.append("  none (no multi-node collective samples)")
    gpn = max(cal.gpus_per_node, 1)
    n_gpus = np.array(nodes, dtype=float) * gpn
    for coll, ns in sorted(cal.network.items()):
        L.append(f"  {coll:<13} form {ns.form}, g = {ns.g_gpus} GPUs; {_q(ns.quality)}")
        for k, v in ns.params.items():
            if v.status != "fixed" and not brief:
                L.append(f"      {k:<16} {_p(v)} {v.unit}" + (f"  ({v.note})" if v.note else ""))
        if ns.form == "nccl" and ns.segments and not brief and coll == "allgather":
            L.append("      ring step time tau(c) against per-rank chunk c (protocol/channel regimes):")
            for sg in ns.segments:
                L.append(
                    f"        {sg.min_bytes:>12.0f} .. {sg.max_bytes:>12.0f} B: alpha {_p(sg.alpha_s, 1e6, '{:.1f}')} us,"
                    f" busbw {_p(sg.busbw_gbps, 1, '{:.2f}')} GB/s"
                )
        if ns.measured:
            L.append("      measured eff: " + ", ".join(f"{n} GPUs {e:.3f}" for n, e in ns.measured))
        L.append("      eff at " + ", ".join(f"{n} nodes {e:.3f}" for n, e in zip(nodes, ns.eff(n_gpus))))
    L.append("\nCompute (x = FLOPs per matmul operator):")
    _curve("k1", cal.k1_curve, L)
    _curve("k2", cal.k2_curve, L)
    _curve("GEMM efficiency", cal.gemm_efficiency_curve, L)
    for k, v in sorted(cal.dispatch.items()):
        L.append(f"  {k:<18} {_p(v, 1e6, '{:.2f}')} us" + (f"  ({v.note})" if v.note and not brief else ""))
    slots = cal.compute_slots_per_node
    if slots is not None:
        L.append(
            f"  compute slots/node {_p(slots, 1, '{:.3g}')}  (r ranks on a node run max(1, r / slots) slower)"
            + (f"  ({slots.note})" if slots.note and not brief else "")
        )
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


def _parse_sizes(text: str) -> tuple[int, ...]:
    out = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            continue
        num, unit = (
            tok.rstrip("KMGTBkmgtbi"),
            tok[len(tok.rstrip("KMGTBkmgtbi")) :].upper().replace("IB", "").rstrip("B"),
        )
        try:
            v = float(num) * _UNITS[unit]
        except (ValueError, KeyError):
            raise InputError(
                "--sizes", f"expected sizes like 1M,16M,1G (binary units) or bytes, got '{tok}'"
            ) from None
        if not v >= 1:
            raise InputError("--sizes", f"sizes must be at least 1 byte, got '{tok}'")
        out.append(int(v))
    if not out:
        raise InputError("--sizes", f"no sizes in '{text}'")
    return tuple(out)


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
@click.option(
    "--sizes",
    default=DEFAULT_SIZES,
    show_default=True,
    help="Message sizes (nccl-tests size; K/M/G are binary: 1M = 1048576 B) at which to predict each collective.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the predictions (and the calibration's notes) as JSON."
)
@click.option("--brief", is_flag=True, help="Leave out per-regime segments, notes of dispatch and versions.")
def show(target: str, store: Path | None, nodes: str, sizes: str, as_json: bool, brief: bool):
    """Print a calibration: parameters with standard errors and status, fit quality (R²,
    max relative error, held-out error, points), the predicted time and bus bandwidth
    (GB/s, ±1σ) of every collective at --nodes and --sizes, and provenance.  --json
    prints {"system", "predictions": [{collective, nodes, gpus, bytes, time_s,
    busbw_gbps, busbw_lo_gbps, busbw_hi_gbps, algorithm}], "notes"}.

    TARGET is a system name (its <store>/<system>/<system>.calib.json) or a calibration
    JSON file.
    """
    node_list = _parse_nodes(nodes)
    size_list = _parse_sizes(sizes)
    path = Path(target)
    if not (path.suffix == ".json" or path.is_file()):
        path = calibration_path(store or default_store(), target)
        if not path.is_file():
            raise InputError(target, f"no calibration at {path} (run `calib fit --system {target}` first)")
    cal = Calibration.load(path)
    preds = predictions(cal, node_list, size_list)
    if as_json:
        import json

        doc = {
            "system": cal.system,
            "calibration": str(path),
            "where": (cal.provenance or {}).get("where", {}),
            "network_source": (cal.provenance or {}).get("network_source", ""),
            "predictions": preds,
            "notes": list(cal.notes),
        }
        click.echo(json.dumps(doc, indent=2, allow_nan=False))
        return
    click.echo(render(cal, brief=brief, nodes=node_list))
    click.echo("\n" + render_predictions(preds))
