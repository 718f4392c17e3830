"""Progress bars on a terminal, nothing elsewhere.

tqdm writes to stderr only when stderr is a terminal (and ``CALIB_PROGRESS`` is not
``0``); in CI, pipes and logs the work runs quietly and the output stays plain.
``CALIB_PROGRESS=1`` forces bars (for a terminal multiplexer that hides the tty).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def enabled() -> bool:
    flag = os.environ.get("CALIB_PROGRESS", "")
    if flag == "0":
        return False
    if flag == "1":
        return True
    return sys.stderr.isatty()


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "step") -> Iterator[T]:
    """``items`` with a tqdm bar on stderr when :func:`enabled`, else ``items`` unchanged."""
    if not enabled():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=desc, total=total, unit=unit, file=sys.stderr, leave=False)


class Steps:
    """One bar over named steps: ``with Steps(n, "report") as s: s.step("figures"); ...``.

    ``step(name)`` marks the previous step done and shows ``name`` as the one running.
    """

    def __init__(self, total: int, desc: str) -> None:
        self._bar = None
        self._running = False
        if enabled():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="step", file=sys.stderr, leave=False)

    def step(self, name: str) -> None:
        if self._bar is None:
            return
        if self._running:
            self._bar.update(1)
        self._running = True
        self._bar.set_postfix_str(name[:48])

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            if self._running:
                self._bar.update(1)
            self._bar.close()
