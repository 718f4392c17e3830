"""The published-table kind of the hostile corpus (tests/test_hostile_corpus.py): the base
tables and their cell-level mutations, in a module of their own (the corpus module is at
the 450-line limit)."""

from __future__ import annotations

import csv
import io

from hypothesis import strategies as st

from tests.conftest import FIXTURES

#: one table per published format, and canonical tables with model presets, CP and MoE columns
TABLES = [
    FIXTURES / "published" / f"{name}.csv"
    for name in (
        "megatron_sc21_table1_weak_scaling",
        "megatron_readme_2020_tp_dp_scaling_iteration_times",
        "mosaicml_llmfoundry_fsdp_h100_fp8",
        "torchtitan_fsdp2_a100_llama",
        "llama3_405b_table4_scaling",
        "deepseek_v3_h800_pretraining",
    )
]


ODD_CELL = st.sampled_from(
    ["", " ", "x", "-1", "0", "0.5", "1e308", "-1e308", "nan", "inf", "-inf", "None", "true", "fp4", "1,5",
     "99999999999999999999999", "1e-320", "８", "\u202e", "a" * 300, '"', "3.5", "7", "2048"]
)  # fmt: skip


def mutate_table(blob: bytes, data) -> bytes:
    """One cell-level change of a CSV table: a cell, a column or the rows."""
    rows = list(csv.reader(io.StringIO(blob.decode())))
    how = data.draw(st.sampled_from(["cell", "cell", "cell", "column", "rows"]))
    if how == "column":
        j = data.draw(st.integers(0, len(rows[0]) - 1))
        rows = [r[:j] + r[j + 1 :] for r in rows]
    elif how == "rows":
        rows = rows[: data.draw(st.integers(1, len(rows)))]
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            i, j = data.draw(st.integers(1, len(rows) - 1)), data.draw(st.integers(0, len(rows[0]) - 1))
            rows[i][j] = data.draw(ODD_CELL)
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue().encode("utf-8", "surrogatepass")
