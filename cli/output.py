"""All terminal output: data on stdout, everything for people (tables, progress, hints) on stderr."""

from __future__ import annotations

import errno
import os
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel
    from rich.console import Console


@cache
def console() -> Console:
    """The human-facing console; on stderr so stdout stays parseable."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich's own exits 1 from inside the print; a closed pipe is the one error boundary's (cli/errors.py)
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    return _Console(stderr=True, highlight=False)


def print_json(model: BaseModel) -> None:
    sys.stdout.write(model.model_dump_json(indent=2) + "\n")


def print_json_text(text: str) -> None:
    sys.stdout.write(text.rstrip("\n") + "\n")


def silence_closed_output() -> None:
    """After a reader closed our stdout or stderr (`orch plan | head`): both descriptors point at /dev/null, so
    nothing written later, nor the flush at exit, fails again (Python's recipe for SIGPIPE)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (OSError, ValueError):  # not a file (a test runner's buffer): nothing to redirect
            continue
        os.dup2(devnull, fd)
    os.close(devnull)


def error(line: str) -> None:
    sys.stderr.write(f"error: {line}\n")


def table(title: str, columns: list[tuple[str, str]], caption: str | None = None) -> Any:
    """A table readable in an 80-column terminal: headers short enough never to be cut (units go in the
    title or the caption), no vertical rules and collapsed padding, numbers right-aligned and names
    never wrapped, free text wrapped at spaces.

    `columns`: (header, kind) in order; kind "num" (right-aligned), "name" (a word: module, mode, op) or
    "text" (wraps: layouts, summaries).
    """
    from rich import box
    from rich.table import Table

    t = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for header, kind in columns:
        if kind == "text":
            t.add_column(header, justify="left", overflow="fold")
        else:
            t.add_column(header, justify="right" if kind == "num" else "left", no_wrap=True)
    return t
