"""Ingest every fixture trace and save, or compare, the tables it writes.

A refactoring of ingest must not change a single value.  Run once before the change
(``save DIR``) and once after (``compare DIR``): every fixture trace file is ingested on
its own (``ingest_rank``) and every trace run directory as a run (``ingest``), the run
is written with ``write_run``, and ``compare`` checks each Parquet table with
``DataFrame.equals`` (values, dtypes, NaN positions) and each table's column order, and
``run.json`` apart from its creation time.

    python benchmarks/ingest_outputs.py save /tmp/before
    python benchmarks/ingest_outputs.py compare /tmp/before
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pandas as pd
from calib.ingest.orchestrate import IngestOptions, ingest

from calib.core.rundir import write_run

ROOT = Path(__file__).resolve().parents[1]


def inputs() -> list[tuple[str, list[Path]]]:
    """(label, paths): each trace file alone, and each directory of traces as one run."""
    files = sorted(ROOT.glob("fixtures/traces/**/*.json.gz")) + sorted(ROOT.glob("fixtures/traces/**/*.json"))
    files = [f for f in files if "trace" in f.name and "run_config" not in f.name]
    out = [(str(f.relative_to(ROOT)).replace("/", "__"), [f]) for f in files]
    dirs = sorted({f.parent for f in files if len(list(f.parent.glob("*trace.json*"))) > 1})
    out += [("dir__" + str(d.relative_to(ROOT)).replace("/", "__"), [d]) for d in dirs]
    return out


def write_all(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for label, paths in inputs():
        try:
            meta, tables = ingest(paths, IngestOptions(name="cmp"))
        except Exception as exc:  # noqa: BLE001 - recorded, compared as an outcome
            (dest / f"{label}.error").write_text(f"{type(exc).__name__}: {exc}\n")
            continue
        write_run(dest / label, meta, tables)


def _meta(path: Path) -> dict:
    meta = json.loads((path / "run.json").read_text())
    meta.pop("created", None)
    return meta


def compare(before: Path, after: Path) -> int:
    bad = 0
    names = sorted({p.name for p in before.iterdir()} | {p.name for p in after.iterdir()})
    n_tables = 0
    for name in names:
        b, a = before / name, after / name
        if not (b.exists() and a.exists()):
            print(f"MISSING {name}: before={b.exists()} after={a.exists()}")
            bad += 1
            continue
        if name.endswith(".error"):
            if b.read_text() != a.read_text():
                print(f"ERROR DIFFERS {name}: {b.read_text().strip()} / {a.read_text().strip()}")
                bad += 1
            continue
        if _meta(b) != _meta(a):
            print(f"RUN.JSON DIFFERS {name}")
            bad += 1
        tb = sorted(p.name for p in b.glob("*.parquet"))
        ta = sorted(p.name for p in a.glob("*.parquet"))
        if tb != ta:
            print(f"TABLES DIFFER {name}: {tb} / {ta}")
            bad += 1
        for t in sorted(set(tb) & set(ta)):
            n_tables += 1
            db, da = pd.read_parquet(b / t), pd.read_parquet(a / t)
            if list(db.columns) != list(da.columns) or not db.equals(da):
                print(f"VALUES DIFFER {name}/{t}")
                bad += 1
    print(f"{len(names)} runs, {n_tables} tables compared, {bad} differences")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["save", "compare"])
    ap.add_argument("dir", type=Path)
    args = ap.parse_args()
    if args.mode == "save":
        write_all(args.dir)
        return
    with tempfile.TemporaryDirectory(prefix="calib-outputs-") as tmp:
        write_all(Path(tmp))
        sys.exit(compare(args.dir, Path(tmp)))


if __name__ == "__main__":
    main()
