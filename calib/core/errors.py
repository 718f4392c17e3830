"""One error type for bad input, shared by every stage.

The CLI turns an :class:`InputError` into one line ``calib: <file>: <problem>`` and exit
code 2.  Anything else escaping a command is a bug in calib, not in the user's input.
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad input: a file, directory, option or config calib cannot use.

    ``where`` names the file (or option) and ``problem`` says what is wrong with it, in
    words a user can act on.
    """

    exit_code = 2

    def __init__(self, where: str | Path | None, problem: str) -> None:
        self.where = str(where) if where is not None else None
        self.problem = problem
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.where}: {self.problem}" if self.where else self.problem
