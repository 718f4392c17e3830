"""Model and hardware specs: frozen data, loaded from sourced YAML/JSON files.

Presets live in ``analytic/data/models.yaml`` and ``analytic/data/hardware.yaml``; every
entry names its source.  Users pass a preset name or their own YAML/JSON file with the
same fields.  Bad names and malformed files raise :class:`InputError` naming the file.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import MISSING, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from calib.analytic.mla import check as check_mla

from calib.core.errors import InputError

DATA_DIR = Path(__file__).with_name("data")
MODELS_FILE = DATA_DIR / "models.yaml"
HARDWARE_FILE = DATA_DIR / "hardware.yaml"


MLP_KINDS = ("gelu", "swiglu")


#: the largest count a spec may state: beyond it float64 arithmetic loses whole units
MAX_COUNT = 2**53
#: scale-out topologies of the contention term, and their codes (calibrate.ncclmodel.contention)
TOPOLOGIES = {"none": 0.0, "dragonfly": 1.0, "fat-tree": 2.0}


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer: hidden d, layers l, heads a, sequence s, vocabulary V.

    ``ffn``: MLP hidden size (default 4d); ``kv_heads``: key/value heads (grouped-query
    attention; default a); ``mlp``: ``gelu`` (two matrices, GPT) or ``swiglu`` (gate, up
    and down, Llama); ``tied_embeddings``: the LM head shares the embedding matrix.
    """

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    vocab: int
    global_batch: int | None = None
    source: str = ""
    note: str = ""
    ffn: int | None = None
    kv_heads: int | None = None
    mlp: str = "gelu"
    tied_embeddings: bool = True
    #: mixture of experts (analytic.moe): routed experts (0 = dense), experts per token,
    #: expert MLP width (default ffn), shared experts, leading dense layers, capacity
    #: factor (None = dropless)
    n_experts: int = 0
    top_k: int = 0
    expert_ffn: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None
    #: a learned router's skew: the busiest EP rank's load over the mean beyond the statistical
    #: floor (analytic.moe.load_factor); 1.0 = a balanced router, the stated default
    router_imbalance: float = 1.0
    #: the model trains with dropout (GPT, Megatron: its masks are kept activations); Llama,
    #: Mixtral and DeepSeek have none (the presets say so, with their source)
    dropout: bool = True
    #: per-head query/key and value widths where they are not d / a (DeepSeek's multi-head
    #: latent attention: 128 + 64 and 128); they set the attention core's FLOPs
    qk_head_dim: int | None = None
    v_head_dim: int | None = None
    #: multi-head latent attention (analytic.mla): query and key/value compression ranks (None or
    #: 0: full rank), the decoupled RoPE key width; multi-token prediction depths (default 0: none)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        who = self.name or "model"
        for f in ("qk_head_dim", "v_head_dim"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_COUNT):
                raise InputError(who, f"{f} must be a positive integer, got {_short(v)}")
        if not isinstance(self.dropout, bool):
            raise InputError(who, f"dropout must be true or false, got {_short(self.dropout)}")
        for f in ("d_model", "n_layers", "n_heads", "seq_len", "vocab", "ffn", "kv_heads", "global_batch"):
            v = getattr(self, f)
            if v is None and f in ("ffn", "kv_heads", "global_batch"):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_COUNT:
                raise InputError(who, f"{f} must be a positive integer (at most 2^53), got {_short(v)}")
        for f in ("name", "source", "note"):
            if not isinstance(getattr(self, f), str):
                raise InputError(who, f"{f} must be text, got {_short(getattr(self, f))}")
        if self.kv_heads is not None and self.n_heads % self.kv_heads:
            raise InputError(who, f"kv_heads {self.kv_heads} must divide n_heads {self.n_heads}")
        if self.mlp not in MLP_KINDS:
            raise InputError(who, f"mlp must be one of {', '.join(MLP_KINDS)}, got {self.mlp!r}")
        if not isinstance(self.tied_embeddings, bool):
            raise InputError(who, f"tied_embeddings must be true or false, got {self.tied_embeddings!r}")
        _check_moe(self, who)
        check_mla(self, who, MAX_COUNT)

    @property
    def ffn_size(self) -> int:
        return self.ffn or 4 * self.d_model

    @property
    def kv_head_count(self) -> int:
        return self.kv_heads or self.n_heads

    @property
    def label(self) -> str:
        return self.name or f"d{self.d_model}-l{self.n_layers}-a{self.n_heads}-s{self.seq_len}"

    @property
    def shape_extras(self) -> dict:
        return {"ffn": self.ffn_size, "kv": self.kv_head_count, "mlp": self.mlp, "tied": self.tied_embeddings,
                "dropout": self.dropout, "qk_head_dim": self.qk_head_dim, "v_head_dim": self.v_head_dim}  # fmt: skip


def _check_moe(m: ModelSpec, who: str) -> None:
    for f in ("n_experts", "top_k", "shared_experts", "dense_layers"):
        v = getattr(m, f)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_COUNT:
            raise InputError(who, f"{f} must be a non-negative integer, got {_short(v)}")
    ef = m.expert_ffn
    if ef is not None and (not isinstance(ef, int) or isinstance(ef, bool) or not 1 <= ef <= MAX_COUNT):
        raise InputError(who, f"expert_ffn must be a positive integer, got {_short(ef)}")
    if m.n_experts and not 1 <= m.top_k <= m.n_experts:
        raise InputError(who, f"top_k must be in 1..n_experts={m.n_experts}, got {m.top_k}")
    if not m.n_experts and (m.top_k or m.shared_experts or m.dense_layers):
        raise InputError(who, "top_k, shared_experts and dense_layers need n_experts > 0")
    if m.dense_layers >= m.n_layers and m.n_experts:
        raise InputError(who, f"dense_layers {m.dense_layers} leaves no MoE layer of {m.n_layers}")
    cf = m.capacity_factor
    if cf is not None and (not _number(cf) or not 1 <= cf < float("inf")):
        raise InputError(
            who, f"capacity_factor must be a number >= 1 (or absent: dropless), got {_short(cf)}"
        )
    ri = m.router_imbalance
    if not _number(ri) or not 1 <= ri < float("inf") or (ri != 1 and not m.n_experts):
        raise InputError(who, f"router_imbalance must be a finite number >= 1 (1 = balanced, the default; "
                              f"> 1 needs n_experts > 0), got {_short(ri)}")  # fmt: skip


@dataclass(frozen=True)
class ModelColumns:
    """Per-row model shapes (arrays), accepted by the time model wherever a ModelSpec is."""

    d_model: np.ndarray
    n_layers: np.ndarray
    n_heads: np.ndarray
    seq_len: np.ndarray
    vocab: np.ndarray
    #: per-row MLP width and key/value heads (None: 4 d and n_heads), one MLP kind and tying
    ffn: np.ndarray | None = None
    kv_heads: np.ndarray | None = None
    mlp: str = "gelu"
    tied_embeddings: bool = True
    dropout: bool = True

    @property
    def shape_extras(self) -> dict:
        d, a = np.asarray(self.d_model, dtype=float), np.asarray(self.n_heads, dtype=float)
        ffn = 4.0 * d if self.ffn is None else np.asarray(self.ffn, dtype=float)
        kv = a if self.kv_heads is None else np.asarray(self.kv_heads, dtype=float)
        return {"ffn": ffn, "kv": kv, "mlp": self.mlp, "tied": self.tied_embeddings, "dropout": self.dropout}

    @property
    def label(self) -> str:
        return "table rows"


@dataclass(frozen=True)
class HardwareSpec:
    """One node type: per-GPU peak, HBM, and the scale-up / scale-out link bandwidths.

    The *target* machine's peak and GPUs per node; ``Calibration.peak_tflops`` / ``.gpus_per_node``
    are the *calibrated* system's (the fitted efficiencies' denominator), see calibrate.calibration.
    """

    name: str
    device: str
    peak_tflops: float
    hbm_gb: float
    hbm_tbps: float
    gpus_per_node: int
    scale_up_gbps: float  # per GPU, one direction
    node_nic_gbps: float  # whole node, one direction
    intra_busbw_efficiency: float = 0.75
    inter_busbw_efficiency: float = 0.73
    runtime_reserve_gb: float = 2.0
    source: str = ""
    note: str = ""
    #: scale-out topology for the all-to-all / tree contention term: "none", "dragonfly", "fat-tree"
    topology: str = "none"
    nodes_per_group: int = 0  # nodes in one dragonfly group / under one leaf switch
    global_taper: float = 1.0  # upper-level bandwidth per node over its injection bandwidth
    topology_note: str = ""
    peak_fp8_tflops: float | None = None  # dense FP8 tensor-core peak per GPU (None: no FP8)
    fp8_gemm_speedup: float | None = None  # measured FP8 / BF16 GEMM rate (None: peak ratio)
    #: measured maximum achievable bf16 matmul TFLOP/s of the device (a large GEMM's best; None:
    #: not measured): the ceiling of any GEMM efficiency, the default plateau (analytic.machine)
    mamf_tflops: float | None = None
    #: host / CPU offload memory per GPU (Calculon's offload tier; 0 = none) and its per-direction bandwidth
    offload_gb: float = 0.0
    offload_gbps: float = 0.0

    def __post_init__(self) -> None:
        who = self.name or "hardware"
        v8 = self.peak_fp8_tflops
        if v8 is not None and (not _number(v8) or not v8 > 0):
            raise InputError(who, f"peak_fp8_tflops must be a positive number, got {_short(v8)}")
        if (r8 := self.fp8_gemm_speedup) is not None and (v8 is None or not _number(r8) or not 0 < r8 < 1e3):
            raise InputError(who, f"fp8_gemm_speedup needs peak_fp8_tflops, a number > 0: {_short(r8)}")
        mamf = self.mamf_tflops
        if mamf is not None and (not _number(mamf) or not 0 < mamf <= self.peak_tflops):
            raise InputError(who, f"mamf_tflops must be a number in (0, peak_tflops], got {_short(mamf)}")
        for f in ("offload_gb", "offload_gbps"):
            v = getattr(self, f)
            if not _number(v) or v < 0:
                raise InputError(who, f"{f} must be a number >= 0, got {_short(v)}")
        for f in ("peak_tflops", "hbm_gb", "hbm_tbps", "scale_up_gbps", "node_nic_gbps"):
            v = getattr(self, f)
            if not _number(v) or not v > 0:
                raise InputError(who, f"{f} must be a positive number, got {_short(v)}")
        for f in ("gpus_per_node", "nodes_per_group"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or not (f == "gpus_per_node") <= v <= MAX_COUNT:
                raise InputError(who, f"{f} must be a positive integer (at most 2^53), got {_short(v)}")
        for f in ("intra_busbw_efficiency", "inter_busbw_efficiency", "global_taper"):
            v = getattr(self, f)
            if not _number(v) or not 0 < v <= 1:
                raise InputError(who, f"{f} must be in (0, 1], got {_short(v)}")
        if not _number(self.runtime_reserve_gb) or self.runtime_reserve_gb < 0:
            raise InputError(
                who, f"runtime_reserve_gb must be a number >= 0, got {_short(self.runtime_reserve_gb)}"
            )
        for f in ("name", "device", "source", "note", "topology", "topology_note"):
            if not isinstance(getattr(self, f), str):
                raise InputError(who, f"{f} must be text, got {_short(getattr(self, f))}")
        if self.topology not in TOPOLOGIES:
            raise InputError(
                who, f"topology must be one of {', '.join(TOPOLOGIES)}, got {_short(self.topology)}"
            )

    def network_topology(self) -> dict[str, float]:
        """The topology as the network fit takes it (calibrate.ncclmodel.contention)."""
        codes = TOPOLOGIES
        if self.topology not in codes:
            raise InputError(self.name, f"topology must be one of {', '.join(codes)}, got {self.topology!r}")
        return {
            "topology": codes[self.topology],
            "nodes_per_group": float(self.nodes_per_group),
            "global_taper": float(self.global_taper),
            "node_nic_gbps": float(self.node_nic_gbps),
        }

    @property
    def intra_busbw_gbps(self) -> float:
        """Default large-message bus bandwidth of a collective inside one node."""
        return self.scale_up_gbps * self.intra_busbw_efficiency

    @property
    def inter_busbw_gbps(self) -> float:
        """Default busbw of a collective spanning whole nodes: the node's NICs, derated.

        A ring over full nodes crosses each node boundary once per ring and NCCL runs one
        ring per NIC rail, so the plateau busbw is the node's NIC bandwidth (Polaris:
        36.5 GB/s measured over 2 x 25 GB/s), capped by the intra-node path.
        """
        return min(self.node_nic_gbps * self.inter_busbw_efficiency, self.intra_busbw_gbps)

    @property
    def hbm_bytes(self) -> float:
        """Device memory in bytes.  Vendors' "80 GB" of HBM is binary: 80 GiB (nvidia-smi
        reports 40960 MiB for an A100 40GB, 81920 MiB for an A100 80GB), so ``hbm_gb`` is
        taken in units of 2^30 bytes; memory terms are printed in GB of 1e9 bytes."""
        return self.hbm_gb * 2.0**30


def _number(v: Any) -> bool:
    """A real number, not NaN (infinity is "unbounded"; an int only if a float can hold it)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return not math.isnan(float(v))
    except OverflowError:
        return False


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


# ---- loading -------------------------------------------------------------------------
def _read_mapping(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except OSError as exc:
        raise InputError(path, f"unreadable: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(
            path, f"malformed {'JSON' if path.suffix.lower() == '.json' else 'YAML'}: {first}"
        ) from None
    if not isinstance(data, dict):
        raise InputError(path, "expected a mapping of fields (YAML/JSON object)")
    return data


def _build(cls: type, where: str | Path, name: str, entry: Any, extra: dict[str, Any] | None = None):
    if not isinstance(entry, dict):
        raise InputError(where, f"entry '{name}' must be a mapping of fields")
    known = {f.name for f in fields(cls)}
    data = {**(extra or {}), **{k: v for k, v in entry.items() if k in known}}
    data.setdefault("name", name)
    # per-number sources and notes ("peak_fp8_source") are documentation, not fields
    unknown = sorted(
        k for k in set(entry) - known - {"aliases", "family"} if not k.endswith(("_source", "_note"))
    )
    if unknown:
        raise InputError(
            where,
            f"entry '{name}': unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})",
        )
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [f for f in required if f not in data]
    if missing:
        raise InputError(where, f"entry '{name}': missing field(s) {', '.join(missing)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise InputError(where, f"entry '{name}': {exc}") from None
    except InputError as exc:  # a field's check names the entry; the file is where it is
        raise InputError(where, f"entry '{name}': {exc.problem}") from None


@cache
def _model_presets() -> dict[str, ModelSpec]:
    raw = _read_mapping(MODELS_FILE)
    families = raw.get("families", {})
    out: dict[str, ModelSpec] = {}
    for name, entry in raw["models"].items():
        fam = families.get(entry.get("family"), {})
        extra = {
            "source": fam.get("source", ""),
            "note": " ".join(filter(None, [fam.get("note", ""), entry.get("note", "")])),
        }
        out[name] = _build(
            ModelSpec, MODELS_FILE, name, {k: v for k, v in entry.items() if k != "note"}, extra
        )
    return out


@cache
def _hardware_presets() -> tuple[dict[str, HardwareSpec], dict[str, str]]:
    raw = _read_mapping(HARDWARE_FILE)
    d = raw.get("defaults", {})
    base = {
        "intra_busbw_efficiency": d.get("intra_busbw_efficiency", 0.75),
        "inter_busbw_efficiency": d.get("inter_busbw_efficiency", 0.73),
        "runtime_reserve_gb": d.get("runtime_reserve_gb", 2.0),
    }
    out: dict[str, HardwareSpec] = {}
    aliases: dict[str, str] = {}
    for name, entry in raw["systems"].items():
        out[name] = _build(HardwareSpec, HARDWARE_FILE, name, entry, base)
        for alias in entry.get("aliases", []):
            aliases[alias] = name
    return out, aliases


def model_names() -> list[str]:
    return list(_model_presets())


def hardware_names() -> list[str]:
    return list(_hardware_presets()[0])


def load_model(name_or_file: str) -> ModelSpec:
    """A preset by name (case-insensitive) or a YAML/JSON file with ModelSpec fields."""
    presets = _model_presets()
    key = name_or_file.strip().lower()
    if key in presets:
        return presets[key]
    path = Path(name_or_file)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or os.path.exists(path):
        entry = _read_mapping(path)
        return _build(ModelSpec, path, entry.pop("name", path.stem), entry)
    raise InputError(
        "model", f"unknown model '{name_or_file}' (presets: {', '.join(presets)}; or a YAML/JSON file)"
    )


def load_hardware(name_or_file: str) -> HardwareSpec:
    """A preset by name or alias (case-insensitive; spaces and underscores read as hyphens:
    ``A100 80GB``, ``h100_80gb``) or a YAML/JSON file with HardwareSpec fields."""
    presets, aliases = _hardware_presets()
    key = "-".join(name_or_file.strip().lower().replace("_", " ").split())
    key = aliases.get(key, key)
    if key in presets:
        return presets[key]
    path = Path(name_or_file)
    if path.suffix.lower() in (".yaml", ".yml", ".json") or os.path.exists(path):
        entry = _read_mapping(path)
        return _build(HardwareSpec, path, entry.pop("name", path.stem), entry)
    raise InputError(
        "hardware",
        f"unknown hardware '{name_or_file}' (presets: {', '.join(presets)}; or a YAML/JSON file)",
    )


def hardware_for_device(device: str | None, gpus_per_node: int | None = None) -> HardwareSpec | None:
    """The preset whose device matches a calibration's ``device`` (and GPUs per node, if given)."""
    if not device:
        return None

    def key(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    want = key(device)
    found = [
        h
        for h in _hardware_presets()[0].values()
        if want == key(h.device) or want in key(h.device) or key(h.device) in want
    ]
    if not found:  # the name torch reports ("NVIDIA H100 80GB HBM3") against the preset's
        from calib.core.devices import same_chip

        found = [h for h in _hardware_presets()[0].values() if same_chip(device, h.device)]
    same_node = [h for h in found if gpus_per_node is None or h.gpus_per_node == gpus_per_node]
    return (same_node or found or [None])[0]
