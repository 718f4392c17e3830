"""The store never loses a run: refusal, --replace, the writer lock, and ``calib runs --check``.

Real ``calib`` processes on real fixture traces; the concurrent tests start two at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from calib.core.errors import InputError
from calib.core.rundir import MANIFEST, VERSION_KEY, read_run
from calib.core.store import LOCK_FILE

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "fixtures" / "traces" / "generated" / "ddp-d64-ws2"
OTHER = ROOT / "fixtures" / "traces" / "generated" / "ddp-d128-ws2"


def calib(*args: str, store: Path, wait: bool = True):
    cmd = [sys.executable, "-m", "calib.cli", *args, "--store", str(store)]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def snapshot(store: Path) -> dict[str, str]:
    """Every file of the store (hidden ones too, the lock file aside) with its sha256."""
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.rglob("*"))
        if p.is_file() and p.name != LOCK_FILE
    }


def one_line_refusal(proc, option: str = "--name") -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"calib: {option}: a run '"), proc.stderr
    assert "--replace" in lines[0] and "Traceback" not in proc.stderr


def test_existing_name_is_refused_then_replaced_atomically(tmp_path: Path) -> None:
    store = tmp_path / "store"
    assert calib("ingest", str(SMALL), "--system", "s", "--name", "x", store=store).returncode == 0
    before = snapshot(store)
    refused = calib("ingest", str(OTHER), "--system", "s", "--name", "x", store=store)
    one_line_refusal(refused)
    assert snapshot(store) == before, "a refused ingest changed the store"
    done = calib("ingest", str(OTHER), "--system", "s", "--name", "x", "--replace", store=store)
    assert done.returncode == 0, done.stderr
    run = read_run(store / "s" / "runs" / "x")
    assert {Path(s.path).parent.name for s in run.meta.sources} == {OTHER.name}
    assert not [p for p in (store / "s" / "runs").iterdir() if p.name != "x"], "leftovers after replace"
    check = calib("runs", "--check", store=store)
    assert check.returncode == 0 and check.stdout.startswith("ok "), check.stdout


def test_out_directory_holding_a_run_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ("ingest", str(SMALL), "--out", str(out))
    assert calib(*args, store=tmp_path / "store").returncode == 0
    one_line_refusal(calib(*args, store=tmp_path / "store"), "--out")
    assert calib(*args, "--replace", store=tmp_path / "store").returncode == 0


@pytest.mark.parametrize("names", [("same", "same"), ("one", "two")], ids=["same-name", "different-names"])
def test_two_concurrent_ingests(tmp_path: Path, names: tuple[str, str]) -> None:
    store = tmp_path / "store"
    procs = [
        calib("ingest", str(path), "--system", "s", "--name", name, store=store, wait=False)
        for path, name in zip((SMALL, OTHER), names)
    ]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    runs = sorted(p.name for p in (store / "s" / "runs").iterdir())
    if names[0] == names[1]:
        assert codes == [0, 2], results
        loser = next(r for r in results if r[0] == 2)
        one_line_refusal(subprocess.CompletedProcess([], loser[0], loser[1], loser[2]))
        assert runs == ["same"], f"the store holds {runs}"
    else:
        assert codes == [0, 0], results
        assert runs == ["one", "two"]
    check = calib("runs", "--check", store=store)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("\nok ") + check.stdout.startswith("ok ") == len(runs)


def test_a_writer_waits_for_the_lock_and_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    fd = os.open(store / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another writer holds the store
    try:
        proc = calib("ingest", str(SMALL), "--system", "s", "--name", "x", store=store, wait=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None and not (store / "s").exists():
            time.sleep(0.2)
        time.sleep(3.0)  # longer than the lock's notice delay
        assert proc.poll() is None, "the writer did not wait for the lock"
        assert not (store / "s").exists(), "the writer wrote while the lock was held"
    finally:
        os.close(fd)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert f"calib: waiting for another calib writing to {store}" in err
    assert (store / "s" / "runs" / "x" / MANIFEST).is_file()


def test_bench_agrees_with_ingest(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ("bench", "gemm", "--sizes", "8", "-w", "0", "-n", "1", "-r", "1", "--name", "g", "--system", "s")
    assert calib(*args, store=store).returncode == 0
    one_line_refusal(calib(*args, store=store))
    assert calib(*args, "--replace", store=store).returncode == 0
    assert calib("runs", "--check", store=store).returncode == 0


def _ingest(store: Path, name: str, path: Path = SMALL) -> Path:
    proc = calib("ingest", str(path), "--system", "s", "--name", name, store=store)
    assert proc.returncode == 0, proc.stderr
    return store / "s" / "runs" / name


def _strip_version(path: Path) -> None:
    table = pq.read_table(path)
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k != VERSION_KEY}
    pq.write_table(table.replace_schema_metadata(meta), path)


def test_runs_check_names_bad_runs_and_tolerates_old_ones(tmp_path: Path) -> None:
    store = tmp_path / "store"
    good = _ingest(store, "good")
    old = _ingest(store, "old")  # as written before manifests and table metadata
    (old / MANIFEST).unlink()
    _strip_version(old / "buckets.parquet")
    assert read_run(old).table("buckets").shape[0] > 0  # old tables stay readable
    check = calib("runs", "--check", store=store)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"ok            {good}" in check.stdout and f"unverifiable  {old}" in check.stdout

    tampered = _ingest(store, "tampered")
    meta = json.loads((tampered / "run.json").read_text())
    meta["world_size"] = 64
    (tampered / "run.json").write_text(json.dumps(meta))
    unversioned = _ingest(store, "unversioned")
    _strip_version(unversioned / "kernels.parquet")
    check = calib("runs", "--check", store=store)
    assert check.returncode == 1
    assert f"BAD           {tampered}: run.json: checksum differs" in check.stdout
    assert (
        f"BAD           {unversioned}: kernels.parquet: table carries no calib schema version" in check.stdout
    )
    assert check.stderr.strip() == f"calib: {store}: bad run(s): s/tampered, s/unversioned"


def test_newer_table_version_is_one_clear_error(tmp_path: Path) -> None:
    run = _ingest(tmp_path / "store", "x")
    path = run / "buckets.parquet"
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, VERSION_KEY: b"99"}), path)
    with pytest.raises(InputError, match="table schema version 99 is not one this calib understands"):
        read_run(run).table("buckets")
    proc = calib("runs", store=tmp_path / "store")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"calib: {path}: table schema version 99 is not one this calib understands (1..1)"
    ]


def test_unknown_key_in_run_json_is_an_error(tmp_path: Path) -> None:
    run = _ingest(tmp_path / "store", "x")
    meta = json.loads((run / "run.json").read_text())
    meta["framework"]["zero_stag"] = 2
    (run / "run.json").write_text(json.dumps(meta))
    proc = calib("runs", store=tmp_path / "store")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(
        f"calib: {run / 'run.json'}: malformed run.json: unknown field(s) 'zero_stag' in framework"
    )
