"""What a report predicts: the prediction spec file (YAML or JSON) and its defaults.

A spec has up to five parts; each is optional and a missing part is simply not drawn::

    hardware: dgx-h100          # optional: transfer the calibration to this spec (or model
                                # from the spec alone when the report has no --system)
    scaling:                    # ZeRO-1/2/3 scaling curves (seed 004 Fig. 12-14)
      models: [gpt-125m, gpt-1.3b, gpt-2.7b, gpt-6.7b, gpt-13b, gpt-18.4b]
      gpus: [8, 16, 32, 64, 128, 256, 512]
      zero: [1, 2, 3]
      micro_batch: 1            # weak scaling: one micro-batch per GPU per iteration
    maps:                       # TP x DP and TP x PP communication maps
      model: gpt-13b
      gpus: 512                 # the TP x PP map's GPU count (DP = gpus / (TP PP))
      tp: [1, 2, 4, 8]
      pp: [1, 2, 4, 8]
      dp: [1, 2, 4, 8, 16, 32, 64]   # the TP x DP map (PP = 1, GPUs = TP DP)
      zero: 1
      global_batch: 512         # the TP x PP map's sequences per iteration
    search:                     # the top strategies of a full search
      model: gpt-13b
      gpus: 512
      global_batch: 512
      top: 10
    validate:                   # predicted against measured, held-out rows only
      - {table: megatron_sc21_table1_weak_scaling.csv, calibrate_on: "1,4,7,10"}

The spec ``default`` (what a report of a calibration alone uses) is the block above plus
the Korthikanti and Megatron-2020 tables; ``none`` predicts nothing.  Table paths
are taken relative to the spec file, then to the bundled published tables
(:func:`calib.core.bundled.published_dir`: ``$CALIB_FIXTURES``, package data, or the repository's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from calib.core.bundled import published_dir
from calib.core.errors import InputError

SEED004_MODELS = ("gpt-125m", "gpt-1.3b", "gpt-2.7b", "gpt-6.7b", "gpt-13b", "gpt-18.4b")


@dataclass(frozen=True)
class ScalingSpec:
    models: tuple[str, ...] = SEED004_MODELS
    gpus: tuple[int, ...] = (8, 16, 32, 64, 128, 256, 512)
    zero: tuple[int, ...] = (1, 2, 3)
    micro_batch: int = 1


@dataclass(frozen=True)
class MapSpec:
    model: str = "gpt-13b"
    gpus: int = 512
    tp: tuple[int, ...] = (1, 2, 4, 8)
    pp: tuple[int, ...] = (1, 2, 4, 8)
    dp: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    zero: int = 1
    micro_batch: int = 1
    global_batch: int = 512


@dataclass(frozen=True)
class SearchSpec:
    model: str = "gpt-13b"
    gpus: int = 512
    global_batch: int = 512
    top: int = 10


@dataclass(frozen=True)
class ValidateSpec:
    table: str
    calibrate_on: str | None = None  # None: leave-one-out


@dataclass(frozen=True)
class PredictSpec:
    hardware: str | None = None
    scaling: ScalingSpec | None = None
    maps: MapSpec | None = None
    search: SearchSpec | None = None
    validate: tuple[ValidateSpec, ...] = ()
    source: str = "default"  # where the spec came from (shown in the report)
    base_dir: Path | None = field(default=None, compare=False)

    @property
    def empty(self) -> bool:
        return not (self.scaling or self.maps or self.search or self.validate)


DEFAULT_VALIDATE = (
    ValidateSpec("megatron_sc21_table1_weak_scaling.csv", "1,4,7,10"),
    ValidateSpec("korthikanti2022_table5_iteration_times.csv", "full"),
    ValidateSpec("megatron_readme_2020_tp_dp_scaling_iteration_times.csv", None),
)


def default_spec() -> PredictSpec:
    return PredictSpec(
        scaling=ScalingSpec(),
        maps=MapSpec(),
        search=SearchSpec(),
        validate=DEFAULT_VALIDATE,
        source="default",
    )


NONE = PredictSpec(source="none")


def load_spec(text: str | None) -> PredictSpec | None:
    """``None`` (not given), ``default``, ``none`` or a YAML/JSON file path."""
    if text is None:
        return None
    if text.strip().lower() == "default":
        return default_spec()
    if text.strip().lower() == "none":
        return NONE
    path = Path(text)
    try:
        raw_text = path.read_text()
    except FileNotFoundError:
        raise InputError(
            "predict", f"{text}: no such file (give a YAML/JSON spec, 'default' or 'none')"
        ) from None
    except OSError as exc:
        raise InputError("predict", f"{text}: unreadable: {exc.strerror or exc}") from None
    try:
        raw = json.loads(raw_text) if path.suffix.lower() == ".json" else yaml.safe_load(raw_text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(path, f"malformed spec: {first}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InputError(path, "a spec is a mapping with keys hardware, scaling, maps, search, validate")
    return parse_spec(raw, str(path), path.parent)


_KEYS = ("hardware", "scaling", "maps", "search", "validate")


def parse_spec(raw: dict[str, Any], where: str, base_dir: Path | None = None) -> PredictSpec:
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise InputError(where, f"unknown key(s) {', '.join(unknown)} (known: {', '.join(_KEYS)})")
    hardware = raw.get("hardware")
    if hardware is not None and not isinstance(hardware, str):
        raise InputError(where, "hardware: expected a preset name or a spec file path")
    validate = raw.get("validate") or []
    if not isinstance(validate, list):
        raise InputError(where, "validate: expected a list of {table: FILE, calibrate_on: ROWS}")
    vals = []
    for i, v in enumerate(validate):
        if isinstance(v, str):
            v = {"table": v}
        vals.append(_build(ValidateSpec, v, f"{where}: validate[{i}]"))
    return PredictSpec(
        hardware=hardware,
        scaling=_part(ScalingSpec, raw, "scaling", where),
        maps=_part(MapSpec, raw, "maps", where),
        search=_part(SearchSpec, raw, "search", where),
        validate=tuple(vals),
        source=where,
        base_dir=base_dir,
    )


def _part(cls: type, raw: dict, key: str, where: str):
    if key not in raw or raw[key] is None or raw[key] is False:
        return None
    value = raw[key]
    if value is True:
        return cls()
    return _build(cls, value, f"{where}: {key}")


def _build(cls: type, value: Any, where: str):
    if not isinstance(value, dict):
        raise InputError(where, "expected a mapping of fields")
    fields = cls.__dataclass_fields__
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise InputError(where, f"unknown field(s) {', '.join(unknown)} (known: {', '.join(fields)})")
    out = {}
    for name, v in value.items():
        default = fields[name].default
        if isinstance(default, tuple):
            items = v if isinstance(v, list) else [v]
            out[name] = tuple(
                _typed(x, type(default[0]) if default else str, f"{where}: {name}") for x in items
            )
        elif name in ("table", "model", "calibrate_on"):
            if v is not None and not isinstance(v, (str, int)):
                raise InputError(where, f"{name}: expected text, got {v!r}")
            out[name] = None if v is None else str(v)
        else:
            out[name] = _typed(v, int, f"{where}: {name}")
    try:
        obj = cls(**out)
    except TypeError as exc:
        raise InputError(where, str(exc)) from None
    for name in fields:
        v = getattr(obj, name)
        ints = (
            v if isinstance(v, tuple) and v and isinstance(v[0], int) else (v,) if isinstance(v, int) else ()
        )
        if any(x < (0 if name == "zero" else 1) for x in ints):
            raise InputError(where, f"{name}: values must be positive, got {v}")
        if name == "zero" and any(x > 3 for x in ints):
            raise InputError(where, f"zero: ZeRO stages are 0-3, got {v}")
    return obj


def _typed(v: Any, kind: type, where: str):
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(where, f"expected an integer, got {v!r}")
        return v
    if not isinstance(v, str):
        raise InputError(where, f"expected a name, got {v!r}")
    return v


def table_path(spec: PredictSpec, name: str) -> Path:
    """A validation table: as given, relative to the spec file, or bundled."""
    published = published_dir()
    for base in (None, spec.base_dir, published):
        p = Path(name) if base is None else base / name
        if p.is_file():
            return p
    raise InputError(
        "predict",
        f"validation table '{name}' not found (as given, next to the spec, or in {published})",
    )
