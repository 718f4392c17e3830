"""Click option types and option groups shared by the commands.

Bad option values become one-line :class:`~calib.core.errors.InputError` (exit 2), never
click's usage dump; ``--replace`` and the refusal to overwrite a stored run are worded
here once for ``calib ingest`` and ``calib bench``.
"""

from __future__ import annotations

from pathlib import Path

import click

from calib.core.errors import InputError

MACHINE_HELP = """\b
Machine (one of):
  --system NAME        the fitted calibration of NAME in the store (calib fit)
  --calibration FILE   a calibration JSON file (or NAME: one stored by
                       calib validate --save-calibration NAME)
  --hardware SPEC      a hardware preset or YAML/JSON spec alone: every efficiency
                       is a stated default (the output says so)
  --system/--calibration with --hardware: transfer the fit to new hardware
"""


def option_name(param) -> str:
    """The option as the user types it (``--s``, ``--format``), not its Python name."""
    if param is None:
        return "option"
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    return max(opts, key=len) if opts else f"--{param.name.replace('_', '-')}"


class Int(click.ParamType):
    """An integer option whose bad values are one-line InputErrors (exit 2), not usage dumps."""

    name = "integer"

    def __init__(self, lo: int | None = None, hi: int | None = None) -> None:
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        opt = option_name(param)
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
        opt = option_name(param)
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
            opt = option_name(param)
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
            click.option(
                "--calibration",
                metavar="FILE|NAME",
                help="Calibration JSON file, or a calibration stored by name (calib validate --save-calibration).",
            ),
            click.option(
                "--hardware",
                help="Hardware preset (polaris, perlmutter, tg40, tg80, dgx-a100-80gb/selene, dgx-h100, h200/dgx-h200, "
                "b200, mi300x, gb200-nvl72, dgx-2) or a YAML/JSON spec file.",
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
                help="Model preset (e.g. gpt3-175b, megatron-1t, gpt-13b, llama3-70b, mixtral-8x7b, deepseek-v3) "
                "or YAML/JSON file.",
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
            click.option(
                "--kv-heads",
                "kv_heads",
                type=Int(1),
                help="Key/value heads, grouped-query attention (default a).",
            ),
            click.option(
                "--mlp",
                "mlp",
                type=Choice(("gelu", "swiglu")),
                help="MLP kind: gelu (GPT, default) or swiglu (Llama).",
            ),
            click.option(
                "--untied-embeddings",
                "untied_embeddings",
                is_flag=True,
                default=None,
                help="The LM head has its own matrix (default: tied to the embedding).",
            ),
            click.option(
                "--no-dropout",
                "no_dropout",
                is_flag=True,
                default=None,
                help="The model trains without dropout, so no dropout masks are kept for backward "
                "(Llama-style; the llama3/mixtral/deepseek presets already say so).",
            ),
        ]
    ):
        f = opt(f)
    return f


def resolve_model(model_name, d_model, n_layers, n_heads, seq_len, vocab, ffn=None, kv_heads=None, mlp=None,
                  untied_embeddings=None, no_dropout=None):  # fmt: skip
    from dataclasses import replace

    from calib.analytic.specs import ModelSpec, load_model

    extra = {k: v for k, v in (("ffn", ffn), ("kv_heads", kv_heads), ("mlp", mlp)) if v is not None}
    if untied_embeddings:
        extra["tied_embeddings"] = False
    if no_dropout:
        extra["dropout"] = False
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


def replace_option(f):
    """``--replace``: the one way to overwrite a stored run (ingest and bench)."""
    return click.option(
        "--replace",
        is_flag=True,
        help="Replace an existing run of the same name (atomically); without it, an existing name is refused.",
    )(f)


def run_exists(target: str | Path, option: str = "--name") -> InputError:
    """The one-line refusal for a run name that is taken."""
    target = Path(target)
    return InputError(
        option,
        f"a run '{target.name}' already exists at {target}; give --replace to replace it, "
        f"or choose another {option}",
    )


def on_wait(line: str) -> None:
    """Where the store's lock says why a writer waits."""
    click.echo(f"calib: {line}", err=True)


def terminal_progress(it, desc: str, unit: str, minimum: int = 2):
    """A tqdm bar over ``it`` on a terminal; ``it`` itself when stderr is piped (CI, logs)
    or it has fewer than ``minimum`` items (ingest's ranks, validate's folds)."""
    import sys

    total = len(it) if hasattr(it, "__len__") else None
    if (total is not None and total < minimum) or not sys.stderr.isatty():
        return it
    from tqdm import tqdm

    return tqdm(it, total=total, desc=desc, unit=unit, file=sys.stderr)
