"""A run directory's state, read from what the run leaves in it: what `orch status WORKDIR` shows for a local or
torchrun run (a Slurm job's comes from sacct: runtime/launch/jobs.py). Torch-free.

The pieces are the run's own records: the lock and who holds it (runtime/workdir/run_lock.py), each rank's heartbeat
(runtime/launch/heartbeat.py), the metrics file (runtime/workdir/metrics.py), the ranks' failure records
(runtime/launch/failures.py) and the run's plan.json and train.json (runtime/workdir/run_dir.py). The state:

* running: a live process holds the lock (the local launcher, or rank 0 under torchrun and Slurm);
* failed: a rank left a failure record (the earliest is the cause), or the lock names a holder that is gone
  (it died without releasing it: killed), or the ranks ended mid-run with neither (killed without saving);
* stopped: the ranks stopped at a step boundary on a signal and saved it (heartbeat phase `stopped`);
* finished: every rank of the plan ended its loop (phase `done`);
* not started: none of that yet (a run directory prepared, no rank beat).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from orch.planner.errors import OrchError
from orch.runtime.launch.failures import failure_dir, first_failure_record
from orch.runtime.launch.heartbeat import ENDED, FROZEN_AFTER_S, heartbeat_dir, read_beats
from orch.runtime.launch.jobs import Failure
from orch.runtime.workdir.metrics import last_record, metrics_path
from orch.runtime.workdir.run_dir import PLAN_FILE, TRAIN_FILE, checkpoint_root, step_name
from orch.runtime.workdir.run_lock import LOCK_FILE, is_held, lock_path, read_holder

RunState = Literal["running", "finished", "stopped", "failed", "not started"]


class LockHolder(BaseModel):
    """Who WORKDIR/run.lock names, and whether it holds the lock now."""

    host: str
    pid: int
    job_id: str
    started: float
    held: bool  # the lock is taken now (by this process or another)
    alive: bool | None  # the process lives; None: it runs on another host, which cannot be checked from here

    @property
    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return f"pid {self.pid} on {self.host} (job {self.job_id}, since {since})"


class RankBeat(BaseModel):
    """A rank's last heartbeat: its phase at `step` (None: before the first step), and how long ago."""

    rank: int
    pid: int
    phase: str
    step: int | None
    progress_age_s: float  # since it entered the phase
    alive_age_s: float  # since its liveness thread last wrote (over FROZEN_AFTER_S while running: frozen)


class RunStatus(BaseModel):
    workdir: str
    state: RunState
    steps: int | None = None  # the run's configured steps (train.json)
    world_size: int | None = None  # the plan's ranks (plan.json)
    step: int | None = None  # the newest step record's (0-based)
    loss: float | None = None
    holder: LockHolder | None = None  # None: the lock is free and names no one (released cleanly, or never taken)
    ranks: list[RankBeat] = []
    stopped_at: int | None = None  # stopped: the steps done, whose checkpoint the ranks saved
    checkpoint: str | None = None  # stopped: that checkpoint's folder
    failure: Failure | None = None  # failed by a rank: the earliest failure record (its log: the record file)
    reason: str = ""  # failed without a record: what the files say happened


RUN_FILES = (LOCK_FILE, "metrics.jsonl", PLAN_FILE, TRAIN_FILE)


def is_run_dir(path: str | Path) -> bool:
    """A directory a run was prepared or trained in (any of its own files, or heartbeats)."""
    p = Path(path)
    return p.is_dir() and (any((p / f).exists() for f in RUN_FILES) or heartbeat_dir(p).is_dir())


def run_status(workdir: str | Path, now: float | None = None) -> RunStatus:
    """The state of the run in `workdir` from its files (module docstring); OrchError if it is not a run directory."""
    if not is_run_dir(workdir):
        raise OrchError(
            f"{workdir}: not a run directory (no {', '.join(RUN_FILES)} or heartbeats): pass an `orch launch "
            "--workdir` or a Slurm job id"
        )
    now = time.time() if now is None else now
    status = RunStatus(workdir=str(Path(workdir).absolute()), state="not started")
    status.steps = _field(Path(workdir) / TRAIN_FILE, "steps")
    status.world_size = _field(Path(workdir) / PLAN_FILE, "world_size")
    last = last_record(metrics_path(workdir))
    if last is not None:
        status.step, status.loss = last.step, last.loss
    beats = read_beats(workdir)
    status.ranks = [
        RankBeat(rank=b.rank, pid=b.pid, phase=b.phase, step=b.step, progress_age_s=max(0.0, now - b.progress),
                 alive_age_s=max(0.0, now - b.alive))
        for b in sorted(beats.values(), key=lambda b: b.rank)
    ]  # fmt: skip
    held = is_held(workdir)
    named = read_holder(lock_path(workdir))
    if named is not None:
        here = named.host == socket.gethostname()
        status.holder = LockHolder(host=named.host, pid=named.pid, job_id=named.job_id, started=named.started,
                                   held=held, alive=named.alive_here() if here else None)  # fmt: skip
    if held:
        status.state = "running"
        return status
    first = first_failure_record(workdir)
    if first is not None:
        rank = int(str(first["rank"]))
        record = failure_dir(workdir) / f"rank{rank}.json"
        status.state = "failed"
        status.failure = Failure(rank=rank, error=str(first["error"]), log=str(record), kind=str(first.get("kind")))
        return status
    stopped = [b.step for b in beats.values() if b.phase == "stopped" and b.step is not None]
    if stopped:
        status.state, status.stopped_at = "stopped", min(stopped)
        status.checkpoint = str(checkpoint_root(status.workdir) / step_name(min(stopped)))
        return status
    ranks = status.world_size or len(beats)
    if beats and len(beats) >= ranks and all(b.phase == "done" for b in beats.values()):
        status.state = "finished"
        return status
    if status.holder is not None:  # the lock is free but still names its holder: it died without releasing it
        status.state = "failed"
        status.reason = f"{status.holder.describe} ended without releasing the run (killed?)"
        return status
    if beats:
        behind = min(beats.values(), key=lambda b: -1 if b.step is None else b.step)
        where = behind.phase if behind.step is None else f"{behind.phase}, step {behind.step}"
        ended = sum(b.phase in ENDED for b in beats.values())
        status.state = "failed"
        status.reason = (
            f"the ranks ended mid-run without a failure record or a checkpoint of the stop ({ended} of {ranks} "
            f"ended their loop; rank {behind.rank} last at {where}): killed?"
        )
    return status


def is_frozen(beat: RankBeat) -> bool:
    """A running rank whose liveness thread stopped writing: the process is stopped (SIGSTOP, a hung driver)."""
    return beat.phase not in ENDED and beat.alive_age_s > FROZEN_AFTER_S


def _field(path: Path, key: str) -> int | None:
    """An integer field of one of the run's JSON files, or None (missing, unreadable)."""
    try:
        value = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


__all__ = ["LockHolder", "RankBeat", "RunStatus", "is_frozen", "is_run_dir", "run_status"]
