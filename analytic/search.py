"""Strategy search: enumerate every valid strategy for a model on N GPUs and rank them.

The space is the product of a *layout* (TP t, PP p, DP d, micro-batch b, interleaving v)
and *options* (ZeRO stage, recompute, sequence parallelism, DP overlap).  Layouts come
from divisor arithmetic done with numpy masks (t | a and t | N; p | l and p | N/t;
d = N/(t p) with d | B; b | B/d; v | l/p and, for v > 1, m % p == 0); options are a
fixed table.  The time model is evaluated on the (layouts x 1) by (1 x options) grid by
broadcasting: communication and every per-layout term are computed once per layout,
the options combine them with cheap element-wise arithmetic.  No Python loop runs per
strategy; layouts are processed in chunks to bound memory.

Counted strategies are the valid ones (out-of-memory included, reported as such);
duplicates are not generated: ZeRO > 0 and DP overlap need DP > 1, sequence
parallelism needs TP > 1, ZeRO-2/3 need PP = 1.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from calib.analytic.interval import iter_interval
from calib.analytic.specs import ModelSpec
from calib.analytic.strategy import Strategies
from calib.analytic.timemodel import System, comm_times, evaluate

CHUNK_STRATEGIES = 1 << 20  # strategies per evaluation chunk (bounds memory to ~1 GB)


def divisors(n: int) -> np.ndarray:
    k = np.arange(1, int(np.sqrt(n)) + 1)
    small = k[n % k == 0]
    return np.unique(np.concatenate([small, n // small]))


@dataclass(frozen=True)
class Space:
    """The knobs a search may vary; defaults span everything the model knows."""

    zero: tuple[int, ...] = (0, 1, 2, 3)
    recompute: tuple[int, ...] = (0, 1, 2)
    seq_parallel: tuple[bool, ...] = (False, True)
    dp_overlap: tuple[bool, ...] = (False, True)
    interleave: bool = True
    max_tp: int | None = None
    flash_attention: bool = False
    #: today's stacks: CP sizes and kind, EP sizes (None: every divisor of the experts,
    #: 1 for a dense model), pipeline schedules (codes of analytic.bubble), FP8, the
    #: distributed optimizer in place of ZeRO-1, TP overlap, master weights (0 fp32, 1 bf16)
    cp: tuple[int, ...] = (1,)
    cp_kind: int = 0
    ep: tuple[int, ...] | None = None
    schedules: tuple[int, ...] = (0,)
    fp8: bool = False
    dist_opt: bool = False
    tp_overlap: bool = False
    master: int = 0
    #: PP sizes that do not divide the layers (analytic.uneven: extra layers on the first stages)
    uneven_pp: bool = False
    #: 2D tensor parallelism (seed 002): column counts tp_c of the tp_r x tp_c TP grid to try
    #: (1 = 1D TP; each must divide TP and the sequence) and the grid's kind (0 2D table, 1 SUMMA)
    tp_c: tuple[int, ...] = (1,)
    tp2d_kind: int = 0
    #: Calculon's fused layers (seed 000): fused element-wise kernels, off and/or on
    fused_layers: tuple[bool, ...] = (False,)
    #: placement axis (seed 002): NVLink domain size; every strategy is timed under its best
    #: placement of the TP/CP/DP/PP groups on domains of this many GPUs (analytic.placement)
    nvlink_domain: int | None = None
    #: hybrid sharding (analytic.hybrid): ZeRO-2/3 shard-group sizes to try; 0 = the whole DP
    #: group (a size must divide DP x CP and be smaller than it)
    shard: tuple[int, ...] = (0,)
    #: ZeRO implementation (analytic.dp_exposure): 0 DeepSpeed, 1 PyTorch FSDP
    zero_impl: int = 0


def layouts(
    model: ModelSpec, gpus: int | Sequence[int], global_batch: int, space: Space = Space()
) -> dict[str, np.ndarray]:
    """Every valid (t, c, p, d, b, v, schedule, e) for every GPU count, as 1-D int arrays.

    Candidates: t among the divisors of the heads, c among ``space.cp`` (2c | s; Ulysses:
    t c | a), p of the layers, b of the batch, v of the layers, e among the EP sizes
    (e | experts, e | t c d); one broadcast mask per step keeps those that divide what
    they must.  Schedules: 1F1B with every v; ZB-H1 (m >= p) and DualPipe (p even,
    m >= 2p) with v = 1.
    """
    N = np.atleast_1d(np.asarray(gpus, dtype=np.int64))
    B, L, a, S = int(global_batch), model.n_layers, model.n_heads, model.seq_len
    td = divisors(a)
    td = td[td <= (space.max_tp or td.max())]
    cd = np.array(sorted(set(space.cp)), dtype=np.int64)
    pdv = np.arange(1, L + 1) if space.uneven_pp else divisors(L)
    n4, t4, c4, p4 = np.meshgrid(N, td, cd, pdv, indexing="ij")
    ok = (n4 % (t4 * c4 * p4) == 0) & ((c4 == 1) | (S % (2 * c4) == 0))
    if space.cp_kind == 1:
        ok &= a % (t4 * c4) == 0
    n1, t1, c1, p1 = n4[ok], t4[ok], c4[ok], p4[ok]
    d1 = n1 // (t1 * c1 * p1)
    ok = B % d1 == 0
    n1, t1, c1, p1, d1 = n1[ok], t1[ok], c1[ok], p1[ok], d1[ok]
    bd = divisors(B)
    ok = (B // d1)[:, None] % bd[None, :] == 0
    i, jb = np.nonzero(ok)
    bb = bd[jb]
    m = B // (d1[i] * bb)
    vd = divisors(L) if space.interleave else np.array([1])
    # (v, schedule) pairs: 1F1B with every v, ZB-H1 / DualPipe with v = 1
    sch = np.array(sorted(set(space.schedules)), dtype=np.int64)
    pv = np.concatenate([vd if 0 in sch else vd[:0], np.ones(int(np.sum(sch > 0)), dtype=np.int64)])
    ps = np.concatenate([np.zeros(vd.size if 0 in sch else 0, dtype=np.int64), sch[sch > 0]])
    p_i = p1[i]
    ok = (ps[None, :] == 0) & (
        (pv[None, :] == 1)
        | (
            (p_i[:, None] > 1)
            & ((L % p_i)[:, None] == 0)
            & ((L // p_i)[:, None] % pv[None, :] == 0)
            & ((m % p_i)[:, None] == 0)
        )
    )
    ok |= (ps[None, :] == 1) & (p_i[:, None] > 1) & (m[:, None] >= p_i[:, None])
    ok |= (ps[None, :] == 2) & (p_i[:, None] > 1) & (p_i[:, None] % 2 == 0) & (m[:, None] >= 2 * p_i[:, None])
    k, jv = np.nonzero(ok)
    sel = i[k]
    out = {"tp": t1[sel], "cp": c1[sel], "pp": p1[sel], "dp": d1[sel], "micro_batch": bb[k],
           "interleave": pv[jv], "schedule": ps[jv]}  # fmt: skip
    E = int(getattr(model, "n_experts", 0) or 0)
    ed = np.array(sorted(set(space.ep)) if space.ep else (divisors(E) if E else [1]), dtype=np.int64)
    fold = out["tp"] * out["cp"] * out["dp"]
    ok = (fold[:, None] % ed[None, :] == 0) & ((E % ed[None, :] == 0) if E else (ed[None, :] == 1))
    r, je = np.nonzero(ok)
    out = {key: val[r] for key, val in out.items()}
    out["ep"] = ed[je]
    # the 2D TP grid: tp_c columns (sequence split) with tp_c | t and tp_c | s
    cd2 = np.array(sorted(set(space.tp_c)), dtype=np.int64)
    ok = (out["tp"][:, None] % cd2[None, :] == 0) & (S % cd2[None, :] == 0)
    r, jc = np.nonzero(ok)
    out = {key: val[r] for key, val in out.items()}
    out["tp_c"] = cd2[jc]
    # hybrid sharding: shard groups that divide the DP x CP group (0: the whole group)
    sh = np.array(sorted(set(space.shard)), dtype=np.int64)
    g = (out["dp"] * out["cp"])[:, None]
    ok = (sh[None, :] == 0) | ((sh[None, :] < g) & (g % np.maximum(sh[None, :], 1) == 0))
    r, js = np.nonzero(ok)
    out = {key: val[r] for key, val in out.items()}
    out["shard"] = sh[js]
    return out


#: option axes of the search grid, after the layout axis 0
OPTION_AXES = ("zero", "recompute", "seq_parallel", "dp_overlap", "fused_layers")


def options(space: Space = Space()) -> dict[str, np.ndarray]:
    """Each option as an array along its own axis (1..5) of the (layout, *options) grid.

    Keeping the options on separate axes lets broadcasting compute every intermediate at
    the shape it depends on: compute terms on (layout, recompute, SP), DP terms on
    (layout, ZeRO, recompute, overlap); only the final sums span the whole grid.
    """
    vals = {"zero": np.array(space.zero), "recompute": np.array(space.recompute),
            "seq_parallel": np.array(space.seq_parallel, dtype=bool), "dp_overlap": np.array(space.dp_overlap, dtype=bool),
            "fused_layers": np.array(space.fused_layers, dtype=bool)}  # fmt: skip
    out = {}
    for axis, name in enumerate(OPTION_AXES, start=1):
        shape = [1] * (len(OPTION_AXES) + 1)
        shape[axis] = -1
        out[name] = vals[name].reshape(shape)
    return out


def _col(x: np.ndarray) -> np.ndarray:
    return x.reshape((-1,) + (1,) * len(OPTION_AXES))


def option_mask(lay: dict[str, np.ndarray], opt: dict[str, np.ndarray], dist_opt: bool = False) -> np.ndarray:
    """Validity over the grid: no duplicates, nothing the frameworks cannot run."""
    t, p, d, c = (_col(lay[k]) for k in ("tp", "pp", "dp", "cp"))
    z, sp, ov = opt["zero"], opt["seq_parallel"], opt["dp_overlap"]
    dc = d * c  # the dense gradients are reduced over DP x CP
    ok = ((z == 0) | (dc > 1)) & (~sp | (t > 1)) & (~ov | (dc > 1))
    if "shard" in lay:  # hybrid sharding shards ZeRO-2/3 states only
        ok &= (_col(lay["shard"]) == 0) | (z >= 2)
    if "tp_c" in lay:  # a 2D TP grid splits the sequence: its rows run sequence parallel
        ok &= sp | (_col(lay["tp_c"]) == 1)
    if dist_opt:
        ok &= z != 0  # the distributed optimizer replaces ZeRO-1; plain DDP stays as ZeRO-0
    return ok


@dataclass(frozen=True)
class SearchResult:
    top: pd.DataFrame  # best feasible strategies, ranked by iteration time (full breakdown)
    best_per_gpus: pd.DataFrame  # the best feasible strategy at each GPU count
    n_strategies: int  # valid strategies evaluated (OOM included)
    n_feasible: int  # those that fit in memory
    seconds: float  # wall time of enumeration + evaluation + ranking
    notes: tuple[str, ...] = ()  # what the ranked strategies' intervals hold (analytic.interval)

    @property
    def rate(self) -> float:
        return self.n_strategies / self.seconds if self.seconds > 0 else float("inf")


def search(
    model: ModelSpec,
    system: System,
    gpus: int | Sequence[int],
    global_batch: int,
    space: Space = Space(),
    top: int = 10,
    objective: str = "time",
    power=None,
) -> SearchResult:
    """Enumerate, evaluate and rank every valid strategy (see module docstring).

    The grid pass is lean (iteration time and memory); the top strategies are then
    re-evaluated in full by the same model for their breakdown.  ``objective``: ``time``
    (seconds per iteration), ``energy`` (joules per token at the top clock, needs ``power``,
    an :class:`~calib.analytic.energy.PowerSpec`) or ``cost`` (GPU-seconds per token).
    """
    from calib.analytic import energy as E

    if objective not in E.OBJECTIVES:
        from calib.core.errors import InputError

        raise InputError("objective", f"'{objective}' is not one of {', '.join(E.OBJECTIVES)}")
    t0 = time.perf_counter()
    gpus = [gpus] if isinstance(gpus, (int, np.integer)) else sorted(set(int(g) for g in gpus))
    lay = layouts(model, gpus, global_batch, space)
    moe = bool(getattr(model, "n_experts", 0))
    # Megatron-Core MoE with TP splits the tokens over TP: sequence parallelism is not a
    # choice there but SP = (TP > 1), set per layout (no SP axis: half the grid)
    sp_space = replace(space, seq_parallel=(False,)) if moe else space
    comm_all = _layout_comm(model, system, lay, global_batch, space)
    picks: list[dict[str, np.ndarray]] = []
    n_valid = n_fit = 0
    # ZeRO-2/3 with PP > 1 run as torch pipelining runs FSDP stages (analytic.sharded_pp)
    if space.zero and lay["tp"].size:
        opt = options(sp_space)
        n_valid, n_fit = _scan(model, system, lay, comm_all, opt, global_batch, space, moe, max(top, 1), picks,
                               objective, power)  # fmt: skip
    if not picks:
        empty = pd.DataFrame()
        return SearchResult(empty, empty, n_valid, n_fit, time.perf_counter() - t0)
    cand = {k: np.concatenate([p[k] for p in picks]) for k in picks[0]}
    if moe:
        cand["seq_parallel"] = cand["tp"] > 1
    table = detail(model, system, cand, global_batch, space, power)
    notes = tuple(table.attrs.pop("interval_notes", ()))
    placed = "iter_placed_s" if space.nvlink_domain else "iter_s"
    order = {"time": placed, "energy": "energy_j_per_token", "cost": "gpu_s_per_token"}[objective]
    table = table.sort_values([order, "iter_s", "mem_total_gb"], kind="stable").reset_index(drop=True)
    per_gpus = table.groupby("gpus", sort=True).head(1).sort_values("gpus").reset_index(drop=True)
    ranked = table.head(top).reset_index(drop=True)
    ranked.insert(0, "rank", np.arange(1, len(ranked) + 1))
    return SearchResult(ranked, per_gpus, n_valid, n_fit, time.perf_counter() - t0, notes)


def _scan(model, system, lay, comm_all, opt, B, space, moe, keep, picks, objective="time", power=None):
    """Evaluate the (layouts x options) grid in chunks; append the candidates to ``picks``:
    the ``keep`` fastest and the fastest of every GPU count.  Returns (valid, fitting) counts."""
    n_opt = int(np.prod([opt[k].size for k in OPTION_AXES]))
    step = max(1, CHUNK_STRATEGIES // max(n_opt, 1) // (1 if objective == "time" else 8))
    n_valid = n_fit = 0
    for lo in range(0, lay["tp"].size, step):  # chunks of layouts, not strategies
        sl = {k: v[lo : lo + step] for k, v in lay.items()}
        n_lay = sl["tp"].size
        grid = (n_lay, *(opt[k].size for k in OPTION_AXES))
        mask = option_mask(sl, opt, space.dist_opt)
        comm = None if comm_all is None else {k: _col(v[lo : lo + step]) for k, v in comm_all.items()}
        sts = _strategies(sl, opt, B, space, moe)
        r = evaluate(model, system, sts, comm=comm, lean=objective in ("time", "cost"))
        if space.nvlink_domain:  # the placement axis: each strategy under its best placement
            from calib.analytic import placement as PL

            pt = PL.layout_terms(model, system, sl, B, space.nvlink_domain, space.tp2d_kind)
            r = {**r, "iter_s": r["iter_s"] + PL.best_delta(pt, r["dp_exposed_s"], _col, False)[0]}
        if objective == "time":
            key = r["iter_s"]
        else:
            from calib.analytic import energy as E

            w = E.work_of(model, system, sts, r) if objective == "energy" else None
            key = E.objective_values(objective, power, w, r, sts.gpus, B * model.seq_len)
        score = np.where(mask & ~r["oom"], key, np.inf)
        score = np.broadcast_to(score, grid).reshape(n_lay, -1)
        n_valid += int(np.count_nonzero(np.broadcast_to(mask, grid)))
        n_fit += int(np.count_nonzero(np.isfinite(score)))
        flat = score.ravel()
        k = min(keep, flat.size)
        best = np.argpartition(flat, k - 1)[:k]
        best = best[np.isfinite(flat[best])]
        # the best strategy of every GPU count: per-layout minimum, then per count
        opt_best = score.argmin(axis=1)
        lay_best = score[np.arange(n_lay), opt_best]
        n_of = sl["tp"] * sl["cp"] * sl["pp"] * sl["dp"]
        order = np.lexsort((lay_best, n_of))
        first = order[np.r_[True, np.diff(n_of[order]) != 0]]
        first = first[np.isfinite(lay_best[first])]
        pick = np.unique(np.concatenate([best, first * score.shape[1] + opt_best[first]]))
        if pick.size == 0:
            continue
        idx = np.unravel_index(pick, grid)
        picks.append(
            {
                **{k: sl[k][idx[0]] for k in sl},
                **{k: opt[k].ravel()[idx[a]] for a, k in enumerate(OPTION_AXES, 1)},
            }
        )
    return n_valid, n_fit


def _strategies(sl: dict, opt: dict, B: int, space: Space, moe: bool = False) -> Strategies:
    o = dict(opt)
    if moe:
        o["seq_parallel"] = opt["seq_parallel"] | _col(sl["tp"] > 1)
    return Strategies.of(
        **{k: _col(v) for k, v in sl.items()}, global_batch=B, **_space_knobs(space, opt["zero"]),
        **{k: o[k] for k in OPTION_AXES},
    )  # fmt: skip


COMM_KEYS = (
    "tp",
    "cp",
    "pp",
    "dp",
    "micro_batch",
    "ep",
    "tp_c",
    "shard",
)  # what the communication terms depend on


def _layout_comm(model, system: System, sl: dict, B: int, space: Space) -> dict[str, np.ndarray] | None:
    """Communication terms once per distinct (t, c, p, d, b, e): layouts that differ only in
    interleaving or schedule share them.  One int64 mixed-radix key, one sort."""
    cols = [sl[k].astype(np.int64) for k in COMM_KEYS]
    if not cols[0].size:
        return None  # no valid layout (e.g. no TP grid column count divides TP)
    radix = [int(c.max()) + 1 for c in cols]
    if float(np.prod([float(r) for r in radix])) >= 2.0**62:
        return None  # let evaluate compute them per layout
    key = cols[0]
    for c, r in zip(cols[1:], radix[1:], strict=True):
        key = key * r + c
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    sub = Strategies.of(**{k: sl[k][first] for k in sl}, global_batch=B, **_space_knobs(space, 1))
    c = comm_times(model, system, sub)
    return {k: np.broadcast_to(v, first.shape)[inv.ravel()] for k, v in c.items()}


def _space_knobs(space: Space, zero) -> dict:
    """The scalar knobs of a search space (the distributed optimizer stands in for ZeRO-1)."""
    return {"flash_attention": space.flash_attention, "cp_kind": space.cp_kind, "fp8": space.fp8,
            "dist_opt": np.asarray(zero) == 1 if space.dist_opt else False, "tp_overlap": space.tp_overlap,
            "master": space.master, "tp2d_kind": space.tp2d_kind, "zero_impl": space.zero_impl}  # fmt: skip


#: the columns of a :func:`detail` table that name its strategy (layouts() and the option axes)
STRATEGY_KEYS = (
    "tp",
    "cp",
    "pp",
    "dp",
    "micro_batch",
    "interleave",
    "schedule",
    "ep",
    "tp_c",
    "shard",
    *OPTION_AXES,
)


def iter_of(model: ModelSpec, system: System, table: pd.DataFrame, B: int, space: Space) -> np.ndarray:
    """Iteration seconds of the strategies of a :func:`detail` table (search's ranked rows,
    their codes not yet named) on ``system``, e.g. the same machine with another efficiency."""
    cand = {k: table[k].to_numpy() for k in STRATEGY_KEYS}
    st = Strategies.of(**cand, global_batch=B, **_space_knobs(space, cand["zero"]))
    return np.asarray(evaluate(model, system, st)["iter_s"], dtype=float)


def detail(
    model: ModelSpec, system: System, cand: dict[str, np.ndarray], B: int, space: Space, power=None
) -> pd.DataFrame:
    """Full evaluation of a few chosen strategies (1-D), as a table."""
    st = Strategies.of(**cand, global_batch=B, **_space_knobs(space, cand["zero"]))
    r = evaluate(model, system, st)
    n = len(cand["tp"])
    # the columns are gathered first and framed once (a column set on a frame costs ~0.3 ms)
    cols: dict[str, np.ndarray] = {"gpus": cand["tp"] * cand["cp"] * cand["pp"] * cand["dp"]}
    for k, v in cand.items():
        cols[k] = v
        if k == "micro_batch":
            cols["microbatches"] = B // (cand["dp"] * cand["micro_batch"])
    iter_s = np.broadcast_to(r["iter_s"], (n,))
    band = iter_interval(model, system, st, iter_s)
    for key in ("iter_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "compute_s", "comm_exposed_s",
                "comm_overlapped_s", "bubble_s", "tp_s", "pp_s", "ep_cp_exposed_s"):  # fmt: skip
        cols[key.replace("model_", "")] = np.broadcast_to(r[key], (n,))
        if key == "iter_s" and band is not None:
            cols["iter_s_lo"], cols["iter_s_hi"] = band[0], band[1]
    cols["dp_exposed_s"] = np.broadcast_to(
        r["dp_allreduce_exposed_s"] + r["dp_allgather_exposed_s"] + r["dp_reducescatter_exposed_s"], (n,)
    )
    cols["mem_total_gb"] = np.broadcast_to(r["mem_total_bytes"] / 1e9, (n,))
    placed = iter_s
    if space.nvlink_domain:
        from calib.analytic import placement as PL

        pt = PL.layout_terms(model, system, cand, B, space.nvlink_domain, space.tp2d_kind)
        delta, arg = PL.best_delta(pt, cols["dp_exposed_s"])
        cols["placement"] = [PL.order_label(pt["orders"][o], pt["sizes"], i) for i, o in enumerate(arg)]
        cols["nvlink_domain"] = np.full(n, space.nvlink_domain)
        cols["iter_placed_s"] = placed = iter_s + delta
        cols["comm_placed_s"] = pt["tot"][arg, np.arange(n)]
    cols["gpu_s_per_token"] = cols["gpus"] * placed / (B * model.seq_len)
    if power is not None:
        from calib.analytic.energy import energy_columns, work_of

        ec = energy_columns(power, work_of(model, system, st, r), st.gpus, float(B * model.seq_len))
        for k in ("energy_j_per_token", "energy_kj_per_iter", "power_w_per_gpu", "f_opt_mhz", "f_opt_scale",
                  "energy_saving_opt"):  # fmt: skip
            cols[k] = np.broadcast_to(ec[k], (n,))
    df = pd.DataFrame(cols)
    if band is not None:
        df.attrs["interval_notes"] = list(band[2])
    return df
