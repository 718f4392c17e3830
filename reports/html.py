"""One self-contained HTML file: figures embedded as base64 PNG, styles inline, no
script, no external resource (a Content-Security-Policy forbids any), and every piece
of text escaped with :func:`html.escape` -- the only way text reaches the page.
"""

from __future__ import annotations

import base64
import struct
from html import escape

import pandas as pd
from calib.reports.document import Figure, Report, Section, Table, Text, table_rows

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;color:#222;
background:#fafafa;line-height:1.45}
main{max-width:1280px;margin:0 auto;padding:24px 32px 64px;background:#fff}
h1{font-size:1.6em;margin:0 0 4px} h2{font-size:1.3em;border-bottom:2px solid #0072B2;padding-bottom:3px;
margin-top:2.2em} h3{font-size:1.08em;margin-top:1.8em}
.meta{color:#555;font-size:.9em;margin:0 0 14px;display:table} .meta td{padding:1px 12px 1px 0;vertical-align:top;text-align:left;border:none;white-space:normal}
.summary{background:#f1f6fb;border-left:4px solid #0072B2;padding:10px 18px;margin:16px 0}
.summary li{margin:3px 0}
nav{font-size:.9em;columns:2;margin:10px 0 0} nav a{color:#0072B2;text-decoration:none}
figure{margin:18px 0 26px} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.88em;color:#444;margin-top:4px;max-width:1100px}
figcaption b{color:#222}
table{border-collapse:collapse;font-size:.82em;margin:8px 0 4px;display:block;overflow-x:auto;max-width:100%}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:right;white-space:nowrap}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
th.text,td.text{text-align:left} td.long{white-space:normal;min-width:280px;max-width:560px;overflow-wrap:anywhere}
.tcap{font-size:.88em;color:#444;margin:0 0 18px;max-width:1100px} .ttitle{font-weight:600;margin-top:16px}
p.note{font-size:.9em;color:#5a4500;background:#fff8e1;border-left:3px solid #E69F00;padding:4px 10px}
p.missing{font-size:.9em;color:#555;background:#f3f3f3;border-left:3px solid #999;padding:4px 10px}
footer{font-size:.85em;color:#555;margin-top:40px;border-top:1px solid #ddd;padding-top:10px}
"""


def png_size(png: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    w, h = struct.unpack(">II", png[16:24])
    return int(w), int(h)


def _figure(f: Figure) -> str:
    w, h = png_size(f.png)
    data = base64.b64encode(f.png).decode("ascii")
    return (
        f'<figure id="fig-{escape(f.key)}"><img src="data:image/png;base64,{data}" width="{w}" height="{h}" '
        f'alt="{escape(f.title)}" loading="eager">'
        f"<figcaption><b>{escape(f.title)}.</b> {escape(f.caption)} "
        f'<span class="files">(figures/{escape(f.key)}.png, data/{escape(f.key)}.csv)</span></figcaption></figure>'
    )


def _table(t: Table) -> str:
    head, rows = table_rows(t.df)
    text_cols = {i for i, c in enumerate(t.df.columns) if not pd.api.types.is_numeric_dtype(t.df[c])}
    out = [f'<div class="ttitle">{escape(t.title)}</div>' if t.title else "", "<table><thead><tr>"]
    out += [
        f'<th class="text">{escape(h)}</th>' if i in text_cols else f"<th>{escape(h)}</th>"
        for i, h in enumerate(head)
    ]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(
            (f'<td class="text{" long" if len(v) > 48 else ""}">{escape(v)}</td>' if i in text_cols else f"<td>{escape(v)}</td>")
            for i, v in enumerate(row)
        ) + "</tr>")  # fmt: skip
    out.append("</tbody></table>")
    if t.caption:
        out.append(f'<p class="tcap">{escape(t.caption)}</p>')
    return "".join(out)


def _block(b) -> str:
    if isinstance(b, Figure):
        return _figure(b)
    if isinstance(b, Table):
        return _table(b)
    if isinstance(b, Text):
        cls = "" if b.kind == "p" else f' class="{escape(b.kind)}"'
        return f"<p{cls}>{escape(b.text)}</p>"
    if isinstance(b, Section):
        return _section(b)
    raise TypeError(f"unknown block {type(b).__name__}")


def _section(s: Section) -> str:
    tag = f"h{s.level}"
    body = "\n".join(_block(b) for b in s.blocks)
    return f'<section id="{escape(s.id)}"><{tag}>{escape(s.title)}</{tag}>\n{body}\n</section>'


def render(report: Report) -> str:
    meta = "".join(f"<tr><td>{escape(k)}</td><td>{escape(v)}</td></tr>" for k, v in report.meta)
    summary = "".join(f"<li>{escape(s)}</li>" for s in report.summary)
    nav = "".join(f'<li><a href="#{escape(s.id)}">{escape(s.title)}</a></li>' for s in report.sections)
    sections = "\n".join(_section(s) for s in report.sections)
    notes = "".join(f"<li>{escape(n)}</li>" for n in report.notes)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(report.title)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>{escape(report.title)}</h1>
<table class="meta">{meta}</table>
<div class="summary"><b>Summary</b><ul>{summary}</ul></div>
<nav><ul>{nav}</ul></nav>
{sections}
<footer><b>Notes</b><ul>{notes}</ul>
Generated by calib (method: Cheng et al., POMACS 8(1), 2024). Every figure is also in figures/ as PNG and its
numbers in data/ as CSV.</footer>
</main></body></html>
"""
