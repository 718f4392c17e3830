"""``calib predict``: iteration time, memory and scaling of one strategy at several GPU counts."""

from __future__ import annotations

import click

from calib.core.errors import InputError

MACHINE_HELP = """\b
Machine (one of):
  --system NAME        the fitted calibration of NAME in the store (calib fit)
  --calibration FILE   a calibration JSON file
  --hardware SPEC      a hardware preset or YAML/JSON spec alone: every efficiency
                       is a stated default (the output says so)
  --system/--calibration with --hardware: transfer the fit to new hardware
"""


class Int(click.ParamType):
    """An integer option whose bad values are one-line InputErrors (exit 2), not usage dumps."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        opt = f"--{param.name.replace('_', '-')}" if param else "option"
        try:
            v = int(value)
        except (TypeError, ValueError):
            raise InputError(opt, f"expected an integer, got '{value}'") from None
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            rng = f"{self.lo}..{self.hi}" if self.hi is not None else f">= {self.lo}"
            raise InputError(opt, f"must be {rng}, got {v}")
        return v


class Fraction(click.ParamType):
    """A number strictly between 0 and 1, with one-line errors."""

    name = "fraction"

    def convert(self, value, param, ctx):
        opt = f"--{param.name.replace('_', '-')}" if param else "option"
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise InputError(opt, f"expected a fraction like 0.3, got '{value}'") from None
        if not 0 < v < 1:
            raise InputError(opt, f"fraction must be in (0, 1), got {v}")
        return v


class Choice(click.ParamType):
    """A choice option whose bad values are one-line InputErrors."""

    name = "choice"

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices

    def get_metavar(self, param, ctx=None) -> str:
        return "[" + "|".join(self.choices) + "]"

    def convert(self, value, param, ctx):
        if value not in self.choices:
            opt = f"--{param.name.replace('_', '-')}" if param else "option"
            raise InputError(opt, f"'{value}' is not one of {', '.join(self.choices)}")
        return value


def require(value, option: str):
    """Required options checked here, so a missing one is one line (click's own is a usage dump)."""
    if value is None:
        raise InputError(option, "is required (see --help)")
    return value


def machine_options(f):
    """The options that say which machine to model (shared by predict, search, validate)."""
    for opt in reversed(
        [
            click.option("--system", help="System name whose fitted calibration to use (see `calib fit`)."),
            click.option("--calibration", metavar="FILE", help="Calibration JSON file."),
            click.option(
                "--hardware",
                help="Hardware preset (polaris, perlmutter, tg40, tg80, dgx-a100-80gb/selene, dgx-h100, h200, "
                "b200, mi300x, dgx-2) or a YAML/JSON spec file.",
            ),
            click.option(
                "--store",
                metavar="DIR",
                help="Store directory (default ./calib-store or $CALIB_STORE).",
            ),
        ]
    ):
        f = opt(f)
    return f


def model_options(f):
    """A model preset or its shape: --model NAME|FILE, or --d --l --a --s --V."""
    for opt in reversed(
        [
            click.option(
                "--model",
                "model_name",
                help="Model preset (e.g. gpt3-175b, megatron-1t, gpt-13b) or YAML/JSON file.",
            ),
            click.option(
                "--d", "d_model", type=Int(1), help="Hidden size d (with --l --a --s; instead of --model)."
            ),
            click.option("--l", "n_layers", type=Int(1), help="Number of layers l."),
            click.option("--a", "n_heads", type=Int(1), help="Attention heads a."),
            click.option(
                "--s", "seq_len", type=Int(1), help="Sequence length s (tokens); overrides the preset's."
            ),
            click.option(
                "--V", "vocab", type=Int(1), help="Vocabulary size V (default 51200); overrides the preset's."
            ),
            click.option("--ffn", "ffn", type=Int(1), help="MLP hidden size (default 4d)."),
            click.option("--kv-heads", "kv_heads", type=Int(1), help="Key/value heads, grouped-query attention (default a)."),
            click.option("--mlp", "mlp", type=Choice(("gelu", "swiglu")), help="MLP kind: gelu (GPT, default) or swiglu (Llama)."),
            click.option("--untied-embeddings", "untied_embeddings", is_flag=True, default=None,
                         help="The LM head has its own matrix (default: tied to the embedding)."),
        ]
    ):
        f = opt(f)
    return f


def resolve_model(model_name, d_model, n_layers, n_heads, seq_len, vocab, ffn=None, kv_heads=None, mlp=None,
                  untied_embeddings=None):  # fmt: skip
    from dataclasses import replace

    from calib.analytic.specs import ModelSpec, load_model

    extra = {k: v for k, v in (("ffn", ffn), ("kv_heads", kv_heads), ("mlp", mlp)) if v is not None}
    if untied_embeddings:
        extra["tied_embeddings"] = False
    if kv_heads is not None and (n_heads or kv_heads) % kv_heads:
        raise InputError("--kv-heads", f"{kv_heads} must divide the number of heads {n_heads}")

    shape = {"d_model": d_model, "n_layers": n_layers, "n_heads": n_heads}
    if model_name:
        given = [f"--{k[0] if k != 'd_model' else 'd'}" for k, v in shape.items() if v is not None]
        if given:
            raise InputError(
                "--model", f"give either --model or the shape (--d --l --a), not both ({', '.join(given)})"
            )
        model = load_model(model_name)
        over = {k: v for k, v in (("seq_len", seq_len), ("vocab", vocab)) if v is not None} | extra
        return replace(model, **over) if over else model
    missing = [
        f"--{n}" for n, v in (("d", d_model), ("l", n_layers), ("a", n_heads), ("s", seq_len)) if v is None
    ]
    if missing:
        raise InputError("--model", f"give --model NAME or the model shape; missing {', '.join(missing)}")
    if d_model % n_heads:
        raise InputError("--d", f"hidden size {d_model} must be a multiple of the heads --a {n_heads}")
    return ModelSpec("", d_model, n_layers, n_heads, seq_len, vocab or 51200, **extra)


def parse_gpus(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError("--gpus", f"expected comma-separated integers like 8,16,32, got '{text}'") from None
    if not out or min(out) < 1:
        raise InputError("--gpus", f"GPU counts must be positive integers, got '{text}'")
    return out


@click.command(
    epilog=MACHINE_HELP,
    help="""Predict iteration time, memory and scaling of one parallel strategy at each GPU count.

\b
Per configuration: iteration time (s) split into kernel execution, intra/inter-op
dispatch, exposed TP / PP / DP all-reduce, all-gather, reduce-scatter communication,
pipeline bubble and optimizer step; overlapped communication (s); memory per GPU (GB:
weights, gradients, optimizer states, activations) with an out-of-memory verdict;
tokens/s, model TFLOP/s per GPU, MFU; speedup and scaling efficiency against the
smallest GPU count (with seed 004's speedup formula alongside).

\b
Example:
  calib predict --hardware polaris --model gpt-13b --gpus 8,64,512 --zero 3
""",
)
@machine_options
@model_options
@click.option("--gpus", help="Comma-separated GPU counts, e.g. 8,16,32,64 (required).")
@click.option("--zero", type=Int(0, 3), default=0, show_default=True, help="ZeRO stage 0-3 (0 = plain DDP).")
@click.option("--tp", type=Int(1), default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=Int(1), default=1, show_default=True, help="Pipeline-parallel size.")
@click.option(
    "--interleave", type=Int(1), default=1, show_default=True, help="Virtual pipeline stages per GPU (v)."
)
@click.option(
    "--micro-batch", type=Int(1), default=1, show_default=True, help="Sequences per micro-batch (b)."
)
@click.option(
    "--global-batch",
    type=Int(1),
    help="Sequences per iteration (B); default micro-batch x DP (weak scaling).",
)
@click.option(
    "--recompute",
    type=Choice(("none", "selective", "full")),
    default="none",
    show_default=True,
    help="Activation recomputation.",
)
@click.option(
    "--seq-parallel",
    is_flag=True,
    help="Sequence parallelism (TP all-reduces become reduce-scatter + all-gather).",
)
@click.option(
    "--dp-overlap",
    is_flag=True,
    help="Overlap DP/ZeRO collectives with backward (and ZeRO-3 forward) compute.",
)
@click.option("--flash-attention", is_flag=True, help="Fused attention: no s x s activations kept or moved.")
@click.option(
    "--ranks-per-node",
    type=Int(1),
    help="Ranks launched per node (default: one per device, the calibration's GPUs per node); more ranks "
    "than the node's compute slots (e.g. 4 gloo ranks on a 2-core host) time-share it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (every column, units in the names).")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (one row per GPU count).")
@click.option(
    "-o",
    "--out",
    metavar="FILE",
    help="Write the output to this file (atomically) instead of stdout.",
)
def predict(system, calibration, hardware, store, model_name, d_model, n_layers, n_heads, seq_len, vocab, gpus, zero,
            tp, pp, interleave, micro_batch, global_batch, recompute, seq_parallel, dp_overlap, flash_attention,
            ranks_per_node, as_json, as_csv, out, **shape):  # fmt: skip
    from calib.analytic.formulas import recompute_code
    from calib.analytic.predict import Plan
    from calib.analytic.predict import predict as run_predict
    from calib.commands import output
    from calib.resolve import resolve_system

    if as_json and as_csv:
        raise InputError("--json", "give either --json or --csv")
    model = resolve_model(model_name, d_model, n_layers, n_heads, seq_len, vocab, **shape)
    machine, notes = resolve_system(system, calibration, hardware, store, ranks_per_node=ranks_per_node)
    plan = Plan(tp=tp, pp=pp, zero=zero, micro_batch=micro_batch, global_batch=global_batch,
                recompute=recompute_code(recompute), seq_parallel=seq_parallel, interleave=interleave,
                dp_overlap=dp_overlap, flash_attention=flash_attention)  # fmt: skip
    result = run_predict(model, machine, parse_gpus(require(gpus, "--gpus")), plan)
    notes = notes + result.notes
    if as_json:
        text = output.dumps({
            "model": model.__dict__, "hardware": machine.hw.__dict__, "calibration": machine.cal.system,
            "plan": plan.__dict__ | {"recompute": recompute}, "notes": notes, "configs": output.records(result.table),
        })  # fmt: skip
    elif as_csv:
        text = result.table.to_csv(index=False)
    else:
        header = [
            f"model {model.label}: d={model.d_model} l={model.n_layers} a={model.n_heads} s={model.seq_len} V={model.vocab}",
            f"machine {machine.hw.name} ({machine.hw.device}, {machine.hw.gpus_per_node} GPUs/node, "
            f"{machine.hw.peak_tflops:g} TFLOP/s peak, {machine.hw.hbm_gb:g} GB HBM); calibration {machine.cal.system}",
            f"strategy ZeRO-{zero} TP={tp} PP={pp} v={interleave} micro-batch={micro_batch} recompute={recompute}"
            + (" +SP" if seq_parallel else "")
            + (" +DP-overlap" if dp_overlap else "")
            + (" +flash" if flash_attention else ""),
        ]
        text = output.predict_text(result.table, header, notes)
    text = output.emit(text, out)
    if text is not None:
        click.echo(text, nl=False)
