"""Shared fixture paths: real traces and logs copied into fixtures/ with their SOURCE notes."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
HTA = FIXTURES / "traces" / "hta"
CPU = FIXTURES / "traces" / "cpu"

GPU_TRACES = {
    "nccl_data": HTA / "nccl_parser_config" / "nccl_data.json.gz",
    "control": HTA / "trace_diff" / "control" / "control.json.gz",
    "test": HTA / "trace_diff" / "test" / "test.json.gz",
    "sampled_rank-0": HTA / "trace_filter" / "sampled_rank-0.json.gz",
    "sampled_rank-1": HTA / "trace_filter" / "sampled_rank-1.json.gz",
    "df_index_resolver": HTA / "df_index_resolver" / "df_index_resolver.json.gz",
}
CPU_TRACES = {p.name.split(".")[0]: p for p in sorted(CPU.glob("*.json.gz"))}
ALL_TRACES = {**GPU_TRACES, **CPU_TRACES}


@pytest.fixture(scope="session")
def ingested():
    """ingest_rank results per fixture trace, computed once per session."""
    from calib.ingest.orchestrate import ingest_rank

    cache: dict[str, object] = {}

    def get(key: str):
        if key not in cache:
            cache[key] = ingest_rank(ALL_TRACES[key])
        return cache[key]

    return get


def run(*args: str):
    """``calib ARGS`` in-process; exceptions propagate (InputError included)."""
    from click.testing import CliRunner

    from calib.cli import cli

    return CliRunner().invoke(cli, list(args), standalone_mode=False, catch_exceptions=False)


def bad(*args: str):
    """The InputError ``calib ARGS`` raises (fails the test when it raises none)."""
    from calib.core.errors import InputError

    with pytest.raises(InputError) as exc:
        run(*args)
    return exc.value
