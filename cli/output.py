"""All terminal output: data on stdout, everything for people (tables, progress, hints) on stderr."""

from __future__ import annotations

import sys
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console


@cache
def console() -> Console:
    """The human-facing console; on stderr so stdout stays parseable."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_json(model: BaseModel) -> None:
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def print_json_text(text: str) -> None:
    sys.stdout.write(text.rstrip("\n") + "\n")


def error(line: str) -> None:
    sys.stderr.write(f"error: {line}\n")
