"""The progress line of a training step, one definition for `orch launch`'s terminal and a Slurm job's log:
`step 3/10  loss 5.123456  1.2k tok/s  ETA 0:00:12` (step counted from 1; label tokens per second of the
slowest rank's step time; the time left at the recent steps' mean). Torch-free."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orch.runtime.workdir.metrics import StepRecord

RECENT = 10  # steps whose mean time sets the ETA


class Pace:
    """The recent steps' times, for the ETA: `line(record)` adds the record's and words it."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.recent: list[float] = []

    def line(self, record: StepRecord) -> str:
        self.recent = [*self.recent, record.step_time_s][-RECENT:]
        return progress_line(record, self.total, self.recent)


def progress_line(record: StepRecord, total: int, recent_s: list[float]) -> str:
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
