"""Hostile input: real traces mutated every which way never give a traceback.

Each case runs the real command line (``calib.cli.main``, in-process, SystemExit
captured) on a mutated copy of a real trace, half of the cases through the streaming
reader (``--max-memory 4M``).  The outcome must be one of:

- a correct ingest: exit 0, a complete run whose buckets sum to the wall time within
  0.1 % and are never negative; or
- bad input: exit 2, exactly one line ``calib: <file>: <problem>`` on stderr, and
  nothing written (no run directory, no temporary directory left behind).

Hypothesis draws the mutations (derandomized: CI sees the same cases every time); the
number of cases run is printed at the end of the module.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import math
import random
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from calib.cli import main
from calib.core.schema import BUCKET_PARTS
from tests.conftest import CPU_TRACES, GPU_TRACES

BASES = {
    "gpu": GPU_TRACES["sampled_rank-0"],  # Kineto GPU trace: kernels, runtime, NCCL
    "cpu": CPU_TRACES["ws2_collectives_rank0"],  # gloo CPU trace: collectives with shapes
    "cpu_ddp": CPU_TRACES["ws2_ddp_rank0"],  # record_shapes CPU training, ProfilerSteps
}
PAIR = (CPU_TRACES["ws2_ddp_rank0"], CPU_TRACES["ws2_ddp_rank1"])  # a 2-rank run
#: cases per hypothesis test, by cost (a 2-rank or CPU-training case takes about 1 s): about
#: 40 s in all on the shared 2-core development machine; test_hostile_corpus.py mutates the
#: other inputs (10,000 cases)
EXAMPLES = {"cpu": 80, "gpu": 25, "cpu_ddp": 8, "pair": 8}
COUNT = {"cases": 0, "ingested": 0, "refused": 0}

_DOCS: dict[str, dict] = {}


def base_doc(key: str) -> dict:
    if key not in _DOCS:
        _DOCS[key] = json.loads(gzip.decompress(BASES[key].read_bytes()))
    return copy.deepcopy(_DOCS[key])


@pytest.fixture(scope="module", autouse=True)
def report_count(request):
    yield
    line = (
        f"hostile inputs: {COUNT['cases']} cases through the CLI "
        f"({COUNT['ingested']} ingested with invariants checked, {COUNT['refused']} refused with one line)"
    )
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{line}")


def run_cli(paths: list[Path], work: Path, streamed: bool) -> None:
    """One case through ``calib ingest``: a clean run or one clean error line."""
    out = work / "out"
    args = ["ingest", *map(str, paths), "--out", str(out), "--name", "hostile"]
    if streamed:  # these traces need 5-12 MB in memory: 4 MiB forces the streaming reader
        args += ["--max-memory", "4M"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code
    COUNT["cases"] += 1
    stderr = err.getvalue()
    leftovers = [p.name for p in work.iterdir() if p.name.startswith(".")]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    if code == 0:
        COUNT["ingested"] += 1
        check_run(out)
    else:
        COUNT["refused"] += 1
        lines = stderr.strip().splitlines()
        assert code == 2, stderr
        assert len(lines) == 1 and lines[0].startswith("calib: "), stderr
        assert "Traceback" not in stderr
        assert not out.exists(), "a failed ingest left a run behind"


def check_run(out: Path) -> None:
    assert (out / "run.json").is_file()
    b = pd.read_parquet(out / "buckets.parquet")
    assert len(b)
    parts = b[list(BUCKET_PARTS)]
    assert (parts.to_numpy() >= -1e-12).all(), b
    assert (b["wall_s"] >= 0).all()
    total = parts.sum(axis=1).to_numpy()
    wall = b["wall_s"].to_numpy()
    assert all(math.isclose(t, w, rel_tol=1e-3, abs_tol=1e-9) for t, w in zip(total, wall, strict=True)), b
    assert (b["comm_exposed_s"] <= b["comm_s"] + 1e-12).all()


# ---- mutations: each takes the decoded document and the hypothesis data -------------

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
ABSURD = st.sampled_from([0, -1, 1e-320, 1e308, -1e308, 2**63, 2**64 + 1, -(2**63), 10**30, 1e15, 0.5])
NAMES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "<script>alert('x')</script>",
            "&amp;&lt;b&gt;",
            '"}],"traceEvents":[',
            "ProfilerStep#99999999999999999999999",
            "ProfilerStep#-1",
            "ProfilerStep#",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "gloo:all_reduce",
            "模型训练 🚀 \u202e",
            "\x00\x01\x1f",
        ]
    ),
)
FIELDS = ["ph", "ts", "dur", "name", "cat", "pid", "tid", "args"]
ARG_KEYS = [
    "correlation",
    "External id",
    "stream",
    "device",
    "Input Dims",
    "Input type",
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "dtype",
    "Process Group Name",
    "Seq",
]


def _events(doc) -> list:
    ev = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return ev if isinstance(ev, list) else []


def _pick(doc, data) -> dict | None:
    ev = [e for e in _events(doc) if isinstance(e, dict)]
    return data.draw(st.sampled_from(ev)) if ev else None


def drop_field(doc, data) -> None:
    for _ in range(data.draw(st.integers(1, 20))):
        e = _pick(doc, data)
        if e is None:
            return
        key = data.draw(st.sampled_from(FIELDS + [f"args.{k}" for k in ARG_KEYS]))
        if key.startswith("args."):
            if isinstance(e.get("args"), dict):
                e["args"].pop(key[5:], None)
        else:
            e.pop(key, None)


def wrong_type(doc, data) -> None:
    for _ in range(data.draw(st.integers(1, 5))):
        e = _pick(doc, data)
        if e is None:
            return
        key = data.draw(st.sampled_from(FIELDS + [f"args.{k}" for k in ARG_KEYS]))
        value = data.draw(ODD_VALUES)
        if key.startswith("args."):
            if not isinstance(e.get("args"), dict):
                e["args"] = {}
            e["args"][key[5:]] = value
        else:
            e[key] = value


def bad_duration(doc, data) -> None:
    e = _pick(doc, data)
    if e is not None:
        e["dur"] = data.draw(st.sampled_from([-1, -1e9, float("nan"), float("inf"), "NaN", -0.0]))


def odd_names(doc, data) -> None:
    for _ in range(data.draw(st.integers(1, 30))):
        e = _pick(doc, data)
        if e is not None:
            e["name"] = data.draw(NAMES)


def duplicate(doc, data) -> None:
    ev = _events(doc)
    for _ in range(data.draw(st.integers(1, 50))):
        if ev:
            i = data.draw(st.integers(0, len(ev) - 1))
            ev.insert(data.draw(st.integers(0, len(ev))), copy.deepcopy(ev[i]))


def unsort(doc, data) -> None:
    ev = _events(doc)
    random.Random(data.draw(st.integers(0, 2**16))).shuffle(ev)


def absurd_numbers(doc, data) -> None:
    for _ in range(data.draw(st.integers(1, 5))):
        e = _pick(doc, data)
        if e is None:
            return
        key = data.draw(
            st.sampled_from(["ts", "dur", "pid", "tid", "args.correlation", "args.In msg nelems"])
        )
        value = data.draw(ABSURD)
        if key.startswith("args."):
            e.setdefault("args", {})
            if isinstance(e["args"], dict):
                e["args"][key[5:]] = value
        else:
            e[key] = value


def absurd_shapes(doc, data) -> None:
    for e in _events(doc):
        if isinstance(e, dict) and isinstance(e.get("args"), dict) and "Input Dims" in e["args"]:
            e["args"]["Input Dims"] = data.draw(
                st.sampled_from([[[2**40, 2**40], [2**40, 2**40]], [[-1, 3], [3, -7]], [[]], "x", [[1.5, 2]]])
            )
            if data.draw(st.booleans()):
                return


def mangle_metadata(doc, data) -> None:
    if isinstance(doc, dict):
        key = data.draw(st.sampled_from(["distributedInfo", "deviceProperties", "traceEvents"]))
        if key == "traceEvents":
            doc[key] = data.draw(st.sampled_from([[], None, {}, "events", [1, 2, 3], [[]]]))
        else:
            doc[key] = data.draw(
                st.one_of(ODD_VALUES, st.fixed_dictionaries({"rank": ODD_VALUES, "world_size": ODD_VALUES}))
            )


def remove_kind(doc, data) -> None:
    cat = data.draw(st.sampled_from(["kernel", "cuda_runtime", "cpu_op", "user_annotation", "gpu_memcpy"]))
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        doc["traceEvents"] = [
            e for e in doc["traceEvents"] if not (isinstance(e, dict) and e.get("cat") == cat)
        ]


def many_threads(doc, data) -> None:
    """Thousands of distinct threads: every thread gets its own slice of the key space."""
    seed = data.draw(st.integers(0, 2**16))
    rng = random.Random(seed)
    for e in _events(doc):
        if isinstance(e, dict) and rng.random() < 0.5:
            e["tid"] = rng.randrange(1 << 62)


MUTATIONS: dict[str, Callable] = {
    f.__name__: f
    for f in (
        drop_field,
        wrong_type,
        bad_duration,
        odd_names,
        duplicate,
        unsort,
        absurd_numbers,
        absurd_shapes,
        mangle_metadata,
        remove_kind,
        many_threads,
    )
}


def encode(doc, data) -> tuple[bytes, str]:
    text = json.dumps(doc, ensure_ascii=data.draw(st.booleans()), allow_nan=True).encode(
        "utf-8", "surrogatepass"
    )
    if data.draw(st.integers(0, 4)) == 0:  # one case in five: cut at a random byte
        text = text[: data.draw(st.integers(0, len(text)))]
    if data.draw(st.booleans()):
        blob = gzip.compress(text, 1)
        if data.draw(st.integers(0, 5)) == 0:
            blob = blob[: data.draw(st.integers(0, len(blob)))]
        return blob, ".json.gz"
    return text, ".json"


HYPOTHESIS = settings(
    max_examples=max(EXAMPLES.values()),
    derandomize=True,
    database=None,
    deadline=None,
    # no shrinking: a failure is reported as drawn (derandomized, so reproducible), in
    # seconds rather than the minutes shrinking a multi-megabyte document takes
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def mutated_trace(base: str, data) -> None:
    doc = base_doc(base)
    for name in data.draw(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=3)):
        MUTATIONS[name](doc, data)
    blob, suffix = encode(doc, data)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / f"rank0.pt.trace{suffix}"
        path.write_bytes(blob)
        run_cli([path], work, streamed=data.draw(st.booleans()))


@settings(HYPOTHESIS, max_examples=EXAMPLES["cpu"])
@given(data=st.data())
def test_mutated_gloo_collectives_trace(data) -> None:
    mutated_trace("cpu", data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["gpu"])
@given(data=st.data())
def test_mutated_gpu_trace(data) -> None:
    mutated_trace("gpu", data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["cpu_ddp"])
@given(data=st.data())
def test_mutated_cpu_training_trace(data) -> None:
    mutated_trace("cpu_ddp", data)


@settings(HYPOTHESIS, max_examples=EXAMPLES["pair"])
@given(data=st.data())
def test_mutated_rank_in_a_two_rank_run(data) -> None:
    """One good rank and one mutated rank: cross-rank analysis sees hostile collectives."""
    doc = json.loads(gzip.decompress(PAIR[1].read_bytes()))
    for name in data.draw(st.lists(st.sampled_from(sorted(MUTATIONS)), min_size=1, max_size=2)):
        MUTATIONS[name](doc, data)
    blob, suffix = encode(doc, data)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ranks = work / "ranks"
        ranks.mkdir()
        (ranks / "rank0.pt.trace.json.gz").write_bytes(PAIR[0].read_bytes())
        (ranks / f"rank1.pt.trace{suffix}").write_bytes(blob)
        run_cli([ranks], work, streamed=data.draw(st.booleans()))


@pytest.mark.parametrize("streamed", [False, True], ids=["in_memory", "streamed"])
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: gzip.compress(b" " * (256 << 20), 9), id="bomb_spaces"),
        pytest.param(
            lambda: gzip.compress(b'{"traceEvents": [' + b"0," * (128 << 20) + b"0]}", 9), id="bomb_zeros"
        ),
        pytest.param(
            lambda: gzip.compress(
                b'{"traceEvents": [' + b'{"ph":"X","ts":1,"dur":1},' * (8 << 20) + b'{"ph":"X"}]}', 9
            ),
            id="bomb_events",
        ),
    ],
)
def test_gzip_bomb(make, streamed: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / "bomb.json.gz"
        path.write_bytes(make())
        run_cli([path], work, streamed=streamed)


def _first_x(doc: dict, cat: str | None = None) -> dict:
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and (cat is None or e.get("cat") == cat))


#: the crashes this suite found, kept as fixed cases (each was a traceback before its fix)
REGRESSIONS = {
    "name_is_a_list": lambda d: _first_x(d).update(name=["a"]),
    "pid_is_an_object": lambda d: _first_x(d).update(pid={"x": 1}),
    "step_number_beyond_int64": lambda d: _first_x(d).update(name="ProfilerStep#99999999999999999999999"),
    "timestamp_1e300": lambda d: _first_x(d).update(ts=1e300),
    "timestamps_pm_1e308": lambda d: (_first_x(d).update(ts=1e308), _first_x(d, "kernel").update(ts=-1e308)),
    "correlation_2_pow_63": lambda d: _first_x(d, "kernel")["args"].update(correlation=2**63),
}


@pytest.mark.parametrize("streamed", [False, True], ids=["in_memory", "streamed"])
@pytest.mark.parametrize("case", sorted(REGRESSIONS))
def test_found_crashes_stay_fixed(case: str, streamed: bool) -> None:
    doc = base_doc("gpu")
    REGRESSIONS[case](doc)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / "rank0.json"
        path.write_text(json.dumps(doc))
        run_cli([path], work, streamed=streamed)


def test_streamed_cases_do_stream() -> None:
    """The 4 MiB budget of the streamed cases is below what the larger bases need in memory."""
    from calib.ingest.budget import fits_in_memory

    assert not fits_in_memory(BASES["gpu"], 4 << 20)
    assert not fits_in_memory(BASES["cpu_ddp"], 4 << 20)
    assert not fits_in_memory(PAIR[1], 4 << 20)
