"""Placeholder: registered by cli/app.py, filled in by its issue."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
