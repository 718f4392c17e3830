"""``calib runs``: list what the store holds; ``--check`` verifies every stored run."""

from __future__ import annotations

from pathlib import Path

import click

from calib.core.errors import InputError
from calib.core.store import calibration_path, check_name, default_store, list_runs, list_systems, run_paths


@click.command(name="runs")
@click.option("--system", help="Only this system.")
@click.option(
    "--store",
    type=click.Path(path_type=Path),
    help="Store directory (default ./calib-store or $CALIB_STORE).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Verify every stored run against its schema and checksums; exit 1 if one is bad.",
)
def runs(system: str | None, store: Path | None, check: bool):
    """List the stored runs: system, run name, kind, ranks, rows and source files.

    Trace runs show their ranks and iterations; nccl-tests runs their samples, setups
    and node counts.  A system's fitted calibration, if any, is listed after its runs.

    With --check, each run is verified instead: run.json against the run contract, each
    table's columns, types and schema version, and every file against the run's
    checksums.sha256.  One line per run: ok, unverifiable (a run written before calib
    kept checksums; its schema is still checked) or BAD with the problems.  Exit status 1
    when any run is bad.
    """
    store = store or default_store()
    if system:
        check_name("system", system)
        if system not in list_systems(store):
            known = ", ".join(list_systems(store)) or "none"
            raise InputError("--system", f"no runs for system '{system}' in {store} (systems: {known})")
    if check:
        _check(store, system)
        return
    all_runs = list_runs(store, system)
    if not all_runs:
        click.echo(f"no runs in {store}")
        return
    rows = []
    for r in all_runs:
        m = r.meta
        if r.has("samples"):
            s = r.table("samples")
            what = (
                f"{len(s)} samples; setups {_join(s['setup'])}; nodes {_join(s['nnodes'])}; "
                f"{_join(s['collective'])}"
            )
        elif r.has("buckets"):
            b = r.table("buckets")
            what = (
                f"{b['rank'].nunique()} rank(s) x {b['iteration'].nunique()} iteration(s); {m.framework.name}"
            )
        else:
            what = ", ".join(m.tables)
        rows.append((m.system or "unassigned", m.name, m.kind, str(len(m.sources)), what))
    widths = [
        max(len(x[i]) for x in [("system", "run", "kind", "files", "contents"), *rows]) for i in range(4)
    ]
    header = ("system", "run", "kind", "files", "contents")
    for row in [header, *rows]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4])
    for sys_name in sorted({r[0] for r in rows}):
        path = calibration_path(store, sys_name)
        if path.is_file():
            click.echo(f"calibration of {sys_name}: {path}")


def _join(col) -> str:
    return ",".join(str(v) for v in sorted(col.unique().tolist()))


def _check(store: Path, system: str | None) -> None:
    from calib.core.verify import BAD, verify_run

    paths, leftovers = run_paths(store, system)
    if not paths:
        click.echo(f"no runs in {store}")
    checks = [verify_run(p) for p in paths]
    for c in checks:
        click.echo(c.line())
    for p in leftovers:
        click.echo(
            f"leftover      {p}: temporary directory of an interrupted write (not a run; safe to delete)"
        )
    bad = [c for c in checks if c.status == BAD]
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "unverifiable", BAD)}
    click.echo(
        f"{len(checks)} run(s): {counts['ok']} ok, {counts['unverifiable']} unverifiable, {counts[BAD]} bad"
    )
    if bad:
        names = ", ".join(f"{c.path.parent.parent.name}/{c.path.name}" for c in bad)
        click.echo(f"calib: {store}: bad run(s): {names}", err=True)
        raise SystemExit(1)
