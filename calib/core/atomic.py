"""Atomic writes: a reader sees the old file (or directory) or the new one, never half of one.

Everything calib writes goes through here: a file is written to a temporary sibling and
renamed over its target (:func:`write_text`, :func:`write_bytes`, :func:`replacing_file`);
a directory (a run, a report, a captured run) is built in a temporary sibling and moved
into place by :func:`replacing_dir`.  Temporaries live in the target's own directory (same
file system, so the rename is atomic) and carry a leading dot, so listings skip them.

Replacing an existing directory swaps the two in one ``renameat2(RENAME_EXCHANGE)`` call
where the kernel offers it (Linux); elsewhere the old directory is first renamed aside,
whole, and the new one renamed in.  Either way the old contents are never deleted before
the new ones are complete and in place, and are removed only after.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["DirExists", "replacing_dir", "replacing_file", "write_bytes", "write_text"]


class DirExists(FileExistsError):
    """The target directory exists and ``replace`` was not given (or it appeared meanwhile)."""


@contextlib.contextmanager
def replacing_file(path: str | Path, mode: int = 0o644, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is renamed over ``path``.

    ``suffix`` ends the temporary's name (a writer may choose its format by it, as torch
    gzips a trace whose name ends in ``.gz``).  On any exception the temporary is removed
    and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, mode)  # mkstemp makes it private; calib's files are shared data
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``."""
    with replacing_file(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path``."""
    return write_bytes(path, text.encode(encoding))


@contextlib.contextmanager
def replacing_dir(
    target: str | Path,
    *,
    replace: bool = False,
    may_replace: Callable[[Path], bool] | None = None,
) -> Iterator[Path]:
    """Yield an empty temporary directory next to ``target``; on success it becomes ``target``.

    Without ``replace`` an existing ``target`` raises :class:`DirExists`, also when another
    writer created it while this one was building (the final rename then fails).  With
    ``replace``, an existing ``target`` is swapped out atomically; ``may_replace(target)``
    may veto it (e.g. "this directory is not a calib run") by returning False, which raises
    :class:`DirExists` too.  On any exception the temporary is removed and ``target`` is
    untouched.
    """
    target = Path(target)
    if target.exists() and not replace:
        raise DirExists(errno.EEXIST, "exists", str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private
        yield tmp
        _move_into_place(tmp, target, replace=replace, may_replace=may_replace)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _move_into_place(tmp: Path, target: Path, *, replace: bool, may_replace) -> None:
    if not target.exists():
        try:
            os.rename(tmp, target)  # fails on a non-empty directory made meanwhile
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.exists():
                raise
            if not replace:
                raise DirExists(errno.EEXIST, "exists", str(target)) from None
    if not replace or (may_replace is not None and not may_replace(target)):
        raise DirExists(errno.EEXIST, "exists", str(target))
    if _exchange(tmp, target):
        return  # tmp now holds the old contents; the caller's cleanup removes them
    aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.rename(target, aside / "old")  # the old directory, whole, out of the way
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(aside / "old", target)  # put it back
        aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (Linux renameat2); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False  # kernel or file system without RENAME_EXCHANGE
    raise OSError(err, os.strerror(err), str(b))
