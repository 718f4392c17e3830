"""Hostile input, part 2: mutated contract files, specs, nccl-tests logs and a small trace.

Every case writes one mutated copy of a real input and runs the real command line on it
in-process (``calib.cli.main``, SystemExit captured):

- a calibration JSON fitted from the Polaris nccl-tests logs -> ``calib show FILE --json``
  (one case in sixteen: ``calib predict --calibration FILE``);
- a model YAML (the ``gpt-13b`` preset entry) and a hardware YAML (the ``polaris`` entry of
  ``analytic/data/hardware.yaml``) -> ``calib predict --model/--hardware FILE``;
- nccl-tests logs (fixtures/nccl-tests, both NCCL versions) and a gloo CPU trace
  (fixtures/traces/cpu/ws2_collectives_rank0) -> ``calib ingest FILE`` into a real store;
- published tables (fixtures/published: three adapters' formats and three canonical
  tables) -> ``calib validate FILE --fit none --json`` (one case in eight through an
  every-third fit; since stop 31, when mutating these tables by hand found two tracebacks
  and three silent reads, and this corpus three more: an empty model name, a name too long
  for a file name, a fit through a denormal measurement).

The outcome must be exit 0, or exit 2 with exactly one line ``calib: ...`` naming the
file, and no traceback.  The store (one ingested run and its fitted calibration) is
compared byte for byte (sha256 of every file) after every case: a refused input leaves it
unchanged; an accepted ingest adds only its run, which is then removed again.

Mutations are drawn by hypothesis (derandomized, no database: the same cases every run):
text-level (cut, lines dropped / doubled / swapped, bytes inserted, numbers replaced by
absurd ones, encodings broken) and, for JSON and YAML, structure-level (a value at a random
path replaced by an odd one, removed, wrapped, or a key added); for tables, cell-level (a
cell replaced by an odd value, a column dropped, the rows cut).  The number of cases is
printed at the end; ``test_hostile_inputs.py`` mutates large traces.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from calib.analytic.specs import HARDWARE_FILE, MODELS_FILE
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from calib.cli import main
from tests.conftest import CPU_TRACES, FIXTURES
from tests.hostile_tables import TABLES, mutate_table

#: cases per format: 10,000 in all (about 85 s on the shared 2-core development machine);
#: CALIB_HOSTILE_SCALE multiplies them (0.1 for a quick look)
SCALE = float(os.environ.get("CALIB_HOSTILE_SCALE", "1"))
EXAMPLES = {
    k: max(1, round(SCALE * v))
    for k, v in {
        "calibration": 2400,
        "model": 2600,
        "hardware": 1800,
        "nccl": 2700,
        "trace": 500,
        "table": 400,
    }.items()
}
SUBPROCESS_CASES = int(os.environ.get("CALIB_HOSTILE_SUBPROCESS", "30"))
COUNT = {"cases": 0, "accepted": 0, "refused": 0}
LOGS = sorted(
    p
    for d in ("polaris/n2.g4.2024-04-29-18-41-24", "polaris-nccl2.21/n2.g4.2024-04-29-19-08-14")
    for p in (FIXTURES / "nccl-tests" / d).glob("*_output.dat.1")
)
TRACE = CPU_TRACES["ws2_collectives_rank0"]
HOSTILE_RUN = "hostile"


class World:
    """The store, the base inputs and the snapshot every case is checked against."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = root / "store"
        for args in (
            [
                "ingest",
                str(LOGS[0].parent),
                "--system",
                "polaris",
                "--store",
                str(self.store),
                "--name",
                "n2",
            ],
            ["fit", "--system", "polaris", "--store", str(self.store)],
        ):
            assert run(args)[0] == 0
        self.calibration = (self.store / "polaris" / "polaris.calib.json").read_text()
        self.model = yaml.safe_dump(yaml.safe_load(MODELS_FILE.read_text())["models"]["gpt-13b"])
        self.hardware = yaml.safe_dump(yaml.safe_load(HARDWARE_FILE.read_text())["systems"]["polaris"])
        self.logs = [p.read_bytes() for p in LOGS]
        self.trace = gzip.decompress(TRACE.read_bytes())
        self.tables = [p.read_bytes() for p in TABLES]
        self.snapshot = snapshot(self.store)
        self.work = root / "cases"
        self.work.mkdir()


def snapshot(store: Path) -> dict[str, str]:
    return {
        str(p.relative_to(store)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store.rglob("*"))
        if p.is_file()
    }


def run(args: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


@pytest.fixture(scope="module")
def world(tmp_path_factory, request) -> World:
    w = World(tmp_path_factory.mktemp("hostile-corpus"))
    yield w
    line = (
        f"hostile corpus: {COUNT['cases']} mutated inputs through calib.cli.main "
        f"({COUNT['accepted']} accepted, {COUNT['refused']} refused with one line; store unchanged after each)"
    )
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{line}")


def check(world: World, path: Path, code: int, stderr: str, store: Path | None = None) -> None:
    """The outcome rules of the module docstring, store included."""
    store = store or world.store
    COUNT["cases"] += 1
    assert "Traceback" not in stderr, stderr
    run_path = store / "polaris" / "runs" / HOSTILE_RUN
    if code == 0:
        COUNT["accepted"] += 1
        if run_path.exists():
            assert (run_path / "run.json").is_file() and (run_path / "checksums.sha256").is_file()
            shutil.rmtree(run_path)
    else:
        COUNT["refused"] += 1
        lines = stderr.strip().splitlines()
        assert code == 2, stderr
        assert len(lines) == 1 and lines[0].startswith("calib: "), stderr
        assert path.name in lines[0], f"the error does not name the file: {lines[0]}"
    assert snapshot(store) == world.snapshot, f"store changed (exit {code}: {stderr.strip()})"


def command(kind: str, path: Path, store: Path, variant: int = 0) -> list[str]:
    if kind == "calibration":
        if variant == 0:  # one case in sixteen: the calibration in a prediction
            return ["predict", "--calibration", str(path), "--model", "gpt-125m", "--gpus", "8", "--json"]
        return ["show", str(path), "--json", "--nodes", "2", "--sizes", "1M", "--store", str(store)]
    if kind == "model":
        return ["predict", "--hardware", "polaris", "--model", str(path), "--gpus", "8", "--json"]
    if kind == "hardware":
        return ["predict", "--hardware", str(path), "--model", "gpt-125m", "--gpus", "8", "--json"]
    if kind == "table":  # one case in eight through a fit (the cheapest: the GEMM plateau alone)
        fit = ["--calibrate-on", "every-third", "--fit", "ymax"] if variant % 8 == 0 else ["--fit", "none"]
        return ["validate", str(path), *fit, "--json"]
    return ["ingest", str(path), "--system", "polaris", "--store", str(store), "--name", HOSTILE_RUN]


# ---- mutations --------------------------------------------------------------------------------
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from([0, -1, 1, 2**63, -(2**63), 10**400, 1e308, -1e308, 1e-320, 0.5, -0.0]),
    st.sampled_from([float("nan"), float("inf"), float("-inf")]),
    st.text(max_size=12),
    st.sampled_from(["", "NaN", "1e999", "0x10", "８", "\u202e", "\x00", "a" * 300]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.sampled_from(["value", "x", "status", ""]), st.integers(-2, 2), max_size=2),
)
ODD_NUMBER = st.sampled_from(
    [
        b"0",
        b"-1",
        b"nan",
        b"inf",
        b"-inf",
        b"1e308",
        b"1e-320",
        b"99999999999999999999999",
        b"-0",
        b"1.5.3",
        b"",
        b"N/A",
        b"0x1F",
        b"1,5",
        b"\xff",
    ]  # fmt: skip
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):  # the first entries of long lists are enough
            yield from _paths(v, (*prefix, i))


_PATHS: dict[int, list[tuple]] = {}


def _at(doc, path: tuple):
    """The parent of ``path`` in ``doc``, or None when an earlier mutation removed it."""
    parent = doc
    for k in path[:-1]:
        try:
            parent = parent[k]
        except (KeyError, IndexError, TypeError):
            return None
    ok = isinstance(parent, dict) and path[-1] in parent
    ok = ok or (isinstance(parent, list) and isinstance(path[-1], int) and path[-1] < len(parent))
    return parent if ok else None


def mutate_structure(doc, data, base_key: int):
    """One structural change at a random path of a decoded JSON/YAML document (paths of
    the unmutated document, listed once per base)."""
    if base_key not in _PATHS:
        _PATHS[base_key] = [p for p in _paths(doc) if p]
    paths = _PATHS[base_key]
    if not paths or not isinstance(doc, (dict, list)):
        return data.draw(ODD)
    path = data.draw(st.sampled_from(paths))
    parent = _at(doc, path)
    if parent is None:
        return doc
    key = path[-1]
    how = data.draw(st.sampled_from(["odd", "odd", "drop", "wrap", "add_key", "scale"]))
    if how == "odd":
        parent[key] = data.draw(ODD)
    elif how == "drop":
        del parent[key]
    elif how == "wrap":
        parent[key] = data.draw(st.sampled_from([[parent[key]], {"value": parent[key]}, str(parent[key])]))
    elif how == "add_key":
        target = parent[key] if isinstance(parent[key], dict) else parent
        if isinstance(target, dict):
            target[data.draw(st.sampled_from(["bogus", "VALUE", "value ", "extra_field"]))] = 1
    elif isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
        factor = data.draw(st.sampled_from([-1, 0, 1e300, 1e-300, 2**70]))
        try:
            parent[key] = parent[key] * factor
        except OverflowError:  # an int beyond float range times a float
            parent[key] = float("inf")
    return doc


def mutate_text(blob: bytes, data) -> bytes:
    """One text-level change of a file's bytes."""
    how = data.draw(st.sampled_from(["cut", "lines", "number", "number", "insert", "encoding", "empty"]))
    if how == "cut":
        return blob[: data.draw(st.integers(0, len(blob)))]
    if how == "empty":
        return data.draw(st.sampled_from([b"", b"\n", b"{}", b"[]", b"null", b"---\n", b"\x00" * 8]))
    if how == "encoding":
        pre = data.draw(st.sampled_from([b"\xef\xbb\xbf", b"\xff\xfe", b"", b"\x1f\x8b"]))
        body = blob.replace(b"\n", b"\r\n") if data.draw(st.booleans()) else blob
        i = data.draw(st.integers(0, len(body)))
        return (
            pre
            + body[:i]
            + data.draw(st.sampled_from([b"", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"]))
            + body[i:]
        )
    if how == "insert":
        i = data.draw(st.integers(0, len(blob)))
        return blob[:i] + data.draw(st.binary(min_size=1, max_size=16)) + blob[i:]
    lines = blob.split(b"\n")
    if how == "lines":
        for _ in range(data.draw(st.integers(1, 6))):
            i = data.draw(st.integers(0, len(lines) - 1))
            op = data.draw(st.sampled_from(["drop", "double", "swap"]))
            if op == "drop" and len(lines) > 1:
                lines.pop(i)
            elif op == "double":
                lines.insert(i, lines[i])
            else:
                j = data.draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
        return b"\n".join(lines)
    # number: replace whitespace-separated numeric fields of a few lines
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(lines) - 1))
        fields = lines[i].split(b" ")
        nums = [k for k, f in enumerate(fields) if f[:1].isdigit() or f[:1] == b"-"]
        if nums:
            fields[data.draw(st.sampled_from(nums))] = data.draw(ODD_NUMBER)
            lines[i] = b" ".join(fields)
    return b"\n".join(lines)


def mutated(kind: str, world: World, data) -> tuple[bytes, str]:
    """A mutated copy of the base input of ``kind`` and its file suffix."""
    if kind == "nccl":
        return mutate_text(data.draw(st.sampled_from(world.logs)), data), ".dat.1"
    if kind == "table":
        blob = data.draw(st.sampled_from(world.tables))
        return (mutate_text(blob, data) if data.draw(st.booleans()) else mutate_table(blob, data)), ".csv"
    base, suffix = {
        "calibration": (world.calibration, ".calib.json"),
        "model": (world.model, ".yaml"),
        "hardware": (world.hardware, ".yaml"),
        "trace": (world.trace.decode(), ".pt.trace.json"),
    }[kind]
    if data.draw(st.booleans()):
        return mutate_text(base.encode(), data), suffix
    doc = json.loads(base) if suffix.endswith("json") else yaml.safe_load(base)
    for _ in range(data.draw(st.integers(1, 3))):
        doc = mutate_structure(doc, data, hash(base))
    if suffix.endswith("json"):
        text = json.dumps(doc, allow_nan=True, default=str)
    else:
        text = yaml.safe_dump(doc, allow_unicode=data.draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass"), suffix


def one_case(kind: str, world: World, data) -> None:
    blob, suffix = mutated(kind, world, data)
    if kind == "trace" and data.draw(st.booleans()):
        blob, suffix = gzip.compress(blob, 1), suffix + ".gz"
    path = world.work / f"case-{COUNT['cases']}{suffix}"
    path.write_bytes(blob)
    variant = data.draw(st.integers(0, 15)) if kind == "table" else COUNT["cases"] % 16  # replayable
    code, stderr = run(command(kind, path, world.store, variant))
    check(world, path, code, stderr)
    path.unlink()


HYPOTHESIS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # no shrinking: failures are reported as drawn
    suppress_health_check=list(HealthCheck),
)


@settings(HYPOTHESIS, max_examples=EXAMPLES["calibration"])
@given(data=st.data())
def test_mutated_calibration(world, data) -> None:
    one_case("calibration", world, data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["model"])
@given(data=st.data())
def test_mutated_model_yaml(world, data) -> None:
    one_case("model", world, data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["hardware"])
@given(data=st.data())
def test_mutated_hardware_yaml(world, data) -> None:
    one_case("hardware", world, data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["nccl"])
@given(data=st.data())
def test_mutated_nccl_tests_log(world, data) -> None:
    one_case("nccl", world, data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["trace"])
@given(data=st.data())
def test_mutated_small_trace(world, data) -> None:
    one_case("trace", world, data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["table"])
@given(data=st.data())
def test_mutated_published_table(world, data) -> None:
    one_case("table", world, data)


def test_through_the_real_command_line(world) -> None:
    """Cases of every kind through the installed ``calib`` entry point, one process each
    (``CALIB_HOSTILE_SUBPROCESS`` cases, default 30: each costs a Python start), two at a
    time, each on its own copy of the store."""
    calib = Path(sys.executable).with_name("calib")
    kinds = sorted(EXAMPLES)
    cases: list[tuple[Path, list[str], Path]] = []
    serial = itertools.count()

    @settings(HYPOTHESIS, max_examples=SUBPROCESS_CASES)
    @given(data=st.data())
    def draw(data) -> None:
        kind = data.draw(st.sampled_from(kinds))
        blob, suffix = mutated(kind, world, data)
        case_dir = world.work / f"proc-{next(serial)}"
        shutil.copytree(world.store, case_dir / "store")
        path = case_dir / f"input{suffix}"
        path.write_bytes(blob)
        args = command(kind, path, case_dir / "store", len(cases) % 16)
        cases.append((path, [str(calib), *args], case_dir / "store"))

    draw()

    def one(case):
        path, argv, _ = case
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=path.parent)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, cases))
    for (path, _, store), proc in zip(cases, results, strict=True):
        check(world, path, proc.returncode, proc.stderr, store)
    assert len(cases) >= SUBPROCESS_CASES
