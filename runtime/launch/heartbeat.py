"""Per-rank heartbeats: WORKDIR/.heartbeat/rank{r}.json, what the watchdog reads to name a rank that stopped.

Each rank's trainer beats at its phase boundaries (the step, the phase it enters, a sequence number within
the step), and a daemon thread of the rank refreshes `alive` every `ALIVE_EVERY_S`. A rank blocked in a
collective on a peer keeps its thread alive; a rank that is stopped (SIGSTOP, a hung driver call holding the
interpreter) does not. `stalled` is the watchdog's rule (pure): the job is stuck once a rank made no progress
for `limit_s`; the rank named is, in order, a rank whose process is frozen, else the rank furthest behind
(step, then beats within it), else the one whose progress is oldest.

The record is rewritten in place (one `os.pwrite` of a fixed-width line) rather than through a temporary file
and a rename: a beat happens at every phase boundary, and a create and rename per phase on a shared
filesystem would load its metadata server. A reader that meets a half-written record skips it for that poll.
On NFS-like filesystems another node sees a beat once the writer's client flushes it (seconds), well inside
any sensible `--watchdog-s`. Torch-free.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orch.runtime.workdir.files import open_own

HEARTBEAT_DIR = ".heartbeat"
ALIVE_EVERY_S = 1.0
FROZEN_AFTER_S = 3.0  # a rank whose liveness thread has not written for this long is stopped, not waiting
RECORD_BYTES = 256
ENDED = ("done", "stopped")  # phases after the loop: the rank makes no more progress, by design


def heartbeat_dir(workdir: str | Path) -> Path:
    return Path(workdir) / HEARTBEAT_DIR


def clear_heartbeats(workdir: str | Path) -> None:
    shutil.rmtree(heartbeat_dir(workdir), ignore_errors=True)


@dataclass(frozen=True)
class Beat:
    """A rank's last heartbeat: where it was (`step` None: before the first step) and when."""

    rank: int
    pid: int
    step: int | None
    seq: int  # beats within the step: ranks pass the same phase boundaries in the same order
    phase: str
    progress: float  # time.time() of the last phase boundary
    alive: float  # time.time() of the liveness thread's last write


@dataclass(frozen=True)
class Stall:
    """The rank the watchdog names: no progress for `idle_s` since it entered `phase` of `step`."""

    rank: int
    idle_s: float
    phase: str
    step: int | None

    @property
    def where(self) -> str:
        return self.phase if self.step is None else f"{self.phase}, step {self.step}"

    @property
    def summary(self) -> str:
        return f"rank {self.rank} made no progress for {self.idle_s:.0f} s (last: {self.where})"

    @property
    def message(self) -> str:
        return f"{self.summary}; stopping the job"


class Heartbeat:
    """One rank's writer: `beat(phase, step)` at each phase boundary; a thread refreshes liveness meanwhile."""

    def __init__(self, workdir: str | Path, rank: int) -> None:
        folder = heartbeat_dir(workdir)
        folder.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._fd = open_own(folder / f"rank{rank}.json", os.O_RDWR | os.O_CREAT)  # rewritten in place: no link
        self._lock = threading.Lock()
        self._state: dict[str, object] = {"rank": rank, "pid": os.getpid(), "step": None, "seq": 0, "phase": "setup"}
        self._state["progress"] = self._state["alive"] = time.time()
        self._closed = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._keep_alive, name=f"heartbeat-rank{rank}", daemon=True)
        self._thread.start()

    def beat(self, phase: str, step: int | None = None) -> None:
        with self._lock:
            if step != self._state["step"]:
                self._state["step"], self._state["seq"] = step, 0
            self._state["seq"] = int(str(self._state["seq"])) + 1
            self._state["phase"] = phase
            self._state["progress"] = self._state["alive"] = time.time()
            self._write_locked()

    def close(self, phase: str = "done", step: int | None = None) -> None:
        """The rank's last beat (`done`, or `stopped` at the step it saved) and the end of its thread."""
        if self._closed.is_set():
            return
        self.beat(phase, step if step is not None else self._state["step"])  # type: ignore[arg-type]
        self._closed.set()
        with self._lock:
            os.close(self._fd)

    def _keep_alive(self) -> None:
        while not self._closed.wait(ALIVE_EVERY_S):
            with self._lock:
                if self._closed.is_set():
                    return
                self._state["alive"] = time.time()
                self._write_locked()

    def _write(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        line = json.dumps(self._state, separators=(",", ":")).encode()[: RECORD_BYTES - 1]
        os.pwrite(self._fd, line.ljust(RECORD_BYTES - 1) + b"\n", 0)


def read_beats(workdir: str | Path) -> dict[int, Beat]:
    """Every rank's last beat that reads whole now (a record caught mid-write is left out of this poll)."""
    beats = {}
    for path in heartbeat_dir(workdir).glob("rank*.json"):
        try:
            raw = json.loads(path.read_bytes())
            beat = Beat(
                int(raw["rank"]), int(raw["pid"]), raw["step"], int(raw["seq"]), str(raw["phase"]),
                float(raw["progress"]), float(raw["alive"]),
            )  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            continue
        beats[beat.rank] = beat
    return beats


def stalled(beats: dict[int, Beat], now: float, limit_s: float) -> Stall | None:
    """The watchdog's verdict: None while every rank that is training made progress within `limit_s`.

    Ranks still setting up (no step yet) and ranks that ended are not timed: set-up may load weights for
    minutes, and a hang there ends through the collective timeout (`blame` then names the rank). A limit under
    FROZEN_AFTER_S counts as that: a frozen rank cannot be told from a waiting one sooner."""
    training = [b for b in beats.values() if b.step is not None and b.phase not in ENDED]
    limit = max(limit_s, FROZEN_AFTER_S)
    if limit_s <= 0 or not any(now - b.progress > limit for b in training):
        return None
    return _culprit(training, now)


def blame(beats: dict[int, Beat], now: float, reporter: int) -> Stall | None:
    """After a rank failed on a collective (a timeout, a reset connection): the rank that stopped first, if it is
    another one, frozen or behind the reporting rank; None when the reporter is the likeliest cause.

    Frozen is measured against the reporter's own last sign of life (it was alive until it failed), so a
    post-mortem long after the job ended reads the same as one at the failure; `now` only words the idle time."""
    live = [b for b in beats.values() if b.phase not in ENDED]
    mine = beats.get(reporter)
    if not live or mine is None:
        return None
    culprit = _culprit(live, mine.alive)
    if culprit.rank == reporter:
        return None
    frozen = mine.alive - beats[culprit.rank].alive > FROZEN_AFTER_S
    behind = _position(beats[culprit.rank]) < _position(mine)
    if not (frozen or behind):
        return None
    return Stall(culprit.rank, mine.alive - beats[culprit.rank].progress, culprit.phase, culprit.step)


def _position(b: Beat) -> tuple[int, int]:
    return (-1 if b.step is None else b.step, b.seq)


def _culprit(beats: list[Beat], now: float) -> Stall:
    frozen = [b for b in beats if now - b.alive > FROZEN_AFTER_S]
    pool = frozen or beats
    first = min(pool, key=lambda b: (_position(b), b.progress))
    return Stall(first.rank, now - first.progress, first.phase, first.step)


class Watchdog:
    """A daemon thread applying `stalled` every `poll_s`; calls `on_stall(stall)` once, then ends. For a job whose
    launcher does not wait beside it (a Slurm job's rank 0 runs it; the local launcher polls in its wait loop)."""

    def __init__(self, workdir: str | Path, limit_s: float, on_stall: Callable[[Stall], None], poll_s: float = 2.0):
        self.workdir, self.limit_s, self.on_stall, self.poll_s = workdir, limit_s, on_stall, poll_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="orch-watchdog", daemon=True)

    def start(self) -> Watchdog:
        if self.limit_s > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            stall = stalled(read_beats(self.workdir), time.time(), self.limit_s)
            if stall is not None:
                self.on_stall(stall)
                return


__all__ = ["Beat", "Heartbeat", "Stall", "Watchdog", "blame", "clear_heartbeats", "read_beats", "stalled"]
