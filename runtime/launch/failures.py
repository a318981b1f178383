"""A failed rank's record: WORKDIR/.failures/rank{r}.json, so a launcher can name the rank that failed first.

Peers of a dead rank fail after it with connection errors; the earliest record is the root cause.
Torch-free (torch is imported only to recognise its out-of-memory error).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from orch.planner.errors import OrchError
from orch.planner.io import write_text_atomic

# What allocators say when a request cannot be met: torch's CPU allocator raises a plain RuntimeError.
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "not enough memory", "cannot allocate memory")


def failure_dir(workdir: str | Path) -> Path:
    return Path(workdir) / ".failures"


def clear_failures(workdir: str | Path) -> None:
    shutil.rmtree(failure_dir(workdir), ignore_errors=True)


def is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError (Python), torch.OutOfMemoryError (CUDA and other device allocators), or an allocator's
    RuntimeError saying it cannot allocate (torch's CPU allocator)."""
    import torch

    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MESSAGES)


def record_failure(workdir: str | Path, rank: int, exc: BaseException) -> None:
    """Write when and why `rank` failed, with its whole traceback."""
    text = "".join(traceback.format_exception(exc))
    error = str(exc) if isinstance(exc, OrchError) else last_line(text)  # a user's problem: its own one line
    kind = "oom" if is_out_of_memory(exc) else exc.failure_kind if isinstance(exc, OrchError) else "error"
    if kind == "oom":
        error = f"out of memory: {error}"
    record = {"time": time.time(), "rank": rank, "error": error, "kind": kind, "traceback": text}
    folder = failure_dir(workdir)
    with contextlib.suppress(OSError, OrchError):  # a full disk: the rank's own error still reaches the launcher
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / f"rank{rank}.json", json.dumps(record))


def record_stall(workdir: str | Path, rank: int, message: str) -> None:
    """The watchdog's verdict on `rank` (kind "hang"), written for it: a stopped rank writes nothing itself."""
    record = {"time": time.time(), "rank": rank, "error": message, "kind": "hang"}
    folder = failure_dir(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / f"rank{rank}.json", json.dumps(record))


def first_failure_record(workdir: str | Path) -> dict[str, object] | None:
    """The earliest failure record of the ranks ({time, rank, error, kind, traceback}), or None."""
    records: list[dict[str, Any]] = []
    for path in sorted(failure_dir(workdir).glob("rank*.json")):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not records:
        return None
    return min(records, key=lambda r: float(r.get("time", 0.0)))


def first_failure(workdir: str | Path) -> tuple[int, str] | None:
    """(rank, its error line and where its whole traceback is) of the earliest failure, or None."""
    first = first_failure_record(workdir)
    if first is None:
        return None
    rank = int(str(first["rank"]))
    where = failure_dir(workdir) / f"rank{rank}.json"
    return rank, f"{first['error']} (traceback: {where})" if "traceback" in first else str(first["error"])


# What a rank says when a collective failed because of a peer (gloo, NCCL, the TCP store), not of its own doing.
_PEER_ERRORS = re.compile(
    r"timed out|timeout|connection (?:reset|closed|refused|lost)|broken pipe|end of file|peer|socket|"
    r"watchdog caught collective",
    re.IGNORECASE,
)


def is_peer_error(error: str) -> bool:
    """A rank's error line that blames a peer: a collective timed out, or its connection to a peer broke."""
    return bool(_PEER_ERRORS.search(error))


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "unknown error"
