"""The report as plain data, rendered by :mod:`reports.html` and :mod:`reports.markdown`.

Blocks hold raw text (never markup): every string that may come from a trace -- run,
kernel, operator and process-group names, file paths, notes -- is escaped by the
writer for its format, in one place.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Figure:
    key: str  # file stem under figures/ and data/
    title: str
    caption: str
    png: bytes
    data: pd.DataFrame  # the numbers drawn (written to data/<key>.csv)


@dataclass(frozen=True)
class Table:
    title: str
    df: pd.DataFrame
    caption: str = ""


@dataclass(frozen=True)
class Text:
    text: str
    kind: str = "p"  # p, note (a caveat), missing (what could not be shown and why)


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    blocks: tuple = ()
    level: int = 2


@dataclass(frozen=True)
class Report:
    title: str
    meta: tuple[tuple[str, str], ...]  # (label, value) lines under the title
    summary: tuple[str, ...]
    sections: tuple[Section, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def figures(self) -> list[Figure]:
        """Every figure, nested sections included, in document order."""

        def walk(blocks) -> list[Figure]:
            out: list[Figure] = []
            for b in blocks:
                if isinstance(b, Figure):
                    out.append(b)
                elif isinstance(b, Section):
                    out += walk(b.blocks)
            return out

        return walk(self.sections)


_KEY_RE = re.compile(r"[^A-Za-z0-9._-]+")


def key(*parts: str) -> str:
    """A file-name-safe figure key from parts that may hold anything."""
    text = "-".join(_KEY_RE.sub("_", str(p)).strip("._-") or "x" for p in parts)
    return text[:120]


def cell(v) -> str:
    """A table cell as text: 4 significant digits, thousands separators, '-' for missing."""
    if v is None:
        return "-"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (int, np.integer)):
        return f"{int(v):,}" if abs(int(v)) >= 10_000 else str(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return "-"
        if math.isinf(f):
            return "inf"
        if f != 0 and (abs(f) >= 1e6 or abs(f) < 1e-3):
            return f"{f:.3g}"
        if abs(f) >= 1000:
            return f"{f:,.0f}"
        return f"{f:.4g}"
    return str(v)


def table_rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    return [str(c) for c in df.columns], [[cell(v) for v in row] for row in df.itertuples(index=False)]
