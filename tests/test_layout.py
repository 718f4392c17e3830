"""The package layout: one-way imports between stages, stages that know nothing of the CLI.

ingest < calibrate < analytic < reports; a stage imports only ``calib.core`` and itself or
earlier stages, never the CLI (``calib.cli``, ``calib.commands``) or the API layer
(``calib.api``, ``calib.resolve``, ...), never opens the store, and never names a
command-line option or a ``calib`` command in a message.  Nothing imports the stage
folders as top-level packages, and no file is longer than 450 lines.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("ingest", "calibrate", "analytic", "reports")  # in data-flow order
SOURCE_DIRS = ("calib", *STAGES, "tests", "benchmarks", "fixtures")
MAX_LINES = 450

#: names of calib.core.store a stage may use: pure checks of names, no store access
PURE_STORE_NAMES = {"check_name", "safe_name"}
#: a command-line option in a string (``--gpus``, ``'--out'``), or a calib command
FLAG = re.compile(r"(?:^|[\s(\"'`/,])--[a-z][a-z0-9-]*")
COMMAND = re.compile(r"`calib |\bcalib (?:ingest|fit|show|predict|search|validate|runs|capture|bench|demo)\b")


def _py_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts)


def _stage_of(path: Path) -> str | None:
    top = path.relative_to(ROOT).parts[0]
    return top if top in STAGES else None


def _imports(tree: ast.AST) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) of every import, absolute."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names], node.lineno))
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


STAGE_FILES = _py_files(*STAGES)


def test_there_are_stage_files():
    assert {_stage_of(p) for p in STAGE_FILES} == set(STAGES)


@pytest.mark.parametrize("path", STAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_stage_imports_flow_one_way(path: Path):
    stage = _stage_of(path)
    allowed = {"calib.core", *(f"calib.{s}" for s in STAGES[: STAGES.index(stage) + 1])}
    tree = ast.parse(path.read_text())
    for module, names, line in _imports(tree):
        if module == "calib" or module.startswith("calib."):
            root = ".".join(module.split(".")[:2])
            assert root in allowed, (
                f"{path.name}:{line} imports {module} (a {stage} module may use {sorted(allowed)})"
            )
            if module == "calib.core.store":
                extra = set(names) - PURE_STORE_NAMES
                assert not extra, f"{path.name}:{line} opens the store ({', '.join(sorted(extra))})"
            if module == "calib.core":
                assert "store" not in names, f"{path.name}:{line} imports the store"


@pytest.mark.parametrize("path", STAGE_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_stages_name_no_option_and_no_command(path: Path):
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            assert not FLAG.search(text), f"{path.name}:{node.lineno} names an option: {text[:80]!r}"
            assert not COMMAND.search(text), f"{path.name}:{node.lineno} names a calib command: {text[:80]!r}"


def test_stage_error_fields_have_options():
    """Every field a stage's InputError names literally is in the CLI's one mapping table."""
    from calib.commands.flags import FLAGS

    fields = set()
    for path in STAGE_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "InputError" and node.args:
                first = node.args[0]
                if (
                    isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                    and re.fullmatch(r"[a-z][a-z0-9_]*", first.value)
                ):
                    fields.add(first.value)
    assert {"gpus", "global_batch", "where", "jobs", "zero_stage"} <= fields
    assert fields <= set(FLAGS), sorted(fields - set(FLAGS))


def test_cli_maps_fields_to_options():
    from calib.commands.flags import as_cli, flag_for
    from calib.core.errors import InputError

    assert flag_for("micro_batch") == "--micro-batch"
    assert flag_for("system polaris") == "--system polaris"
    assert flag_for("/data/trace.json") == "/data/trace.json"
    assert as_cli(InputError("gpus", "give at least one")).line() == "--gpus: give at least one"


@pytest.mark.parametrize("path", _py_files(*SOURCE_DIRS), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_top_level_stage_imports_and_no_long_files(path: Path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"{path.relative_to(ROOT)} has more than {MAX_LINES} lines"
    for module, _, line in _imports(ast.parse(text)):
        assert module.split(".")[0] not in STAGES, f"{path.name}:{line} imports top-level {module}"
    # also code in strings (the subprocess checks): "import a, b" and "from a import b" statements
    for m in re.finditer(r"(?m)(?:^\s*|[;\"']\s*)(?:import ([\w., ]+)|from ([\w.]+) import)", text):
        for name in (m.group(1) or m.group(2)).split(","):
            first = name.strip().split(".")[0].split(" ")[0]
            assert first not in STAGES, f"{path.name} imports top-level {name.strip()}"


def test_the_cli_and_api_layer_are_not_imported_by_the_core():
    for path in _py_files("calib/core"):
        for module, _, line in _imports(ast.parse(path.read_text())):
            if module.startswith("calib."):
                assert module.startswith("calib.core"), f"{path.name}:{line} imports {module}"
