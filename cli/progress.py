"""`orch launch`'s progress: one line per training step, read from WORKDIR/metrics.jsonl as rank 0 appends it.

On a terminal the line is redrawn in place (rich's Live); elsewhere (a CI log, Slurm's output, a pipe) each
step is a plain line of its own. The line: step/total, the step's loss, label tokens per second and the time
left at the recent steps' pace.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orch.runtime.metrics import StepRecord

RECENT = 10  # steps whose mean time sets the ETA


def progress_line(record: StepRecord, total: int, recent_s: list[float]) -> str:
    """`step 3/10  loss 5.123456  1.2k tok/s  ETA 0:00:12` (step counted from 1)."""
    done = record.step + 1
    rate = record.tokens / record.step_time_s if record.step_time_s > 0 else 0.0
    pace = sum(recent_s) / len(recent_s) if recent_s else record.step_time_s
    return f"step {done}/{total}  loss {record.loss:.6f}  {_si(rate)} tok/s  ETA {_clock(max(0, total - done) * pace)}"


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _clock(seconds: float) -> str:
    s = math.ceil(seconds)  # never 0:00:00 while a step is left
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class StepProgress:
    """Follows a metrics file from where it ends now; `poll` shows the records appended since (whole lines only).

    A context manager: on a terminal it holds rich's Live line, left on screen at the end."""

    def __init__(self, console: Any, path: str | Path, total: int) -> None:
        self.console, self.path, self.total = console, Path(path), total
        self.offset = self.path.stat().st_size if self.path.exists() else 0
        self.recent: list[float] = []
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

        from orch.runtime.metrics import StepRecord

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
        self.recent = [*self.recent, record.step_time_s][-RECENT:]
        from rich.text import Text

        text = Text(progress_line(record, self.total, self.recent))  # as it is: no markup, no highlighting
        if self._live is not None:
            self._live.update(text)
        else:
            self.console.print(text, soft_wrap=True)
