"""Contract files are read strictly: a key calib does not know is an error, never dropped.

Every hand-written ``from_json`` of a contract (``run.json``, calibration JSON) calls
:func:`reject_unknown` first.  The error is a ValueError naming the object and the keys;
the file's reader turns it into one line naming the file.  A key that a newer calib
added reads as unknown here, which is the point: an older calib must not silently
compute with half of a newer file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any


def known_fields(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def reject_unknown(d: Mapping[str, Any], known: type | Iterable[str], what: str) -> None:
    """Raise ValueError when ``d`` has keys outside ``known`` (a dataclass or names)."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{what} must be an object, got {type(d).__name__}")
    names = known_fields(known) if isinstance(known, type) else frozenset(known)
    unknown = sorted(str(k) for k in set(d) - names)
    if unknown:
        raise ValueError(
            f"unknown field(s) {', '.join(repr(k) for k in unknown)} in {what} "
            f"(known: {', '.join(sorted(names))}; written by a newer calib, or a typo?)"
        )
