"""`orch export`: a run's checkpoint as Hugging Face directories (runtime/models/hf/export.py)."""

from __future__ import annotations

import typer


def export(
    run_dir: str = typer.Argument(..., help="The run's workdir (holds plan.json and checkpoints/)."),
    out: str = typer.Option(..., "--out", "-o", help="Directory to write (loadable with from_pretrained)."),
    step: int | None = typer.Option(None, "--step", help="Checkpoint step (default: the latest)."),
) -> None:
    """Write the run's trained weights as a Hugging Face model directory."""
    from orch.cli.output import console
    from orch.runtime.models.hf.export import export_run

    for path in export_run(run_dir, out, step):
        console().print(f"exported to [bold]{path}[/]")


def register(app: typer.Typer) -> None:
    app.command()(export)
