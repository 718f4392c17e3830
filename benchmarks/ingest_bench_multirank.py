"""Multi-rank ingest speed and memory: calib --jobs 1 / --jobs N against HTA's multi-rank load.

The multi-rank companion of ``benchmarks/ingest_bench.py`` (run on its own):
8 rank copies of ``df_index_resolver`` (HTA's test trace, 54 MB of JSON each, 430 MB
in all), identical but for ``distributedInfo.rank``/``world_size``, in one directory.

* calib: ``calib ingest DIR --jobs J`` (every table, the cross-rank table, Parquet),
  in a fresh subprocess per run, for J = 1 and 2 (``--jobs``);
* HTA: ``TraceAnalysis(trace_dir=DIR)`` (parses the ranks with its own process pool)
  + ``get_temporal_breakdown()``, in a fresh subprocess.

Peak memory is the largest sum of resident memory over the whole process tree
(sampled every 20 ms), since both tools fan out to worker processes.  Throughput is
inflated-JSON megabytes per second over all ranks.  The tools alternate over
``--rounds`` and each keeps its best time.

    python benchmarks/ingest_bench_multirank.py [--ranks 8] [--jobs 1 2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import re
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "fixtures" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"
_DIST_RE = re.compile(rb'"distributedInfo": \{[^}]*\}')

_HTA = textwrap.dedent(
    """
    import logging, sys
    logging.disable(logging.INFO)
    from hta.trace_analysis import TraceAnalysis
    analyzer = TraceAnalysis(trace_dir=sys.argv[1])
    analyzer.get_temporal_breakdown(visualize=False)
    """
)


def make_ranks(out: Path, ranks: int) -> float:
    """Write ``ranks`` copies of the trace with their rank rewritten; returns total JSON MB."""
    data = gzip.decompress(TRACE.read_bytes())
    total = 0
    for r in range(ranks):
        dist = f'"distributedInfo": {{"backend": "nccl", "rank": {r}, "world_size": {ranks}}}'.encode()
        body, n = _DIST_RE.subn(dist, data, count=1)
        if n != 1:
            raise SystemExit(f"{TRACE}: no distributedInfo to rewrite")
        (out / f"rank{r}.json.gz").write_bytes(gzip.compress(body, 1))
        total += len(body)
    return total / 1e6


def _tree_rss_bytes(pid: int) -> int:
    import psutil

    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for q in procs:
        with contextlib.suppress(psutil.Error):  # a worker that just exited
            total += q.memory_info().rss
    return total


def measure(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak whole-tree RSS (MB) of a command."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - t
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed ({' '.join(cmd[:4])} ...):\n{err.decode()[-3000:]}")
    return wall, peak[0] / 1e6


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=1, help="alternating rounds (best time of each tool)")
    ap.add_argument("--no-hta", action="store_true", help="calib only")
    args = ap.parse_args(argv if argv is not None else [])
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "ranks"
        d.mkdir()
        mb = make_ranks(d, args.ranks)
        for _ in range(args.rounds):
            for j in args.jobs:
                run = Path(tmp) / f"run-j{j}"
                cmd = [
                    sys.executable,
                    "-m",
                    "calib.cli",
                    "ingest",
                    str(d),
                    "--out",
                    str(run),
                    "--jobs",
                    str(j),
                ]
                _keep_best(results, f"calib ingest --jobs {j}", measure(cmd))
            if not args.no_hta:
                _keep_best(
                    results,
                    "HTA TraceAnalysis + temporal breakdown",
                    measure([sys.executable, "-c", _HTA, str(d)]),
                )
    print(f"\n{args.ranks} ranks of {TRACE.name} ({mb:.0f} MB of JSON in all)")
    print(f"{'tool':42s} {'best s':>8s} {'MB/s':>8s} {'peak RSS MB':>12s} {'vs HTA':>7s}")
    hta = results.get("HTA TraceAnalysis + temporal breakdown")
    for name, r in results.items():
        vs = f"{hta['wall_s'] / r['wall_s']:6.1f}x" if hta else ""
        print(f"{name:42s} {r['wall_s']:8.2f} {mb / r['wall_s']:8.1f} {r['rss_mb']:12.0f} {vs:>7s}")
    return {"json_mb": mb, **results}


def _keep_best(results: dict[str, dict], name: str, m: tuple[float, float]) -> None:
    wall, rss = m
    prev = results.get(name)
    results[name] = {
        "wall_s": min(wall, prev["wall_s"]) if prev else wall,
        "rss_mb": max(rss, prev["rss_mb"]) if prev else rss,
    }


if __name__ == "__main__":
    main(sys.argv[1:])
