"""The ``calib`` command line: a thin lazy group over one module per command.

Each command lives in ``calib/commands/<name>.py`` and is imported only when run, so
``calib --help`` stays fast and heavy dependencies (torch, HTA, dask) load only where
needed.  Bad input anywhere becomes one line on stderr and exit code 2; errors that name
a field (``gpus``) are shown with its option (``--gpus``, :mod:`calib.commands.flags`).
"""

from __future__ import annotations

import importlib
import sys

import click

from calib.core.errors import InputError

#: command name -> "module:attribute"; one module per command.
COMMANDS: dict[str, str] = {
    "ingest": "calib.commands.ingest:ingest",
    "runs": "calib.commands.runs:runs",
    "fit": "calib.commands.fit:fit",
    "show": "calib.commands.show:show",
    "predict": "calib.commands.predict:predict",
    "search": "calib.commands.search:search",
    "validate": "calib.commands.validate:validate",
    "report": "calib.commands.report:report",
    "capture": "calib.commands.capture:capture",
    "bench": "calib.commands.bench:bench",
    "demo": "calib.commands.demo:demo",
}


class LazyGroup(click.Group):
    """Resolve subcommands from :data:`COMMANDS` on demand (click's documented pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n in COMMANDS if _available(n))

    def invoke(self, ctx: click.Context):
        """Run the command; a stage's error naming a field comes out naming its option."""
        try:
            return super().invoke(ctx)
        except InputError as exc:
            from calib.commands.flags import as_cli

            mapped = as_cli(exc)
            if mapped is exc:
                raise
            raise mapped from exc

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None  # command not built yet
            raise
        return getattr(module, attr)


def _available(name: str) -> bool:
    module_name = COMMANDS[name].split(":")[0]
    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="calib")
def cli() -> None:
    """calib: calibrated performance models of distributed transformer training.

    \b
    Typical use:
      calib ingest traces/ --system polaris      # traces -> time buckets (a run)
      calib fit --system polaris                 # runs + nccl-tests -> calibration
      calib predict --system polaris --model gpt-13b --gpus 8,64,512 --zero 3
    """


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the group, turning bad input into one line + exit 2."""
    try:
        cli.main(args=argv, prog_name="calib", standalone_mode=False)
    except InputError as exc:
        from calib.commands.flags import as_cli

        click.echo(f"calib: {as_cli(exc).line()}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("calib: aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as exc:
        click.echo(exc.format_message())  # bare `calib` or a group without a command: help
        sys.exit(0)
    except click.UsageError as exc:
        # one line, like every other bad input: "calib: <command>: <problem> (see --help)"
        where = exc.ctx.command_path if exc.ctx is not None else "calib"
        click.echo(f"calib: {where}: {exc.format_message()} (see '{where} --help')", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"calib: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code if exc.exit_code else 1)
    except KeyboardInterrupt:
        click.echo("calib: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(0)


if __name__ == "__main__":
    main()
