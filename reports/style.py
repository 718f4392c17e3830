"""One palette and one matplotlib style for every figure of a report.

Every time bucket has exactly one colour wherever it appears -- measured buckets of a
trace (ingest), predicted time categories (analytic), HTA's idle categories -- so a
reader who learned "orange is intra-op dispatch" in one figure can read the next one.
Colours are the Okabe-Ito colour-blind-safe set plus a few tints; communication is
warm (vermillion, pinks, wine), compute is blue, dispatch is orange/gold, waiting grey.

Matplotlib runs on the Agg backend (no display).  Names from traces reach figures only
through :func:`short`, which escapes ``$`` so mathtext never parses them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")

import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

#: semantic bucket -> (label, colour).  The one place colours are defined.
BUCKETS: dict[str, tuple[str, str]] = {
    "kernel": ("kernel execution", "#0072B2"),
    "kernel_other": ("other kernels", "#56B4E9"),
    "memcpy": ("memcpy/memset", "#332288"),
    "intra_op": ("intra-op dispatch", "#E69F00"),
    "inter_op": ("inter-op dispatch", "#F0C75E"),
    "other": ("other (host wait)", "#999999"),
    "comm": ("communication (exposed)", "#D55E00"),
    "comm_overlapped": ("communication (overlapped)", "#F4A582"),
    "allreduce": ("DP all-reduce", "#BB2222"),
    "allgather": ("DP all-gather", "#CC79A7"),
    "reducescatter": ("DP reduce-scatter", "#882255"),
    "tp": ("TP communication", "#8C564B"),
    "pp": ("PP send/recv", "#117733"),
    "bubble": ("pipeline bubble", "#DDDDDD"),
    "optimizer": ("optimizer step", "#009E73"),
}

#: measured bucket columns of ingest's ``buckets`` table, in stacking order
MEASURED = {
    "comm_exposed_s": "comm",
    "comm_overlapped_s": "comm_overlapped",  # derived: comm_s - comm_exposed_s
    "compute_kernel_s": "kernel",  # derived: kernel_s - memcpy_s
    "memcpy_s": "memcpy",
    "intra_op_s": "intra_op",
    "inter_op_s": "inter_op",
    "other_s": "other",
}

#: predicted time columns of analytic's tables, in stacking order (they sum to iter_s)
PREDICTED = {
    "kernel_transformer_s": "kernel",
    "kernel_other_s": "kernel_other",
    "dispatch_intra_s": "intra_op",
    "dispatch_inter_s": "inter_op",
    "optimizer_s": "optimizer",
    "tp_s": "tp",
    "pp_s": "pp",
    "dp_allreduce_exposed_s": "allreduce",
    "dp_allgather_exposed_s": "allgather",
    "dp_reducescatter_exposed_s": "reducescatter",
    "bubble_s": "bubble",
}

#: HTA idle categories, coloured by the calib bucket closest in meaning
HTA_IDLE = {
    "host_wait": ("HTA host wait", BUCKETS["intra_op"][1]),
    "kernel_wait": ("HTA kernel wait", BUCKETS["inter_op"][1]),
    "other": ("HTA other idle", BUCKETS["other"][1]),
}

#: kernel classes (seed 004 Table 6); optimizer and memcpy share their bucket colours
KERNEL_CLASSES: dict[str, str] = {
    "gemm": "#08306B",
    "attention": "#2171B5",
    "elementwise": "#6BAED6",
    "copy_concat": "#9E9AC8",
    "normalization": "#74C476",
    "optimizer": BUCKETS["optimizer"][1],
    "embedding": "#FD8D3C",
    "memcpy": BUCKETS["memcpy"][1],
    "memset": "#6A51A3",
    "other": "#BDBDBD",
}

#: memory parts per GPU
MEMORY: dict[str, tuple[str, str]] = {
    "mem_weights_gb": ("weights", "#4477AA"),
    "mem_grads_gb": ("gradients", "#66CCEE"),
    "mem_optimizer_gb": ("optimizer states", "#228833"),
    "mem_activations_gb": ("activations", "#CCBB44"),
    "mem_reserve_gb": ("runtime reserve", "#BBBBBB"),
}

#: one colour per collective (busbw and eff figures)
COLLECTIVES: dict[str, str] = {
    "allreduce": BUCKETS["allreduce"][1],
    "allgather": BUCKETS["allgather"][1],
    "reducescatter": BUCKETS["reducescatter"][1],
    "alltoall": "#44AA99",
    "broadcast": "#999933",
    "reduce": "#AA4499",
    "sendrecv": BUCKETS["pp"][1],
}

#: one colour per model in a sweep (cycled)
SERIES = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#882255", "#999933")
#: ZeRO stage -> marker/line style in overview plots
ZERO_STYLE = {0: ("s", ":"), 1: ("o", "-"), 2: ("^", "--"), 3: ("D", "-.")}

HATCH_OOM = "xx"
DPI = 110

STYLE = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",
}


def color(bucket: str) -> str:
    return BUCKETS[bucket][1]


def label(bucket: str) -> str:
    return BUCKETS[bucket][0]


def short(text: str, n: int = 40) -> str:
    """A name cut to ``n`` characters with an ellipsis, safe for matplotlib text ('$' escaped)."""
    text = str(text).replace("\n", " ")
    text = text if len(text) <= n else text[: n - 1] + "…"
    return text.replace("$", r"\$")


def plain_log_axis(axis, base: float = 10) -> None:
    """Log-axis ticks as plain numbers (1, 2, 4, ... or 1e-3) instead of powers."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=base))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def new_figure(*args, **kwargs):
    """``plt.subplots`` under the report style, constrained layout unless told otherwise."""
    kwargs.setdefault("layout", "constrained")
    with plt.rc_context(STYLE):
        return plt.subplots(*args, **kwargs)


@dataclass(frozen=True)
class Drawn:
    """A figure before rendering, with the numbers it draws (kept for tests and data/)."""

    fig: object  # matplotlib Figure
    data: pd.DataFrame


def to_png(fig) -> bytes:
    """Render and close a figure."""
    buf = io.BytesIO()
    with plt.rc_context(STYLE):
        fig.savefig(buf, format="png", facecolor="white")
    plt.close(fig)
    return buf.getvalue()


def bytes_label(n: float) -> str:
    """1024 -> '1 KiB' (axis ticks of message sizes)."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    i = 0
    while abs(n) >= 1024 and i < len(units) - 1:
        n /= 1024.0
        i += 1
    return f"{n:g} {units[i]}"


def colour_key() -> Drawn:
    """Every bucket colour once, as the report's key."""
    items = list(BUCKETS.items())
    ncol = 5
    fig, ax = new_figure(figsize=(12.0, 0.35 * (-(-len(items) // ncol)) + 0.2))
    for i, (k, (lab, col)) in enumerate(items):
        x, y = (i % ncol) * 2.4, -(i // ncol)
        ax.add_patch(
            matplotlib.patches.Rectangle(
                (x, y), 0.22, 0.6, color=col, hatch="//" if k == "comm_overlapped" else None
            )
        )
        ax.text(x + 0.4, y + 0.3, lab, va="center", fontsize=8)
    ax.set_xlim(0, ncol * 2.4)
    ax.set_ylim(-(len(items) - 1) // ncol - 0.2, 0.8)
    ax.axis("off")
    return Drawn(fig, pd.DataFrame([{"bucket": k, "label": v[0], "colour": v[1]} for k, v in items]))
