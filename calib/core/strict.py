"""Contract files are read strictly: a key calib does not know is an error, never dropped.

Every hand-written ``from_json`` of a contract (``run.json``, calibration JSON) calls
:func:`reject_unknown` first.  The error is a ValueError naming the object and the keys;
the file's reader turns it into one line naming the file.  A key that a newer calib
added reads as unknown here, which is the point: an older calib must not silently
compute with half of a newer file.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import types
import typing
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


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def check_types(obj: Any, what: str) -> None:
    """Raise ValueError naming the field when a field of the dataclass ``obj`` (and of the
    dataclasses inside it) does not hold its annotated type.

    A reader calls this on what it built from a file, so that a number where a name belongs
    (or a list where a number belongs) is refused on reading, never met later as a
    TypeError deep inside a computation.  Floats must be finite numbers (an int is a float).
    """
    for f in dataclasses.fields(obj):
        _check(getattr(obj, f.name), _hints(type(obj))[f.name], f"{what}.{f.name}")


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond float range
        return False


def _fail(where: str, want: str, value: Any) -> None:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise ValueError(f"field '{where}' must be {want}, got {shown}")


def _check(value: Any, hint: Any, where: str) -> None:  # noqa: C901 - one branch per kind of type
    if hint is Any:
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return
        for arg in (a for a in args if a is not type(None)):
            try:
                _check(value, arg, where)
                return
            except ValueError:
                if len(args) - (type(None) in args) == 1:
                    raise
        _fail(where, " or ".join(getattr(a, "__name__", str(a)) for a in args), value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            _fail(where, "a finite number", value)
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(where, "an integer", value)
    elif hint is bool:
        if not isinstance(value, bool):
            _fail(where, "true or false", value)
    elif hint is str:
        if not isinstance(value, str):
            _fail(where, "a string", value)
    elif origin is tuple:
        if not isinstance(value, tuple):
            _fail(where, "a list", value)
        if len(args) == 2 and args[1] is Ellipsis:
            for i, v in enumerate(value):
                _check(v, args[0], f"{where}[{i}]")
        elif args:
            if len(value) != len(args):
                _fail(where, f"a list of {len(args)}", value)
            for i, (v, a) in enumerate(zip(value, args, strict=True)):
                _check(v, a, f"{where}[{i}]")
    elif origin in (Mapping, dict, collections.abc.Mapping):
        if not isinstance(value, Mapping):
            _fail(where, "an object", value)
        key_t, val_t = args or (Any, Any)
        for k, v in value.items():
            _check(k, key_t, f"{where}")
            _check(v, val_t, f"{where}.{k}")
    elif dataclasses.is_dataclass(hint):
        if not isinstance(value, hint):
            _fail(where, "an object", value)
        check_types(value, where)
