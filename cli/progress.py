"""`orch launch`'s progress: one line per training step, read from WORKDIR/metrics.jsonl as rank 0 appends it.

On a terminal the line is redrawn in place (rich's Live); elsewhere (a CI log, a pipe) each step is a plain
line of its own. The line itself: runtime/progress.py (a Slurm job's rank 0 logs the same).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orch.runtime.progress import Pace

if TYPE_CHECKING:
    from orch.runtime.workdir.metrics import StepRecord


class StepProgress:
    """Follows a metrics file from where it ends now; `poll` shows the records appended since (whole lines only).

    A context manager: on a terminal it holds rich's Live line, left on screen at the end."""

    def __init__(self, console: Any, path: str | Path, total: int) -> None:
        self.console, self.path, self.total = console, Path(path), total
        self.offset = self.path.stat().st_size if self.path.exists() else 0
        self.pace = Pace(total)
        self._live: Any = None

    def __enter__(self) -> StepProgress:
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live("", console=self.console, refresh_per_second=4, transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.poll()
        if self._live is not None:
            self._live.stop()

    def poll(self) -> None:
        from pydantic import ValidationError

        from orch.runtime.workdir.metrics import StepRecord

        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(whole)
        for line in whole.decode(errors="replace").splitlines():
            try:
                record = StepRecord.model_validate_json(line)
            except ValidationError:
                continue  # not a record: nothing to show (the run's readers report bad lines)
            self.show(record)

    def show(self, record: StepRecord) -> None:
        from rich.text import Text

        text = Text(self.pace.line(record))  # as it is: no markup, no highlighting
        if self._live is not None:
            self._live.update(text)
        else:
            self.console.print(text, soft_wrap=True)
