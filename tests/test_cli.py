"""The CLI shell: every usage error is one line on stderr and exit code 2."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "calib.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_unknown_option_and_command_are_one_line():
    for args, needle in (
        (("ingest", "--bogus"), "No such option '--bogus'"),
        (("no-such-command",), "No such command 'no-such-command'"),
        (("ingest",), "Missing argument 'PATHS...'"),
    ):
        proc = run(*args)
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("calib: ") and needle in lines[0]


def test_help_lists_every_registered_command():
    from calib.cli import COMMANDS

    proc = run("--help")
    assert proc.returncode == 0
    listed = {line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == set(COMMANDS), listed ^ set(COMMANDS)
    bare = run()
    assert bare.returncode == 0 and "Commands:" in bare.stdout
