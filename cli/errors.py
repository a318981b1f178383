"""The one error boundary: user mistakes become one line on stderr and exit code 1."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from orch.cli.output import error


class OrchGroup(TyperGroup):
    """Typer group whose invoke turns OrchError/ValidationError into `file: field: message` lines.

    Any other exception keeps its traceback: that is a bug, not a user mistake.
    """

    def invoke(self, ctx: Any) -> Any:
        from pydantic import ValidationError

        from orch.planner.errors import OrchError

        try:
            return super().invoke(ctx)
        except OrchError as exc:
            for line in exc.lines():
                error(line)
            raise typer.Exit(1) from None
        except ValidationError as exc:
            for e in exc.errors():
                loc = ".".join(str(p) for p in e["loc"])
                error(f"{exc.title}: {loc}: {e['msg']}")
            raise typer.Exit(1) from None
