"""calib.core.atomic: the one implementation of atomic files and directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from calib.core import atomic
from calib.core.atomic import DirExists, replacing_dir, replacing_file, write_text


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_write_text_replaces_and_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    write_text(path, "old\n")
    with pytest.raises(RuntimeError), replacing_file(path) as tmp:
        tmp.write_text("half")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old\n" and not _hidden(tmp_path)
    write_text(path, "new\n")
    assert path.read_text() == "new\n" and not _hidden(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "rename-aside"])
def test_replacing_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool) -> None:
    if not exchange:  # the portable path, taken where the kernel has no RENAME_EXCHANGE
        monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
    target = tmp_path / "run"
    with replacing_dir(target) as tmp:
        (tmp / "f").write_text("1")
    with pytest.raises(DirExists), replacing_dir(target) as tmp:
        pass
    with pytest.raises(RuntimeError), replacing_dir(target, replace=True) as tmp:
        (tmp / "f").write_text("half")
        raise RuntimeError("interrupted")
    assert (target / "f").read_text() == "1"
    with pytest.raises(DirExists), replacing_dir(target, replace=True, may_replace=lambda t: False) as tmp:
        (tmp / "f").write_text("2")
    assert (target / "f").read_text() == "1"
    with replacing_dir(target, replace=True) as tmp:
        (tmp / "f").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["f"] and (target / "f").read_text() == "2"
    assert not _hidden(tmp_path)


def test_a_directory_made_meanwhile_is_not_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "run"
    with pytest.raises(DirExists), replacing_dir(target) as tmp:
        (tmp / "mine").write_text("1")
        target.mkdir()
        (target / "theirs").write_text("2")  # another writer finished first
    assert sorted(p.name for p in target.iterdir()) == ["theirs"] and not _hidden(tmp_path)
