"""Reproduce the tables of ``docs/hta-crosscheck.md``: calib's GPU totals beside HTA's.

    python benchmarks/hta_compare.py fixtures/traces/hta/trace_filter --name trace_filter

The comparison itself is :mod:`calib.ingest.hta_compare`; this is its command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from calib.ingest.hta_compare import BUSY_QUANTITIES, calib_totals, compare, hta_totals, markdown


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python benchmarks/hta_compare.py",
        description="Compare calib's GPU totals with HTA's temporal and kernel breakdowns (µs).",
    )
    ap.add_argument("paths", nargs="+", help="trace files of one job (or directories of them)")
    ap.add_argument("--name", help="fixture label for the table (default: first file's name)")
    ap.add_argument(
        "--span",
        default="hta",
        choices=("hta", "published"),
        help="calib side: HTA's kernel set and span (default), or the published per-iteration tables",
    )
    ap.add_argument(
        "--hta-ns-rounding",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="HTA's inward rounding of fractional-µs timestamps (HTA's default: on)",
    )
    ap.add_argument("--busy-only", action="store_true", help="only the window-independent quantities")
    args = ap.parse_args(argv)
    files: list[Path] = []
    for p in map(Path, args.paths):
        files += sorted(p.glob("*.json*")) if p.is_dir() else [p]
    import logging

    logging.getLogger("hta").setLevel(logging.ERROR)
    table = compare(hta_totals(files, ns_rounding=args.hta_ns_rounding), calib_totals(files, span=args.span))
    if args.busy_only:
        table = table[table["quantity"].isin(BUSY_QUANTITIES)]
    label = args.name or files[0].name.split(".")[0]
    print("| fixture | rank | quantity | HTA (µs) | calib (µs) | calib − HTA |")
    print("|---|---|---|---:|---:|---:|")
    print(markdown(table, label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
