"""Ingest speed and memory: calib against HTA on the same real trace.

Case ``single``: ``df_index_resolver`` (HTA's own test trace, 54 MB of JSON, V100 DDP).
Each tool runs in a fresh subprocess (so peak RSS is its own), after its imports:

* calib: ``ingest.orchestrate.ingest`` (read, all tables: buckets, kernels, collectives,
  GEMMs, framework) + ``write_run`` (Parquet), i.e. ``calib ingest`` without printing;
* HTA:   ``TraceAnalysis(trace_dir=...)`` (its loader) + ``get_temporal_breakdown()``.

Throughput is inflated-JSON megabytes per second.  The tools alternate over several
rounds and the best time of each is kept, so background load skews neither.  Prints a
table and the ratio.  Run: ``python benchmarks/ingest_bench.py [--repeat 3] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "fixtures" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"

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
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"times": times, "rss_mb": rss}))
    """
)


def _run(code: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def single(repeat: int, rounds: int = 3) -> dict:
    raw_mb = len(gzip.decompress(TRACE.read_bytes())) / 1e6
    # Rounds alternate the two tools so that background load hits both alike.
    calib = {"times": [], "rss_mb": 0.0}
    hta = {"times": [], "rss_mb": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(TRACE, Path(tmp) / TRACE.name)
        for _ in range(rounds):
            c = _run(_CALIB, str(TRACE), str(repeat))
            h = _run(_HTA, tmp, "1")
            calib["times"] += c["times"]
            hta["times"] += h["times"]
            calib["rss_mb"] = max(calib["rss_mb"], c["rss_mb"])
            hta["rss_mb"] = max(hta["rss_mb"], h["rss_mb"])
    c_best, h_best = min(calib["times"]), min(hta["times"])
    rows = [
        ("calib ingest (all tables + Parquet)", c_best, raw_mb / c_best, calib["rss_mb"]),
        ("HTA TraceAnalysis + temporal breakdown", h_best, raw_mb / h_best, hta["rss_mb"]),
    ]
    print(f"\ntrace: {TRACE.relative_to(ROOT)} ({raw_mb:.1f} MB of JSON)")
    print(f"{'tool':42s} {'best s':>8s} {'MB/s':>8s} {'peak RSS MB':>12s}")
    for name, t, mbps, rss in rows:
        print(f"{name:42s} {t:8.3f} {mbps:8.1f} {rss:12.0f}")
    ratio = h_best / c_best
    print(
        f"speed ratio calib/HTA: {ratio:.1f}x   memory ratio calib/HTA: {calib['rss_mb'] / hta['rss_mb']:.2f}"
    )
    return {"raw_mb": raw_mb, "calib": calib, "hta": hta, "speed_ratio": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="calib repetitions per round (best is reported)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating calib/HTA rounds (best of each)")
    ap.add_argument("--case", choices=["single", "all"], default="all")
    args = ap.parse_args()
    single(args.repeat, args.rounds)
    try:  # the multi-rank case lives beside this script when present
        sys.path.insert(0, str(Path(__file__).parent))
        import ingest_bench_multirank  # type: ignore[import-not-found]
    except ImportError:
        return
    if args.case == "all":
        ingest_bench_multirank.main()


if __name__ == "__main__":
    main()
