"""What a generated training run is: model shape, framework, world size, profiler window.

Torch-free on purpose: the generator's run list, the sidecar writer and ingest all read
these specs without paying for ``import torch``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: framework names as in calib.core.schema.Framework.name
FRAMEWORKS = ("pytorch", "ddp", "fsdp", "fsdp2", "deepspeed")
FSDP_STRATEGIES = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0}
ATTENTION_KINDS = ("math", "sdpa")


@dataclass(frozen=True)
class GPTShape:
    """A GPT of hidden size ``d``, ``l`` layers, ``a`` heads, sequence ``s``, vocab ``V``,
    micro-batch ``b`` per rank (the letters of seed 004 and DESIGN.md).

    ``attention="math"`` computes attention with explicit batched matmuls so that every
    FLOP of b(72 s d^2 + 12 s^2 d) l shows up as a matmul operator with shapes;
    ``"sdpa"`` uses ``scaled_dot_product_attention`` as most real models do.
    """

    d: int
    l: int  # noqa: E741 -- the paper's letter
    a: int
    s: int
    V: int
    b: int
    attention: str = "math"

    def __post_init__(self) -> None:
        for k in ("d", "l", "a", "s", "V", "b"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"GPTShape.{k} must be a positive integer, got {v!r}")
        if self.d % self.a:
            raise ValueError(f"GPTShape: d={self.d} is not divisible by a={self.a}")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"GPTShape.attention must be one of {ATTENTION_KINDS}")

    @property
    def params(self) -> int:
        """Trainable parameters of :class:`ingest.capture.model.TinyGPT` (exact)."""
        d, layers, s, V = self.d, self.l, self.s, self.V
        per_layer = 12 * d * d + 13 * d  # qkv, proj, fc1, fc2 with biases, two LayerNorms
        return layers * per_layer + V * d + s * d + 2 * d + V * d  # tok/pos embeddings, final LN, head

    @property
    def flops_per_step(self) -> float:
        """Model FLOPs per rank and step, forward + backward (seed 004: b(72sd^2+12s^2d)l,
        plus the LM head's 6bsdV)."""
        b, s, d, layers, V = self.b, self.s, self.d, self.l, self.V
        return float(b * (72 * s * d * d + 12 * s * s * d) * layers + 6 * b * s * d * V)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "params": self.params, "flops_per_step": self.flops_per_step}


@dataclass(frozen=True)
class ProfileWindow:
    """torch.profiler schedule: ``wait`` steps unrecorded, ``warmup`` recorded and dropped,
    ``active`` recorded; ``after`` more unprofiled steps are timed for a clean reference."""

    wait: int = 1
    warmup: int = 1
    active: int = 3
    after: int = 2

    def __post_init__(self) -> None:
        if self.wait < 0 or self.warmup < 0 or self.active < 1 or self.after < 0:
            raise ValueError("ProfileWindow: wait, warmup, after >= 0 and active >= 1")

    @property
    def steps(self) -> int:
        """Training steps the loop must run for the window to close, plus ``after``."""
        return self.wait + self.warmup + self.active + self.after


@dataclass(frozen=True)
class RunSpec:
    """One generated run: ``world_size`` gloo ranks on CPU training ``model`` under
    ``framework`` (``zero_stage`` for DeepSpeed, ``sharding`` for FSDP1)."""

    name: str
    framework: str
    world_size: int
    model: GPTShape
    zero_stage: int | None = None
    sharding: str | None = None
    window: ProfileWindow = field(default_factory=ProfileWindow)
    threads_per_rank: int = 1
    seed: int = 1234
    lr: float = 1e-3

    def __post_init__(self) -> None:
        if self.framework not in FRAMEWORKS:
            raise ValueError(f"RunSpec.framework must be one of {FRAMEWORKS}, got {self.framework!r}")
        if self.world_size < 1:
            raise ValueError("RunSpec.world_size must be >= 1")
        if self.framework == "fsdp" and self.sharding not in FSDP_STRATEGIES:
            raise ValueError(f"fsdp needs sharding in {sorted(FSDP_STRATEGIES)}")
        if self.framework == "deepspeed" and self.zero_stage not in (0, 1, 2, 3):
            raise ValueError("deepspeed needs zero_stage 0..3")
        if self.framework == "pytorch" and self.world_size != 1:
            raise ValueError("framework 'pytorch' (no data parallelism) runs on one rank")

    @property
    def effective_zero_stage(self) -> int:
        """ZeRO stage the run corresponds to (FSDP FULL_SHARD ~ 3, SHARD_GRAD_OP ~ 2)."""
        if self.framework == "deepspeed":
            return int(self.zero_stage or 0)
        if self.framework == "fsdp":
            return FSDP_STRATEGIES[str(self.sharding)]
        if self.framework == "fsdp2":
            return 3  # fully_shard with reshard_after_forward=True
        return 0

    def framework_json(self) -> dict[str, Any]:
        sharding = self.sharding
        if self.framework == "fsdp2":
            sharding = "FULL_SHARD"  # fully_shard(reshard_after_forward=True)
        return {
            "name": self.framework,
            "zero_stage": self.effective_zero_stage,
            "sharding_strategy": sharding,
        }
