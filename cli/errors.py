"""The one error boundary: user mistakes become one line on stderr and exit code 1; a closed output pipe
(`orch plan | head`) ends the command quietly with exit code 0."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from orch.cli.output import error, silence_closed_output


class OrchGroup(TyperGroup):
    """Typer group whose invoke turns OrchError/ValidationError into `file: field: message` lines.

    A reader that closed stdout or stderr (BrokenPipeError) is no error: exit 0, nothing more written. Any
    other exception keeps its traceback: that is a bug, not a user mistake.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            try:
                return self._invoke(ctx)
            finally:
                sys.stdout.flush()  # what is still buffered meets a closed pipe here, not in the flush at exit
        except BrokenPipeError:
            silence_closed_output()
            raise typer.Exit(0) from None

    def _invoke(self, ctx: Any) -> Any:
        from pydantic import ValidationError

        from orch.planner.errors import OrchError

        try:
            return super().invoke(ctx)
        except OrchError as exc:
            _report(exc.lines())
            raise typer.Exit(1) from None
        except ValidationError as exc:
            _report([f"{exc.title}: {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()])
            raise typer.Exit(1) from None


def _report(lines: list[str]) -> None:
    """The error lines on stderr; a closed stderr leaves the failure its exit code 1."""
    try:
        for line in lines:
            error(line)
    except BrokenPipeError:
        silence_closed_output()
