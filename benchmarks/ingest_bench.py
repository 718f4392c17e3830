"""Ingest speed against its floor and against HTA, on real and synthetic traces.

Cases (``--case``):

* ``h100``: the largest shipped H100 trace (``fixtures/traces/h100/runs/*/rank0...``, by
  inflated size);
* ``synthetic``: a trace of at least ``--synthetic-mb`` (default 100) MB of JSON, built
  in a temporary directory by tiling the real events of ``df_index_resolver`` (HTA's
  test trace, V100 DDP; ``benchmarks/tiling.py``);
* ``hta``: ``df_index_resolver`` itself (54 MB of JSON).

Each measurement runs in a fresh subprocess (so peak RSS is its own), after its imports:

* calib: ``ingest.orchestrate.ingest`` (read, every table) + ``write_run`` (Parquet):
  ``calib ingest`` without printing;
* issue 11's floor ("inflate with isal and decode with msgspec alone"): read the file,
  inflate it with ISA-L (``isal_zlib``, what calib's reader uses) and decode it with
  plain ``msgspec.json.decode`` (dicts and lists);
* typed floor: the same, decoding into calib's own event structs
  (``reader._FAST_DECODER``), which skips every key calib does not read: a stricter
  floor, the part of this design's ingest no analysis can avoid;
* HTA: ``TraceAnalysis(trace_dir=...)`` + ``get_temporal_breakdown()`` (skipped with
  ``--no-hta`` or when HTA is not installed).

The tools alternate over ``--rounds`` and each keeps its best time, so background load
skews none.  Prints, per case, the times, ``ingest / issue-11 floor`` (the target: at
most 1.15), ``ingest / typed floor`` and ``HTA / ingest``.

    python benchmarks/ingest_bench.py [--case h100 synthetic] [--rounds 3] [--no-hta]
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100_RUNS = ROOT / "fixtures" / "traces" / "h100" / "runs"
HTA_TRACE = ROOT / "fixtures" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"

# Peak RSS of the child itself: VmHWM of /proc/self/status is per address space, so it
# starts afresh at exec; ru_maxrss is carried over from the parent across exec on Linux
# (the synthetic case's parent holds the tiled trace, which then showed in every child).
_PEAK = textwrap.dedent(
    """
    import resource
    def peak_rss_mb():
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    """
)

_CALIB = textwrap.dedent(
    """
    import json, resource, sys, tempfile, time
    from pathlib import Path
    from calib.ingest.orchestrate import IngestOptions, ingest
    from calib.core.rundir import write_run
    src, repeat = Path(sys.argv[1]), int(sys.argv[2])
    times = []
    for _ in range(repeat):
        out = Path(tempfile.mkdtemp()) / "run"
        t = time.perf_counter()
        meta, tables = ingest([src], IngestOptions(name="bench"))
        write_run(out, meta, tables)
        times.append(time.perf_counter() - t)
    rss = peak_rss_mb()
    print(json.dumps({"times": times, "rss_mb": rss}))
    """
)

_FLOOR = textwrap.dedent(
    """
    import gc, json, resource, sys, time
    from pathlib import Path
    import msgspec
    from isal import isal_zlib
    from calib.ingest.reader import _FAST_DECODER
    src, repeat, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    decode = _FAST_DECODER.decode if mode == "typed" else msgspec.json.decode
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        blob = src.read_bytes()
        data = isal_zlib.decompress(blob, 47) if blob[:2] == b"\\x1f\\x8b" else blob
        gc.disable()
        doc = decode(data)
        gc.enable()
        times.append(time.perf_counter() - t)
        del doc, data, blob
    rss = peak_rss_mb()
    print(json.dumps({"times": times, "rss_mb": rss}))
    """
)

_HTA = textwrap.dedent(
    """
    import json, logging, resource, sys, time
    logging.disable(logging.INFO)
    from hta.trace_analysis import TraceAnalysis
    trace_dir, repeat = sys.argv[1], int(sys.argv[2])
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        analyzer = TraceAnalysis(trace_dir=trace_dir)
        analyzer.get_temporal_breakdown(visualize=False)
        times.append(time.perf_counter() - t)
    rss = peak_rss_mb()
    print(json.dumps({"times": times, "rss_mb": rss}))
    """
)


def _run(code: str, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK + code, *args], capture_output=True, text=True, cwd=ROOT
    )
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def inflated_mb(path: Path) -> float:
    blob = path.read_bytes()
    return len(gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob) / 1e6


def largest_h100() -> Path:
    return max(sorted(H100_RUNS.glob("*/rank*.pt.trace.json*")), key=inflated_mb)


def measure(trace: Path, label: str, repeat: int, rounds: int, hta: bool) -> dict:
    """Best times (s) of calib, the typed and generic floors and HTA on ``trace``."""
    best: dict[str, float] = {}
    rss: dict[str, float] = {}

    def keep(key: str, res: dict) -> None:
        best[key] = min(best.get(key, float("inf")), *res["times"])
        rss[key] = max(rss.get(key, 0.0), res["rss_mb"])

    with tempfile.TemporaryDirectory() as tmp:
        if hta:
            shutil.copy(trace, Path(tmp) / trace.name)
        for _ in range(rounds):
            keep("floor", _run(_FLOOR, str(trace), str(repeat), "typed"))
            keep("calib", _run(_CALIB, str(trace), str(repeat)))
            keep("generic", _run(_FLOOR, str(trace), str(repeat), "generic"))
            if hta:
                keep("hta", _run(_HTA, tmp, "1"))
    mb = inflated_mb(trace)
    print(f"\n{label}: {trace.name} ({mb:.1f} MB of JSON, {trace.stat().st_size / 1e6:.1f} MB on disk)")
    print(f"{'':44s} {'best s':>8s} {'MB/s':>8s} {'peak RSS MB':>12s}")
    names = {
        "calib": "calib ingest (all tables + Parquet)",
        "generic": "issue-11 floor: isal + msgspec.json.decode",
        "floor": "typed floor: isal + msgspec into structs",
        "hta": "HTA TraceAnalysis + temporal breakdown",
    }
    for key, name in names.items():
        if key in best:
            print(f"{name:44s} {best[key]:8.3f} {mb / best[key]:8.1f} {rss[key]:12.0f}")
    ratio = best["calib"] / best["generic"]
    typed = best["calib"] / best["floor"]
    print(f"ingest / issue-11 floor (isal + msgspec.json.decode): {ratio:.2f}x   (target <= 1.15)")
    print(f"ingest / typed floor (isal + msgspec into calib's structs): {typed:.2f}x")
    if "hta" in best:
        print(f"HTA / ingest: {best['hta'] / best['calib']:.1f}x")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return {
        "trace": str(trace),
        "mb": mb,
        "best_s": best,
        "rss_mb": rss,
        "issue11_floor_ratio": ratio,
        "typed_floor_ratio": typed,
        "loadavg": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", nargs="+", choices=["h100", "synthetic", "hta"], default=["h100", "synthetic"])
    ap.add_argument("--repeat", type=int, default=3, help="repetitions per subprocess (best is kept)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of the tools (best of each)")
    ap.add_argument(
        "--synthetic-mb", type=float, default=100.0, help="size of the synthetic trace (MB of JSON)"
    )
    ap.add_argument("--no-hta", action="store_true", help="leave HTA out")
    ap.add_argument("--json", type=Path, help="also write the results as JSON here")
    args = ap.parse_args()
    hta = not args.no_hta and importlib.util.find_spec("hta") is not None
    results = []
    for case in args.case:
        if case == "h100":
            results.append(
                measure(largest_h100(), "largest shipped H100 trace", args.repeat, args.rounds, hta)
            )
        elif case == "hta":
            results.append(measure(HTA_TRACE, "HTA test trace", args.repeat, args.rounds, hta))
        else:
            sys.path.insert(0, str(Path(__file__).parent))
            from tiling import tile_trace  # noqa: PLC0415

            with tempfile.TemporaryDirectory(prefix="calib-ingest-bench-") as tmp:
                trace = Path(tmp) / "synthetic_rank0.pt.trace.json.gz"
                tile_trace(HTA_TRACE, trace, int(args.synthetic_mb * 1e6))
                results.append(measure(trace, "synthetic (tiled df_index_resolver)", 1, args.rounds, hta))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
