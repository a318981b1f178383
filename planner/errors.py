"""Errors the planner raises for user mistakes; the CLI turns them into one line each."""

from __future__ import annotations


class OrchError(Exception):
    """A user-facing error: bad input, an impossible request. Never a bug."""

    # How a rank's failure record names it (runtime/launch/failures.py): "error", or the run's own end that every
    # rank raised alike ("diverged"), which `orch status` says as the run's line rather than one rank's failure.
    failure_kind = "error"

    def lines(self) -> list[str]:
        return [str(self)]


class SpecError(OrchError):
    """A problem with one field of one input file: rendered as `file: field: message`."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        return ": ".join([*parts, self.message])


class SpecErrors(OrchError):
    """Several field problems found in one file, one line each."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))

    def lines(self) -> list[str]:
        return [str(e) for e in self.errors]


class InfeasibleError(OrchError):
    """No layout satisfies the constraints (memory, divisibility, pins)."""
