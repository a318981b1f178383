"""The `orch` command: typer app, one thin function per verb."""

from __future__ import annotations

import typer

from orch.cli import (
    balance_cmd,
    data_cmd,
    export_cmd,
    jobs_cmd,
    launch_cmd,
    plan_cmd,
    profile_cmd,
    report_cmd,
    specs_cmd,
)
from orch.cli.errors import OrchGroup

app = typer.Typer(
    cls=OrchGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Plan, launch and profile multimodal LLM training jobs.",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"orch {version('orch')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Plan, launch and profile multimodal LLM training jobs."""


specs_cmd.register(app)
plan_cmd.register(app)
balance_cmd.register(app)
launch_cmd.register(app)
jobs_cmd.register(app)
profile_cmd.register(app)
export_cmd.register(app)
data_cmd.register(app)
report_cmd.register(app)


def main() -> None:
    app()
