"""Parsing of the sizes, lists and shapes users type on the command line.

Every bad value is an :class:`InputError` naming the option, so the CLI can print one
line and exit 2.
"""

from __future__ import annotations

import re

from calib.core.errors import InputError

#: nccl-tests convention: K, M, G are powers of 1024
_BYTE_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 1 << 10,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 1 << 20,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 1 << 30,
    "GIB": 1 << 30,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int8": 1}
_DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp64": "float64",
    "double": "float64",
}


def parse_bytes(text: str, option: str) -> int:
    """``"64"``, ``"1K"``, ``"16M"``, ``"1G"`` (powers of 1024, as nccl-tests -b/-e)."""
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _BYTE_UNITS:
        raise InputError(option, f"'{text}' is not a size (e.g. 64, 1K, 16M, 1G)")
    value = float(m.group(1)) * _BYTE_UNITS[unit]
    if value < 1 or value != int(value):
        raise InputError(option, f"'{text}' is not a positive whole number of bytes")
    return int(value)


def parse_dtype(text: str, option: str) -> str:
    name = _DTYPE_ALIASES.get(text.strip().lower(), text.strip().lower())
    if name not in DTYPES:
        raise InputError(option, f"unknown dtype '{text}' (one of {', '.join(DTYPES)})")
    return name


def parse_list(text: str, option: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise InputError(option, "empty list")
    return items


def parse_positive_ints(text: str, option: str) -> list[int]:
    out = []
    for item in parse_list(text, option):
        if not item.isdigit() or int(item) < 1:
            raise InputError(option, f"'{item}' is not a positive integer")
        out.append(int(item))
    return out


def parse_shape(text: str, option: str) -> tuple[int, int, int]:
    """``MxNxK`` (a GEMM C[m,n] = A[m,k] B[k,n])."""
    parts = re.split(r"[xX*,]", text.strip())
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise InputError(option, f"'{text}' is not a GEMM shape MxNxK (e.g. 4096x4096x4096)")
    m, n, k = (int(p) for p in parts)
    return m, n, k


def parse_kv_ints(text: str, option: str, keys: tuple[str, ...]) -> dict[str, int]:
    """``d=4096,s=2048,b=1`` into a dict of positive ints, only from ``keys``."""
    out: dict[str, int] = {}
    for item in parse_list(text, option):
        k, sep, v = item.partition("=")
        k = k.strip()
        if not sep or k not in keys:
            raise InputError(option, f"'{item}' is not KEY=VALUE with KEY one of {', '.join(keys)}")
        if not v.strip().isdigit() or int(v) < 1:
            raise InputError(option, f"{k}={v!r}: not a positive integer")
        out[k] = int(v)
    return out
