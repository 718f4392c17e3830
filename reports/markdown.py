"""The report's Markdown summary: the same sections, tables inline, figures linked.

Markdown renders raw HTML, so text is HTML-escaped first and then Markdown's own
punctuation (``| * _ ` [ ] # \\``) is backslash-escaped; a hostile kernel name stays text.
"""

from __future__ import annotations

import re
from html import escape

from calib.reports.document import Figure, Report, Section, Table, Text, table_rows

_MD_SPECIAL = re.compile(r"([\\`*_\[\]{}()#+!|~>])")


def md(text: str) -> str:
    """Text that renders as itself in Markdown (one line)."""
    return _MD_SPECIAL.sub(r"\\\1", escape(str(text), quote=False)).replace("\n", " ")


def _table(t: Table) -> list[str]:
    head, rows = table_rows(t.df)
    out = [f"**{md(t.title)}**", ""] if t.title else []
    out.append("| " + " | ".join(md(h) for h in head) + " |")
    out.append("|" + "|".join("---" for _ in head) + "|")
    out += ["| " + " | ".join(md(v) for v in row) + " |" for row in rows]
    if t.caption:
        out += ["", md(t.caption)]
    return [*out, ""]


def _block(b, level: int) -> list[str]:
    if isinstance(b, Figure):
        return [f"![{md(b.title)}](figures/{b.key}.png)", "", f"*{md(b.title)}.* {md(b.caption)}", ""]
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Text):
        prefix = {"note": "> **Note:** ", "missing": "> *Not shown:* "}.get(b.kind, "")
        return [prefix + md(b.text), ""]
    if isinstance(b, Section):
        return _section(b)
    raise TypeError(f"unknown block {type(b).__name__}")


def _section(s: Section) -> list[str]:
    out = ["#" * s.level + " " + md(s.title), ""]
    for b in s.blocks:
        out += _block(b, s.level)
    return out


def render(report: Report) -> str:
    out = [f"# {md(report.title)}", ""]
    out += [f"- **{md(k)}:** {md(v)}" for k, v in report.meta]
    out += ["", "## Summary", ""]
    out += [f"- {md(s)}" for s in report.summary]
    out.append("")
    for s in report.sections:
        out += _section(s)
    if report.notes:
        out += ["## Notes", ""] + [f"- {md(n)}" for n in report.notes] + [""]
    out.append("Full report with embedded figures: report.html; figure data: data/*.csv.")
    return "\n".join(out) + "\n"
