"""Cross-rank analysis: the same collective on every rank, split into transfer and wait.

A collective cannot finish on any rank before the last rank has joined it, so on every
rank but the last its measured time is waiting plus transfer.  Following
torch-tb-profiler (``tb_plugin/.../profiler/loader.py``, ``_process_distributed_profiles``)
the *transfer* time of a matched collective is the shortest duration among its ranks --
the last rank to arrive does not wait -- and each rank's *wait* (skew) is its duration
minus that.  Per rank and collective ``wait_s + transfer_s == dur_s`` exactly, and the
rank with wait 0 is the straggler, the one everybody else waited for.

This needs no synchronised clocks: only durations are compared, never start times of
different hosts, whose clocks are rarely aligned to the microseconds that matter.

Matching: by (process group, sequence number) when the trace records ``Seq`` (PyTorch
>= 2.1 NCCL kernels), else by order: the n-th call of a (process group, collective,
size) in an iteration on one rank is the n-th on every other rank.  Iterations and sizes
in the key keep one missing or extra call from shifting every later match.  When only
some ranks of a group are traced, the minimum is over the traced ones, so transfer is
an upper bound and wait a lower bound; ``n_ranks`` says how many ranks a match has.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from calib.core.schema import empty_table

BY_SEQ, BY_ORDER = "seq", "order"
_KEY = ["pg", "matched_by", "seq_key", "collective", "bytes", "it_key"]


def compute(collectives: pd.DataFrame) -> pd.DataFrame:
    """One row per collective call per rank, matched across ranks (``crossrank`` table)."""
    c = collectives
    if c.empty or c["rank"].nunique() < 2:
        return empty_table("crossrank")
    by_seq = c["seq"].to_numpy() >= 0
    df = pd.DataFrame(
        {
            "rank": c["rank"].to_numpy(np.int32),
            "iteration": c["iteration"].to_numpy(np.int64),
            "collective": c["collective"].astype(object).to_numpy(),
            "pg_name": c["pg_name"].astype(object).to_numpy(),
            "pg": c["pg_name"].astype(object).fillna("-").to_numpy(),
            "seq": c["seq"].to_numpy(np.int64),
            "bytes": c["bytes"].to_numpy(np.int64),
            "start_s": c["start_s"].to_numpy(np.float64),
            "dur_s": c["dur_s"].to_numpy(np.float64),
            "matched_by": np.where(by_seq, BY_SEQ, BY_ORDER).astype(object),
            # a sequence number identifies a call in its group; order needs the iteration
            "seq_key": np.where(by_seq, c["seq"].to_numpy(np.int64), -1),
            "it_key": np.where(by_seq, -1, c["iteration"].to_numpy(np.int64)),
        }
    )
    df = df.sort_values(["rank", "start_s"], kind="stable", ignore_index=True)
    df["ordinal"] = df.groupby(["rank", *_KEY], sort=False).cumcount().astype(np.int64)
    g = df.groupby([*_KEY, "ordinal"], sort=False)
    df["match_id"] = g.ngroup().astype(np.int64)
    df["n_ranks"] = g["rank"].transform("size").astype(np.int32)
    fastest = g["dur_s"].transform("min").to_numpy()
    # the straggler is the rank with the shortest duration (first such rank on ties)
    first_min = df.loc[g["dur_s"].idxmin().to_numpy(), ["match_id", "rank"]]
    straggler = pd.Series(first_min["rank"].to_numpy(), index=first_min["match_id"].to_numpy())
    matched = df["n_ranks"].to_numpy() >= 2
    df["transfer_s"] = np.where(matched, fastest, np.nan)
    df["wait_s"] = np.where(matched, df["dur_s"].to_numpy() - fastest, np.nan)
    df["straggler_rank"] = np.where(matched, straggler.reindex(df["match_id"]).to_numpy(), -1).astype(
        np.int32
    )
    # a match's iteration: the earliest any of its ranks put it in (ranks normally agree)
    df["match_iteration"] = g["iteration"].transform("min").astype(np.int64)
    df = df.sort_values(["match_id", "rank"], kind="stable", ignore_index=True)
    return df[list(empty_table("crossrank").columns)]


def stragglers(crossrank: pd.DataFrame) -> pd.DataFrame:
    """Per iteration: the slowest rank, and how much waiting it caused.

    The slowest rank of an iteration is the one the others waited for longest in total
    (summed over the collectives where it was last to arrive); ``worst_wait_rank`` is
    the rank that lost the most time waiting.
    """
    m = crossrank[crossrank["n_ranks"] >= 2]
    cols = [
        "iteration",
        "n_collectives",
        "slowest_rank",
        "last_arrivals",
        "caused_wait_s",
        "comm_s",
        "wait_s",
        "worst_wait_rank",
        "worst_wait_s",
    ]
    if m.empty:
        return pd.DataFrame({c: [] for c in cols})
    it = m["match_iteration"]
    caused = m.groupby([it, m["straggler_rank"]])["wait_s"].sum().rename("caused_wait_s")
    lasts = m[m["rank"] == m["straggler_rank"]].groupby([it, "straggler_rank"]).size().rename("last_arrivals")
    blame = pd.concat([caused, lasts], axis=1).fillna({"last_arrivals": 0}).reset_index()
    blame.columns = ["iteration", "rank", "caused_wait_s", "last_arrivals"]
    blame = blame.sort_values(
        ["iteration", "caused_wait_s", "last_arrivals", "rank"],
        ascending=[True, False, False, True],
        kind="stable",
    )
    top = blame.drop_duplicates("iteration").set_index("iteration")
    per_rank = m.groupby([it, "rank"])["wait_s"].sum().reset_index()
    per_rank.columns = ["iteration", "rank", "wait_s"]
    worst = per_rank.sort_values(
        ["iteration", "wait_s", "rank"], ascending=[True, False, True], kind="stable"
    )
    worst = worst.drop_duplicates("iteration").set_index("iteration")
    totals = m.groupby(it).agg(
        n_collectives=("match_id", "nunique"), comm_s=("dur_s", "sum"), wait_s=("wait_s", "sum")
    )
    out = totals.join(top[["rank", "last_arrivals", "caused_wait_s"]]).join(
        worst[["rank", "wait_s"]].rename(columns={"rank": "worst_wait_rank", "wait_s": "worst_wait_s"})
    )
    out = out.rename(columns={"rank": "slowest_rank"}).reset_index(names="iteration")
    out["last_arrivals"] = out["last_arrivals"].astype(np.int64)
    return out[cols]


def rank_summary(crossrank: pd.DataFrame) -> pd.DataFrame:
    """Per rank over the whole run: time waiting, time transferring, times last to arrive."""
    m = crossrank[crossrank["n_ranks"] >= 2]
    if m.empty:
        return pd.DataFrame({c: [] for c in ("rank", "wait_s", "transfer_s", "last_arrivals")})
    g = m.groupby("rank")
    out = g.agg(wait_s=("wait_s", "sum"), transfer_s=("transfer_s", "sum"))
    out["last_arrivals"] = (m["rank"] == m["straggler_rank"]).groupby(m["rank"]).sum().astype(np.int64)
    return out.reset_index()


def coverage(crossrank: pd.DataFrame) -> dict[str, int]:
    """How many calls matched across ranks, and how many did not (for the summary)."""
    per_match = crossrank.drop_duplicates("match_id")
    return {
        "matches": int((per_match["n_ranks"] >= 2).sum()),
        "unmatched_calls": int((crossrank["n_ranks"] < 2).sum()),
        "by_seq": int(((per_match["matched_by"] == BY_SEQ) & (per_match["n_ranks"] >= 2)).sum()),
        "max_ranks": int(crossrank["n_ranks"].max()) if len(crossrank) else 0,
    }
