"""The torchrun launcher: ranks started by any tool that sets torch's standard environment
(`orch launch --executor torchrun`; torchrun itself, or a Kubernetes PyTorchJob running the same entry point).

The task is pickled to WORKDIR/task.pkl (`write_task`, atomically), and every rank runs
`python -m orch.runtime.launch.torchrun_rank --sha256 HEX WORKDIR/task.pkl` (runtime/launch/torchrun_rank.py):
it unpickles the file only if its bytes have the sha256 the command line carries (whoever can write the workdir
cannot make the ranks run their code: the command is the launch's own, not a file in the workdir), reads
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT into the one RankEnv and runs the rank-start path
of every launcher (runtime/launch/rank.py `run_rank`); rank 0 prepares the task before the rendezvous, as
on Slurm, so a restarted pod trims metrics to the checkpoint it resumes from.

`torchrun_command` is a pure function (the text `--dry-run` prints). One node: `--standalone` (torchrun's
own rendezvous on localhost). Several nodes (the plan's allocation: runtime/launch/sbatch.py `allocation`):
the same command on every node, meeting by c10d rendezvous at `endpoint`; the workdir must then be on a
filesystem every node sees. `TorchrunLauncher.submit` runs the command on this node and waits on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orch.planner.errors import OrchError
from orch.planner.io import write_bytes_atomic
from orch.runtime.launch.base import Handle, LaunchError
from orch.runtime.launch.failures import first_failure
from orch.runtime.launch.rank import Task
from orch.runtime.workdir.files import make_workdir

TASK_FILE = "task.pkl"
ENTRY = "orch.runtime.launch.torchrun_rank"  # the ranks' module


def task_path(workdir: str | os.PathLike[str]) -> Path:
    return Path(workdir).absolute() / TASK_FILE


def task_bytes(task: Task) -> bytes:
    return pickle.dumps(task)


def task_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_task(task: Task, data: bytes | None = None) -> Path:
    """Pickle `task` (or write its `task_bytes`) to WORKDIR/task.pkl atomically (a rank never reads half a file),
    the workdir created private (runtime/workdir/files.py); its path."""
    path = task_path(task.workdir)
    make_workdir(path.parent)
    write_bytes_atomic(path, task_bytes(task) if data is None else data)
    return path


def read_task(path: str | os.PathLike[str], sha256: str) -> Task:
    """The task `write_task` left at `path`, unpickled only when its bytes have the `sha256` the command carries
    (the command line is the launch's own, the workdir anyone's who can write it); OrchError (one line) if it is
    missing, rewritten since, or not a task file."""
    p = Path(path)
    if not p.is_file():
        raise OrchError(f"{p}: no such task file (`orch launch --executor torchrun` writes WORKDIR/{TASK_FILE})")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise OrchError(f"{p}: unreadable ({exc.strerror})") from None
    if not hmac.compare_digest(task_digest(data), sha256.lower()):
        raise OrchError(
            f"{p}: not the task file this command was made for (its sha256 differs: rewritten since `orch launch` "
            "wrote it); not loaded: launch again"
        )
    try:
        task = pickle.loads(data)
    except (EOFError, pickle.UnpicklingError, AttributeError, ImportError, IndexError) as exc:
        raise OrchError(f"{p}: not a task file written by this orch version ({type(exc).__name__})") from None
    if not all(hasattr(task, name) for name in ("run", "world_size", "workdir", "device", "timeout_s")):
        raise OrchError(f"{p}: not a task file (a {type(task).__name__})")
    return task


def torchrun_program() -> list[str]:
    """This environment's torchrun (beside its python), else `python -m torch.distributed.run` (the same)."""
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "torch.distributed.run"]


def torchrun_command(
    task_file: str | os.PathLike[str],
    *,
    sha256: str,
    nodes: int,
    per_node: int,
    endpoint: str | None = None,
    run_id: str = "orch",
    program: list[str] | None = None,
) -> list[str]:
    """The torchrun command line that starts `nodes` x `per_node` ranks of the task in `task_file`, whose bytes'
    `sha256` each rank checks before it unpickles them."""
    if nodes > 1 and not endpoint:
        raise OrchError(f"the plan needs {nodes} nodes: give --rdzv-endpoint HOST:PORT (a host every node reaches)")
    if endpoint:
        rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id]
    else:
        rendezvous = ["--standalone"]
    return [
        *(program if program is not None else torchrun_program()),
        "--nnodes", str(nodes), "--nproc-per-node", str(per_node), *rendezvous,
        "--max-restarts", "0",  # a failed rank fails the run: orch resumes from checkpoints, not torchrun
        "-m", ENTRY, "--sha256", sha256, str(task_file),
    ]  # fmt: skip


def command_text(command: list[str]) -> str:
    return shlex.join(command)


@dataclass
class TorchrunLauncher:
    """Runs a task's ranks under torchrun on this node: `nodes` x `per_node` ranks in all (`endpoint`: the
    rendezvous of several nodes, each running `command(task)`)."""

    nodes: int = 1
    per_node: int | None = None
    endpoint: str | None = None

    def command(self, task: Task) -> list[str]:
        """Write the task file and return the command every node runs (`--dry-run` prints it)."""
        per_node = self.per_node if self.per_node is not None else task.world_size // self.nodes
        if self.nodes * per_node != task.world_size:
            raise OrchError(f"{self.nodes} node(s) x {per_node} ranks: the task needs {task.world_size} ranks")
        path = task_path(task.workdir)
        data = task_bytes(task)
        command = torchrun_command(
            path, sha256=task_digest(data), nodes=self.nodes, per_node=per_node, endpoint=self.endpoint,
            run_id=_run_id(path),
        )  # fmt: skip
        write_task(task, data)  # once the command is known to be right
        return command

    def submit(self, task: Task) -> TorchrunHandle:
        command = self.command(task)
        try:
            # its own session: a terminal's Ctrl-C reaches orch alone, which asks the ranks to stop (Handle.wait)
            process = subprocess.Popen(command, start_new_session=True)
        except OSError as exc:
            raise OrchError(f"{command[0]}: cannot start torchrun: {exc.strerror}") from None
        return TorchrunHandle(task, process)


def _run_id(path: Path) -> str:
    """The same id on every node that runs the command (a c10d rendezvous needs one), one per workdir."""
    return "orch-" + hashlib.sha1(str(path).encode()).hexdigest()[:12]


def child_pids(pid: int) -> list[int] | None:
    """The processes `pid` started (Linux's /proc), None where that cannot be read."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except (OSError, ValueError):
        return None


def _ask_ranks_to_stop(agent: int, forwarded: bool) -> bool:
    """SIGUSR1 to each rank torchrun's agent started (a stop request: they save at the next step boundary and exit
    0, so the agent ends cleanly), again at each poll for a rank still starting; where its children cannot be
    listed, one SIGTERM to the agent, which passes it on. Returns whether the agent had its SIGTERM."""
    ranks = child_pids(agent)
    if ranks is None:
        if not forwarded:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent, signal.SIGTERM)
        return True
    for pid in ranks:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGUSR1)
    return forwarded


class TorchrunHandle(Handle):
    """torchrun on this node. A stop signal to orch (SIGTERM, SIGINT, SIGUSR1) becomes a stop request to every
    rank torchrun started here (`_ask_ranks_to_stop`): they agree, save a checkpoint at the next step boundary and
    end (`stopped_by`, `stopped_at`); a second one kills torchrun's whole session without saving. Ranks that saved
    at a SIGTERM from elsewhere (a Kubernetes pod's end, which torchrun's agent passes on) count as stopped too."""

    def __init__(self, task: Task, process: subprocess.Popen[bytes]) -> None:
        self.task, self.process, self.job_id = task, process, str(process.pid)
        self.started = time.time()  # a heartbeat older than this is an earlier run's
        self.stopped_by: str | None = None
        self.stopped_at: int | None = None

    def state(self) -> str:
        code = self.process.poll()
        return "RUNNING" if code is None else ("COMPLETED" if code == 0 else "FAILED")

    def wait(self) -> None:
        from orch.runtime.launch.base import Aborted, RankStalled
        from orch.runtime.launch.failures import first_failure_record
        from orch.runtime.launch.heartbeat import read_beats
        from orch.runtime.launch.local import POLL_S, StopSignals

        forwarded = False
        with StopSignals([]) as signals:
            while True:
                try:
                    code = self.process.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if signals.second is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait()
                    raise Aborted(
                        f"aborted by a second {signals.second}: the ranks were killed without saving; relaunch "
                        "to resume from the newest checkpoint"
                    )
                if signals.first is not None:
                    forwarded = _ask_ranks_to_stop(self.process.pid, forwarded)
        rank0 = read_beats(self.task.workdir).get(0)
        if rank0 is not None and rank0.phase == "stopped" and rank0.progress >= self.started:
            # torchrun's agent exits non-zero after any signal, even once every rank saved and ended cleanly
            self.stopped_by, self.stopped_at = signals.first or "SIGTERM", rank0.step
            return
        if code != 0:
            record = first_failure_record(self.task.workdir)
            if record is not None and record.get("kind") == "hang":
                raise RankStalled(int(str(record["rank"])), str(record["error"]))
            found = first_failure(self.task.workdir) or (0, f"torchrun exited with code {code}")
            raise LaunchError(*found)

    def result(self) -> Any:
        self.wait()
        return self.task.result()

    def logs(self, rank: int = 0) -> str:
        return ""  # torchrun's ranks print to the launching terminal; nothing is kept


__all__ = ["TorchrunHandle", "TorchrunLauncher", "read_task", "torchrun_command", "write_task"]
