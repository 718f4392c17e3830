"""Where calib's bundled data lives: the demo's traces and logs, and the published tables.

One documented lookup, in this order:

1. ``$CALIB_FIXTURES``, when set (a directory laid out like the repository's ``fixtures/``);
2. the package data of an installed wheel (``calib/fixtures/``: the demo's runs and
   ``published/``, see ``[tool.setuptools.package-data]`` in pyproject.toml);
3. the repository's ``fixtures/`` (a source checkout or an editable install).
"""

from __future__ import annotations

import os
from pathlib import Path

from calib.core.errors import InputError

ENV = "CALIB_FIXTURES"
_PACKAGE = Path(__file__).resolve().parents[1]  # the installed (or checked-out) calib/


def fixtures_dir() -> Path:
    """The bundled-data directory (see the module docstring); InputError when none exists."""
    env = os.environ.get(ENV)
    if env:
        path = Path(env).expanduser()
        if not path.is_dir():
            raise InputError(ENV, f"{path} is not a directory")
        return path
    for path in (_PACKAGE / "fixtures", _PACKAGE.parent / "fixtures"):
        if (path / "published").is_dir():
            return path
    raise InputError(
        "fixtures",
        f"no bundled data: neither {_PACKAGE / 'fixtures'} (an installed wheel) nor "
        f"{_PACKAGE.parent / 'fixtures'} (a source checkout) exists; set {ENV} to a fixtures directory",
    )


def published_dir() -> Path:
    """The published tables (``fixtures/published``)."""
    return fixtures_dir() / "published"


def table_or_published(name: str | Path) -> Path:
    """``name`` as given when it exists; else, for a bare file name, the bundled published
    table of that name when there is one (so ``calib validate megatron_sc21_...csv`` works
    from any directory); else ``name`` (whose reader then says it is missing)."""
    path = Path(name)
    if path.exists() or path.parent != Path("."):
        return path
    try:
        bundled = published_dir() / path.name
    except InputError:
        return path
    return bundled if bundled.is_file() else path
