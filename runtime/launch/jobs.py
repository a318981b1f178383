"""Job records and states of Slurm jobs: what `orch status`, `orch logs` and `orch cancel` read. Torch-free.

A small record per job (~/.orch/jobs/JOBID.json, or $ORCH_STATE_DIR/jobs) lets them find the workdir
and the log folder; state comes from sacct (submitit reads it too), the latest step from metrics.jsonl
(runtime/workdir/metrics.py), and a failed job's root cause from runtime/launch/diagnose.py.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pydantic import BaseModel

from orch.planner.errors import OrchError
from orch.planner.io import write_text_atomic
from orch.runtime.launch.base import TERMINAL
from orch.runtime.launch.failures import last_line


class JobRecord(BaseModel):
    job_id: str
    workdir: str
    log_folder: str
    world_size: int
    steps: int
    tasks_per_node: int | None = None  # None in records written before it was kept: world_size / nodes


class Failure(BaseModel):
    """Why a job failed. `kind`: "error" (a rank raised), "diverged" (a step's loss or gradient went non-finite:
    every rank stopped alike, runtime/train/divergence.py), "oom" (a rank ran out of memory: its allocator
    refused, or Slurm killed its node's ranks over --mem), "hang" (a rank made no progress: its peers failed
    waiting for it), "node_fail" (a node of the allocation died), or Slurm ended the job: "cancelled"
    (scancel), "timeout" (its time limit), "preempted", "boot_fail", "deadline"."""

    rank: int
    error: str
    log: str
    kind: str = "error"
    node: str | None = None
    ranks: list[int] = []  # node_fail: the ranks that were on the failed node

    @property
    def by_rank(self) -> bool:
        """A rank's own doing (its log tells why), not the scheduler's."""
        return self.kind in RANK_KINDS

    @property
    def summary(self) -> str:
        if self.kind == "error" or self.kind == "oom":
            return f"rank {self.rank} failed: {self.error}"
        return self.error


RANK_KINDS = ("error", "oom", "hang", "diverged")


class JobStatus(BaseModel):
    job_id: str
    state: str
    elapsed: str = ""
    exit_code: str = ""
    nodes: str = ""  # the allocation's node list (Slurm's notation)
    reason: str = ""  # why a PENDING job waits (squeue's %r)
    workdir: str
    log_folder: str
    step: int | None = None
    loss: float | None = None
    failure: Failure | None = None

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


def state_dir() -> Path:
    return Path(os.environ.get("ORCH_STATE_DIR") or Path.home() / ".orch") / "jobs"


def log_path(record: JobRecord, rank: int, stream: str = "out") -> Path:
    """submitit's per-task log: FOLDER/%j_%t_log.{out,err} (the folder is WORKDIR/slurm/%j)."""
    return Path(record.log_folder) / f"{record.job_id}_{rank}_log.{stream}"


def save_record(record: JobRecord) -> None:
    write_text_atomic(state_dir() / f"{record.job_id}.json", record.model_dump_json(indent=2) + "\n")


def load_record(job_id: str) -> JobRecord:
    if not job_id.isdigit():
        raise OrchError(f"{job_id!r} is not a Slurm job id")
    path = state_dir() / f"{job_id}.json"
    try:
        return JobRecord.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise OrchError(
            f"job {job_id}: no record in {state_dir()} (submitted with `orch launch --executor slurm`?)"
        ) from None


def run_command(cmd: list[str], timeout: float = 20) -> str:
    """A Slurm command's stdout; a command that is missing or hangs is an OrchError."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        raise OrchError(f"{cmd[0]} did not answer: {exc}") from None


class Accounting(BaseModel):
    """The allocation's own sacct line (or squeue's, before accounting has it)."""

    state: str = "UNKNOWN"
    by: str = ""  # CANCELLED: who cancelled it (sacct's "CANCELLED by UID", as a user name where known)
    time_limit: str = ""
    elapsed: str = ""
    exit_code: str = ""
    nodes: str = ""
    start: str = ""
    end: str = ""
    reason: str = ""  # PENDING: why (squeue's %r)


def accounting(job_id: str) -> Accounting:
    """State, elapsed time, exit code, node list, start and end from sacct, else squeue, else UNKNOWN."""
    fields = ["State", "Elapsed", "ExitCode", "NodeList", "Start", "End", "Timelimit"]
    lines = run_command(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", ",".join(fields)]).strip().splitlines()
    if lines:
        state, elapsed, code, nodes, start, end, limit = [*lines[-1].split("|"), *[""] * 7][:7]
        words = state.split()
        acct = Accounting(
            state=words[0] if words else "UNKNOWN",
            by=_user(words[2]) if len(words) > 2 and words[1] == "by" else "",
            time_limit=limit,
            elapsed=elapsed,
            exit_code=code,
            nodes="" if nodes == "None assigned" else nodes,
            start=start,
            end=end,
        )
        if acct.state == "PENDING":
            acct.reason = run_command(["squeue", "-h", "-j", job_id, "-o", "%r"]).strip()
        return acct
    queued = run_command(["squeue", "-h", "-j", job_id, "-o", "%T|%M|%N|%r"]).strip().splitlines()
    if queued:
        state, elapsed, nodes, reason = [*queued[0].split("|"), "", "", ""][:4]
        return Accounting(state=state, elapsed=elapsed, nodes=nodes, reason=reason if state == "PENDING" else "")
    return Accounting()


def _user(uid: str) -> str:
    """A user id as its name where this machine knows it."""
    import pwd

    try:
        return pwd.getpwuid(int(uid)).pw_name
    except (ValueError, KeyError):
        return uid


def cancel(job_id: str) -> None:
    load_record(job_id)
    try:
        done = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=20, check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        raise OrchError(f"scancel did not answer: {exc}") from None
    if done.returncode != 0:
        raise OrchError(f"scancel {job_id}: {last_line(done.stderr)}")


__all__ = ["Accounting", "Failure", "JobRecord", "JobStatus", "accounting", "cancel", "load_record"]
