"""`RUN_DIR/data_problems.jsonl`: the media a run could not read, one JSON object a line.

    {"file": "data.jsonl", "line": 7, "medium": "/data/img/7.png", "error": "FileNotFoundError: ...",
     "step": 12, "rank": 0, "action": "masked"}

`action` says what the run did with the sample: `masked` (a medium gone, cut or changed since indexing, found by
the rank that decodes it: the ranks agree on it at the step's start, so it trains nothing anywhere; its rows,
already placed, run on zeros no label reaches). Each line is one `write` to a file opened for appending, so lines
from several ranks and loader processes never interleave; each (sample, medium) is written once per process.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field

from orch.runtime.workdir.files import open_own

PROBLEMS_FILE = "data_problems.jsonl"


@dataclass
class DataProblems:
    """Where a rank (or a loader process of it) appends the media problems it meets."""

    path: str | None  # None: nowhere (tools, tests)
    rank: int = 0
    _seen: set[tuple[str, str, str]] = field(default_factory=set, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, object]:  # handed to loader processes: where to write, not what was seen
        return {"path": self.path, "rank": self.rank}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["path"], state["rank"])  # type: ignore[misc, arg-type]

    def add(self, where: str, medium: str, error: str, step: int, action: str) -> None:
        """Append one problem (`where` is file:line)."""
        if self.path is None:
            return
        with self._lock:
            if (where, medium, action) in self._seen:
                return
            self._seen.add((where, medium, action))
        name, _, line = where.rpartition(":")
        record = {"file": name, "line": int(line) if line.isdigit() else line, "medium": medium, "error": error,
                  "step": step, "rank": self.rank, "action": action}  # fmt: skip
        data = (json.dumps(record) + "\n").encode()
        fd = open_own(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # appended in place: no link
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def read_problems(path: str) -> list[dict[str, object]]:
    """The problems a run wrote (none when it wrote no file)."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
