"""A trace larger than the memory budget: build one (>= 1 GB of JSON), ingest it, check RSS.

Builds a trace of at least ``--size-gb`` of inflated JSON by tiling the real events of
``fixtures/traces/hta/df_index_resolver`` (timestamps, steps and ids shifted per tile,
``benchmarks/tiling.py``) into a temporary directory (never the repository), then runs
``calib ingest FILE --max-memory BUDGET`` in a fresh process and reports:

* throughput: inflated JSON MB per second of the whole command (read, analysis,
  Parquet);
* peak RSS of that process (``wait4``), against the budget: the check fails (exit 1)
  if RSS exceeds it;
* that the run is whole: one iteration per ProfilerStep of every tile, buckets summing
  to wall time.

``--in-memory`` also runs the in-memory path on the same file (budget lifted) for
comparison; it needs about 3 bytes of RAM per byte of JSON.

    python benchmarks/large_trace_bench.py [--size-gb 1.0] [--max-memory 1G] [--in-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiling import load_trace, tile_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "fixtures" / "traces" / "hta" / "df_index_resolver" / "df_index_resolver.json.gz"


def run_ingest(trace: Path, out: Path, max_memory: str) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (bytes) and stdout of ``calib ingest`` in a fresh process."""
    cmd = [
        sys.executable,
        "-m",
        "calib.cli",
        "ingest",
        str(trace),
        "--out",
        str(out),
        "--max-memory",
        max_memory,
    ]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_text, err_text = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"calib ingest failed:\n{err_text.decode()[-3000:]}")
    return wall, usage.ru_maxrss * 1024.0, out_text.decode()


def parse_size(text: str) -> int:
    from calib.ingest.budget import parse_size as _parse

    return _parse(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0, help="inflated JSON to build, GiB (default 1)")
    ap.add_argument("--max-memory", default="1G", help="calib's budget, e.g. 1G (default), 512M")
    ap.add_argument("--plain", action="store_true", help="write .json instead of .json.gz")
    ap.add_argument("--in-memory", action="store_true", help="also time the in-memory path (needs ~3x RAM)")
    ap.add_argument(
        "--tmpdir", type=Path, default=None, help="where to build the trace (default: system temp)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the built trace and runs")
    args = ap.parse_args()
    budget = parse_size(args.max_memory)

    tmp = Path(tempfile.mkdtemp(prefix="calib-large-", dir=args.tmpdir))
    try:
        t = time.perf_counter()
        doc = load_trace(SOURCE)
        steps_per_tile = sum(
            1
            for e in doc["traceEvents"]
            if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
        )
        trace = tile_trace(
            SOURCE,
            tmp / ("large.json" if args.plain else "large.json.gz"),
            int(args.size_gb * (1 << 30)),
            doc=doc,
        )
        del doc
        print(
            f"built {trace.path.name}: {trace.inflated_bytes / 1e9:.2f} GB of JSON "
            f"({trace.file_bytes / 1e6:.0f} MB on disk), {trace.tiles} tiles of {SOURCE.name}, "
            f"{trace.events:,} events, in {time.perf_counter() - t:.0f} s"
        )
        wall, rss, text = run_ingest(trace.path, tmp / "run", args.max_memory)
        ok_rss = rss <= budget
        streamed = "streamed in batches" in text
        b = pd.read_parquet(tmp / "run" / "buckets.parquet")
        parts = b[["comm_s", "kernel_s", "intra_op_s", "inter_op_s", "other_s"]].sum(axis=1)
        whole = (
            len(b) == trace.tiles * steps_per_tile
            and ((parts - b["wall_s"]).abs() <= 1e-3 * b["wall_s"]).all()
        )
        mb = trace.inflated_bytes / 1e6
        print(f"\n{'path':34s} {'wall s':>8s} {'MB/s':>8s} {'peak RSS MB':>12s} {'budget MB':>10s}")
        print(
            f"{'calib ingest --max-memory ' + args.max_memory:34s} {wall:8.1f} {mb / wall:8.1f} {rss / 1e6:12.0f} {budget / 1e6:10.0f}"
        )
        result = {
            "json_bytes": trace.inflated_bytes,
            "events": trace.events,
            "wall_s": wall,
            "mb_per_s": mb / wall,
            "peak_rss_bytes": rss,
            "budget_bytes": budget,
            "streamed": streamed,
            "iterations": len(b),
        }
        if args.in_memory:
            wall2, rss2, _ = run_ingest(trace.path, tmp / "run-mem", "100%")
            print(
                f"{'calib ingest (in memory)':34s} {wall2:8.1f} {mb / wall2:8.1f} {rss2 / 1e6:12.0f} {'-':>10s}"
            )
            result.update(in_memory_wall_s=wall2, in_memory_peak_rss_bytes=rss2)
        print(
            f"\nstreamed: {streamed}; iterations: {len(b)} (expected {trace.tiles * steps_per_tile}); "
            f"buckets sum to wall: {whole}; peak RSS {'within' if ok_rss else 'OVER'} the budget"
        )
        print(json.dumps(result))
        return 0 if (ok_rss and whole and streamed) else 1
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
