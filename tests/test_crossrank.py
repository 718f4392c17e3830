"""Cross-rank matching and the transfer/wait split, checked against the trace files themselves."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from calib.ingest import crossrank
from calib.ingest.orchestrate import IngestOptions, ingest

from tests.conftest import CPU_TRACES, FIXTURES, HTA

GENERATED = FIXTURES / "traces" / "generated"
JOBS = {
    "gloo_ddp_ws2": [CPU_TRACES["ws2_ddp_rank0"], CPU_TRACES["ws2_ddp_rank1"]],
    "nccl_trace_filter": sorted((HTA / "trace_filter").glob("*.json.gz")),
    "gloo_ddp_ws4": sorted((GENERATED / "ddp-d128-ws4").glob("rank*.json*")),
}


@pytest.fixture(scope="module", params=sorted(JOBS))
def job(request):
    files = JOBS[request.param]
    if len(files) < 2:
        pytest.skip(f"{request.param}: traces not generated yet")
    meta, tables = ingest(files, IngestOptions(name=request.param))
    return request.param, files, meta, tables


def test_every_call_matched_on_every_rank(job) -> None:
    name, files, meta, t = job
    c, cr = t["collectives"], t["crossrank"]
    assert len(cr) == len(c)
    per_rank = c.groupby("rank").size()
    assert per_rank.nunique() == 1, per_rank  # these jobs issue the same calls on every rank
    assert (cr["n_ranks"] == len(files)).all()
    assert cr["match_id"].nunique() == per_rank.iloc[0]
    assert (cr.groupby("rank").size() == per_rank).all()
    # a match never pairs different collectives or sizes
    g = cr.groupby("match_id")
    assert (g["collective"].nunique() == 1).all() and (g["bytes"].nunique() == 1).all()
    assert (g["rank"].nunique() == len(files)).all()


def test_wait_plus_transfer_is_the_duration(job) -> None:
    _, _, _, t = job
    cr = t["crossrank"]
    np.testing.assert_array_equal(cr["wait_s"] + cr["transfer_s"], cr["dur_s"])
    assert (cr["wait_s"] >= 0).all()
    g = cr.groupby("match_id")
    np.testing.assert_array_equal(g["transfer_s"].first(), g["dur_s"].min())
    last = cr[cr["rank"] == cr["straggler_rank"]]
    assert len(last) == cr["match_id"].nunique()  # one straggler per call
    assert (last["wait_s"] == 0).all()


def _gloo_calls(path: Path) -> pd.DataFrame:
    """The gloo work items of one rank, read straight from the JSON (not via calib)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    rows = [
        (e["name"], json.dumps(e["args"].get("Input Dims")), e["ts"], e["dur"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:")
    ]
    df = pd.DataFrame(rows, columns=["name", "dims", "ts", "dur"]).sort_values("ts", kind="stable")
    df["n"] = df.groupby(["name", "dims"]).cumcount()
    return df


def test_transfer_is_the_faster_ranks_time_in_the_files() -> None:
    """ws2 DDP: pair the n-th gloo call of each name and shape on both ranks, by hand."""
    files = JOBS["gloo_ddp_ws2"]
    _, t = ingest(files, IngestOptions(name="x"))
    a, b = (_gloo_calls(f) for f in files)
    pairs = a.merge(b, on=["name", "dims", "n"], suffixes=("0", "1"))
    assert len(pairs) == len(a) == len(b) == 8
    expect = np.sort(np.minimum(pairs["dur0"], pairs["dur1"]).to_numpy() * 1e-6)
    got = np.sort(t["crossrank"].drop_duplicates("match_id")["transfer_s"].to_numpy())
    np.testing.assert_allclose(got, expect, rtol=0, atol=1e-9)
    waits = np.sort(np.abs(pairs["dur0"] - pairs["dur1"]).to_numpy() * 1e-6)
    got_w = np.sort(t["crossrank"].groupby("match_id")["wait_s"].max().to_numpy())
    np.testing.assert_allclose(got_w, waits, rtol=0, atol=1e-9)


def test_stragglers_per_iteration(job) -> None:
    _, files, meta, t = job
    cr, b = t["crossrank"], t["buckets"]
    s = crossrank.stragglers(cr)
    assert list(s["iteration"]) == sorted(cr["match_iteration"].unique())
    for row in s.itertuples():
        m = cr[cr["match_iteration"] == row.iteration]
        assert row.n_collectives == m["match_id"].nunique()
        caused = m[m["straggler_rank"] == row.slowest_rank]["wait_s"].sum()
        assert row.caused_wait_s == pytest.approx(caused)
        # nobody caused more waiting than the slowest rank
        assert caused >= m.groupby("straggler_rank")["wait_s"].sum().max() - 1e-15
        assert row.wait_s == pytest.approx(m["wait_s"].sum())
        assert row.worst_wait_s == pytest.approx(m.groupby("rank")["wait_s"].sum().max())
        # waiting is part of a rank's communication time, never more
        comm = b[b["iteration"] == row.iteration].set_index("rank")["comm_s"]
        per_rank_wait = m.groupby("rank")["wait_s"].sum()
        assert (per_rank_wait <= comm.reindex(per_rank_wait.index) + 1e-9).all()
    r = crossrank.rank_summary(cr)
    assert r["last_arrivals"].sum() == cr["match_id"].nunique()
    assert sorted(r["rank"]) == list(meta.ranks)


def test_sequence_numbers_match_like_order() -> None:
    """Where traces carry Seq (PyTorch >= 2.1 NCCL), matching uses it; same pairs here."""
    _, t = ingest(JOBS["gloo_ddp_ws2"], IngestOptions(name="x"))
    c = t["collectives"].sort_values(["rank", "start_s"], kind="stable").copy()
    c["seq"] = c.groupby("rank").cumcount()
    by_seq = crossrank.compute(c)
    assert (by_seq["matched_by"] == crossrank.BY_SEQ).all()
    by_order = t["crossrank"]
    key = ["rank", "start_s"]
    a = by_seq.sort_values(key, ignore_index=True)
    b = by_order.sort_values(key, ignore_index=True)
    np.testing.assert_array_equal(a["transfer_s"], b["transfer_s"])
    np.testing.assert_array_equal(a["straggler_rank"], b["straggler_rank"])


def test_a_missing_call_only_unmatches_its_own_key() -> None:
    """One call absent on one rank: it stays unmatched (NaN, never guessed); the rest match."""
    _, t = ingest(JOBS["gloo_ddp_ws2"], IngestOptions(name="x"))
    c = t["collectives"]
    victim = c[(c["rank"] == 1) & (c["iteration"] == 2)].sort_values("start_s").index[0]
    cr = crossrank.compute(c.drop(index=victim))
    lost = cr[cr["n_ranks"] < 2]
    assert len(lost) == 1 and lost["rank"].iloc[0] == 0 and lost["wait_s"].isna().all()
    assert lost["straggler_rank"].iloc[0] == -1
    assert (cr["n_ranks"] == 2).sum() == len(c) - 2
    assert crossrank.coverage(cr)["unmatched_calls"] == 1


def test_single_rank_gives_an_empty_table() -> None:
    _, t = ingest([CPU_TRACES["ws2_ddp_rank0"]], IngestOptions(name="x"))
    assert "crossrank" not in t
    assert crossrank.compute(t["collectives"]).empty
