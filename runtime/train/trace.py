"""The measured schedule of a run as a Chrome trace (Perfetto / chrome://tracing).

Same form as the planner's predicted trace (planner/trace.py): complete events {"name",
"ph": "X", "ts", "dur"} in microseconds from the run start, `pid` = module name (the shared
optimizer step has pid "optimizer"), `tid` = f"rank {r}". Each rank keeps its own spans
(`RankTrace`); rank 0 gathers them and writes one file atomically.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orch.planner.io import write_text_atomic

Span = tuple[str, str, float, float]  # (module, phase, start, end) in seconds, one clock per rank


@dataclass
class RankTrace:
    """One rank's events; `origin` is its clock's reading at the run start (after a barrier)."""

    rank: int
    origin: float
    events: list[dict[str, Any]] = field(default_factory=list)

    def add(self, step: int, spans: list[Span]) -> None:
        for module, phase, t0, t1 in spans:
            self.events.append(
                {
                    "name": phase,
                    "ph": "X",
                    "ts": (t0 - self.origin) * 1e6,
                    "dur": max(0.0, t1 - t0) * 1e6,
                    "pid": module,
                    "tid": f"rank {self.rank}",
                    "args": {"step": step},
                }
            )


def measured_trace(per_rank: list[list[dict[str, Any]]], placement: str) -> dict[str, Any]:
    events = [e for evs in per_rank for e in evs]
    events.sort(key=lambda e: (e["ts"], e["tid"]))
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"kind": "measured", "placement": placement}}


def write_trace(path: str | Path, per_rank: list[list[dict[str, Any]]], placement: str) -> None:
    write_text_atomic(path, json.dumps(measured_trace(per_rank, placement)))
