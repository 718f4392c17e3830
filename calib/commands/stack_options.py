"""Options for today's training stacks (MoE/EP, context parallelism, FP8, schedules, overlap),
shared by ``calib predict`` and ``calib search``."""

from __future__ import annotations

from dataclasses import replace

import click

from calib.commands.options import Choice, Int, option_name
from calib.core.errors import InputError

SCHEDULE_HELP = "1f1b (interleaved with --interleave > 1), zb-h1 (Qi et al. 2023) or dualpipe (DeepSeek-V3)."


class Number(click.ParamType):
    """A float >= ``lo`` with one-line errors."""

    name = "number"

    def __init__(self, lo: float) -> None:
        self.lo = lo

    def convert(self, value, param, ctx):
        opt = option_name(param)
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise InputError(opt, f"expected a number, got '{value}'") from None
        if not v >= self.lo or v == float("inf"):
            raise InputError(opt, f"must be a finite number >= {self.lo:g}, got {v:g}")
        return v


def moe_model_options(f):
    """Mixture-of-experts shape overrides (on a preset or a --d/--l/--a shape)."""
    for opt in reversed(
        [
            click.option(
                "--experts", "n_experts", type=Int(0), help="Routed experts per MoE layer (0 = dense)."
            ),
            click.option("--top-k", "top_k", type=Int(1), help="Routed experts per token."),
            click.option(
                "--expert-ffn", "expert_ffn", type=Int(1), help="Expert MLP hidden size (default --ffn)."
            ),
            click.option(
                "--shared-experts", "shared_experts", type=Int(0), help="Shared experts (DeepSeekMoE)."
            ),
            click.option(
                "--dense-layers", "dense_layers", type=Int(0), help="Leading layers with a dense MLP."
            ),
            click.option(
                "--capacity-factor",
                "capacity_factor",
                type=Number(1.0),
                help="Expert capacity factor (token dropping; default dropless).",
            ),
            click.option(
                "--router-imbalance",
                "router_imbalance",
                type=Number(1.0),
                help="A learned router's skew: the busiest EP rank's load over the mean beyond the "
                "statistical floor, >= 1 (default 1.0: balanced, or the model's; analytic.moe).",
            ),
            click.option(
                "--q-lora-rank",
                "q_lora_rank",
                type=Int(0),
                help="Multi-head latent attention: query compression rank (0 = full-rank queries, the "
                "default; deepseek-v3: 1536).",
            ),
            click.option(
                "--kv-lora-rank",
                "kv_lora_rank",
                type=Int(0),
                help="Multi-head latent attention: key/value compression rank (0 = none, the default; "
                "deepseek-v3: 512).",
            ),
            click.option(
                "--qk-rope-dim",
                "qk_rope_head_dim",
                type=Int(0),
                help="Width of MLA's decoupled RoPE key per head (needs --kv-lora-rank; deepseek-v3: 64).",
            ),
            click.option(
                "--mtp-layers",
                "mtp_layers",
                type=Int(0),
                help="Multi-token-prediction depths: each adds one block (one more layer of the pipeline "
                "split), a 2d x d projection and the shared LM head once more, with the head on the last "
                "stage (default 0; deepseek-v3: 1).",
            ),
        ]
    ):
        f = opt(f)
    return f


def apply_moe(model, n_experts=None, top_k=None, expert_ffn=None, shared_experts=None, dense_layers=None,
              capacity_factor=None, router_imbalance=None, **mla):  # fmt: skip
    """The model with the given MoE, MLA and MTP overrides (ModelSpec validates the combination)."""
    over = {
        k: v
        for k, v in (
            ("n_experts", n_experts),
            ("top_k", top_k),
            ("expert_ffn", expert_ffn),
            ("shared_experts", shared_experts),
            ("dense_layers", dense_layers),
            ("capacity_factor", capacity_factor),
            ("router_imbalance", router_imbalance),
            *mla.items(),
        )  # fmt: skip
        if v is not None
    }
    if over.get("n_experts") and "top_k" not in over and not model.top_k:
        raise InputError("--top-k", "give the experts per token with --experts")
    if over.get("n_experts") == 0:  # --experts 0: the dense variant of a MoE preset
        over.update(top_k=0, shared_experts=0, dense_layers=0, expert_ffn=None, capacity_factor=None,
                    router_imbalance=1.0)  # fmt: skip
    if not over:
        return model
    try:
        return replace(model, **over)
    except InputError as exc:  # ModelSpec names its field ('top_k must be ...'): name the option
        field = next((k for k in over if exc.problem.startswith(k + " ")), None)
        if field is None:
            raise
        raise InputError(MOE_FLAGS[field], exc.problem) from None


MOE_FLAGS = {"n_experts": "--experts", "top_k": "--top-k", "expert_ffn": "--expert-ffn",
             "shared_experts": "--shared-experts", "dense_layers": "--dense-layers",
             "capacity_factor": "--capacity-factor", "router_imbalance": "--router-imbalance",
             "q_lora_rank": "--q-lora-rank",
             "kv_lora_rank": "--kv-lora-rank", "qk_rope_head_dim": "--qk-rope-dim", "mtp_layers": "--mtp-layers"}  # fmt: skip


#: matmul data types with an energy per FLOP (analytic.energy.DTYPES)
ENERGY_DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32", "int8")


def zero_impl_option(f):
    """``--zero-impl`` of predict and search: ZeRO as DeepSpeed or PyTorch FSDP runs it."""
    from calib.analytic.dp_exposure import ZERO_IMPLS

    return click.option(
        "--zero-impl", type=Choice(ZERO_IMPLS), default=ZERO_IMPLS[0], show_default=True,
        help="ZeRO as DeepSpeed or PyTorch FSDP runs it (FSDP: no re-gather in the recomputed forward, "
        "ZeRO-2 gathers every micro-batch; analytic.dp_exposure).",
    )(f)  # fmt: skip


def zero_impl_code(name: str) -> int:
    from calib.analytic.dp_exposure import ZERO_IMPLS

    return ZERO_IMPLS.index(name)


def energy_options(needs: str):
    """``--dtype`` and ``--power`` of predict and search; ``needs`` names the option they go with."""

    def wrap(f):
        f = click.option(
            "--power",
            "power_file",
            metavar="FILE",
            help=f"Fitted power JSON (calib fit --power; with {needs}); default: the system's stored one, "
            "else datasheet values (status default).",
        )(f)
        return click.option(
            "--dtype",
            type=Choice(ENERGY_DTYPES),
            default="bf16",
            show_default=True,
            help=f"Matmul data type for the energy per FLOP (with {needs}).",
        )(f)

    return wrap


def stack_options(f):
    """``calib predict``: one value each."""
    for opt in reversed(
        [
            click.option("--cp", type=Int(1), default=1, show_default=True, help="Context-parallel size."),
            click.option(
                "--cp-kind",
                type=Choice(("ring", "ulysses", "allgather")),
                default="ring",
                show_default=True,
                help="Context parallelism: ring attention (K/V send/recv), Ulysses all-to-all, or Llama 3's "
                "all-gather of K/V.",
            ),
            click.option(
                "--ep", type=Int(1), default=1, show_default=True, help="Expert-parallel size (MoE)."
            ),
            click.option(
                "--precision",
                type=Choice(("bf16", "fp8")),
                default="bf16",
                show_default=True,
                help="GEMM precision; fp8 = Transformer Engine style (the hardware's measured FP8 GEMM rate, else its FP8 peak ratio).",
            ),
            click.option(
                "--master-weights",
                type=Choice(("fp32", "bf16")),
                default="fp32",
                show_default=True,
                help="Optimizer master weights.",
            ),
            click.option(
                "--schedule",
                type=Choice(("1f1b", "zb-h1", "dualpipe")),
                default="1f1b",
                show_default=True,
                help="Pipeline schedule: " + SCHEDULE_HELP,
            ),
            click.option(
                "--distributed-optimizer",
                is_flag=True,
                help="Megatron distributed optimizer (ZeRO-1 with gradient reduce-scatter + parameter all-gather).",
            ),
            click.option(
                "--tp-comm-overlap",
                is_flag=True,
                help="Overlap TP collectives with GEMMs (a stated fraction).",
            ),
            click.option(
                "--compile",
                "compiled",
                is_flag=True,
                help="torch.compile'd training: the device model's torch.compile family, fitted from the "
                "system's compiled traces (without one: predicted as eager, with a note).",
            ),
        ]
    ):
        f = opt(f)
    return f


def parse_list(text: str | None, option: str, default: tuple[int, ...], minimum: int = 1) -> tuple[int, ...]:
    """Comma-separated integers, each at least ``minimum``, sorted and without repeats."""
    if text is None:
        return default
    try:
        vals = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise InputError(option, f"expected comma-separated integers like 1,2,4, got '{text}'") from None
    if not vals or min(vals) < minimum:
        what = "positive integers" if minimum == 1 else f"integers >= {minimum}"
        raise InputError(option, f"values must be {what}, got '{text}'")
    return vals


def parse_schedules(text: str) -> tuple[int, ...]:
    from calib.analytic.bubble import schedule_code

    return tuple(sorted({schedule_code(x) for x in text.split(",") if x.strip()}))


MOE_KEYS = ("n_experts", "top_k", "expert_ffn", "shared_experts", "dense_layers", "capacity_factor",
            "router_imbalance",
            "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "mtp_layers")  # fmt: skip


def pop_moe(kw: dict) -> dict:
    """Take the MoE options out of a command's keyword arguments."""
    return {k: kw.pop(k, None) for k in MOE_KEYS}


def pop_stack(kw: dict) -> dict:
    """Take ``stack_options`` out of a command's keyword arguments, as Plan fields."""
    from calib.analytic.bubble import schedule_code
    from calib.analytic.context import cp_kind_code
    from calib.analytic.precision import master_code

    return {
        "cp": kw.pop("cp"),
        "cp_kind": cp_kind_code(kw.pop("cp_kind")),
        "ep": kw.pop("ep"),
        "fp8": kw.pop("precision") == "fp8",
        "master": master_code(kw.pop("master_weights")),
        "schedule": schedule_code(kw.pop("schedule")),
        "dist_opt": kw.pop("distributed_optimizer"),
        "tp_overlap": kw.pop("tp_comm_overlap"),
        "compiled": kw.pop("compiled", False),
    }


def stack_label(p: dict) -> str:
    """' CP=2(ring) EP=8 fp8 zb-h1 ...' for a header line (empty for the defaults)."""
    from calib.analytic.bubble import SCHEDULES
    from calib.analytic.context import CP_KINDS

    out = ""
    if p["cp"] > 1:
        out += f" CP={p['cp']}({CP_KINDS[p['cp_kind']]})"
    if p["ep"] > 1:
        out += f" EP={p['ep']}"
    out += " fp8" if p["fp8"] else ""
    out += " master=bf16" if p["master"] else ""
    out += f" schedule={SCHEDULES[p['schedule']]}" if p["schedule"] else ""
    out += " +dist-opt" if p["dist_opt"] else ""
    out += " +TP-overlap" if p["tp_overlap"] else ""
    out += " +compile" if p.get("compiled") else ""
    return out
