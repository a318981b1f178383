"""What every launcher shares (docs/design.md, Conventions): `Launcher.submit(task) -> Handle`.

A `Task` (runtime/launch/rank.py, beside the rank start it is run by) is what each rank runs (`run`, inside its
process group), what is
prepared once before the ranks start (`prepare`), and what it produced once they are done (`result`).
A `Handle` is a submitted task: its `state`, `wait` (raises LaunchError naming the rank that failed
first), `result`, and a rank's `logs`. The local launcher (runtime/launch/local.py) and the Slurm one
(runtime/launch/slurm.py) implement it; training (runtime/train/trainer.py `TrainTask`), the profile
(runtime/profile/task.py `ProfileTask`) and the tests' sequences of runs are tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from orch.planner.errors import OrchError
from orch.runtime.workdir.files import make_workdir

if TYPE_CHECKING:
    from orch.runtime.launch.rank import RankContext, Task

# Slurm's states after which a job does not change; a local job ends COMPLETED or FAILED.
TERMINAL = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)


class LaunchError(OrchError):
    def __init__(self, rank: int, message: str) -> None:
        self.rank = rank
        self.message = message
        super().__init__(f"rank {rank} failed: {message}")


class RankStalled(LaunchError):
    """The watchdog's verdict: a rank made no progress (runtime/launch/heartbeat.py `Stall`)."""

    def __init__(self, rank: int, message: str) -> None:
        self.rank = rank
        self.message = message
        OrchError.__init__(self, message)


class Aborted(OrchError):
    """The user asked twice: the ranks were killed without saving."""


class Handle(ABC):
    job_id: str

    @abstractmethod
    def state(self) -> str:
        """RUNNING, COMPLETED, FAILED, ... (Slurm's state names)."""

    @abstractmethod
    def wait(self) -> None:
        """Block until the job ends; raise LaunchError (or an OrchError) unless it completed."""

    @abstractmethod
    def result(self) -> Any:
        """The task's result (waits first)."""

    @abstractmethod
    def logs(self, rank: int = 0) -> str:
        """What `rank` printed (stdout and stderr), as far as the launcher kept it."""

    @property
    def done(self) -> bool:
        return self.state() in TERMINAL


class Launcher(Protocol):
    def submit(self, task: Task) -> Handle: ...


@dataclass
class FunctionTask:
    """A picklable `fn(ctx)` run on every rank in the process group (benchmarks, tests of parallel parts):
    submitit's `submit(fn)`, for a world of ranks."""

    fn: Callable[[RankContext], Any]
    world_size: int
    workdir: str
    device: str = "cpu"
    timeout_s: float = 120.0

    def prepare(self) -> None:
        make_workdir(self.workdir)

    def run(self, ctx: RankContext) -> None:
        self.fn(ctx)

    def result(self) -> None:
        return None

    def release(self) -> None:
        pass


@dataclass
class TaskSequence:
    """Several tasks of one world size run one after another in one process group (one launch).

    Process start-up and the rendezvous, not the runs, dominate a test of many small plans.
    """

    tasks: list[Any]

    def __post_init__(self) -> None:
        worlds = {t.world_size for t in self.tasks}
        devices = {t.device for t in self.tasks}
        if len(worlds) != 1 or len(devices) != 1:
            raise OrchError(f"one launch needs one world size and device, got {sorted(worlds)}, {sorted(devices)}")

    @property
    def world_size(self) -> int:
        return int(self.tasks[0].world_size)

    @property
    def workdir(self) -> str:
        return str(self.tasks[0].workdir)

    @property
    def device(self) -> str:
        return str(self.tasks[0].device)

    @property
    def timeout_s(self) -> float:
        return max(float(t.timeout_s) for t in self.tasks)

    def prepare(self) -> None:
        for t in self.tasks:
            t.prepare()

    def run(self, ctx: RankContext) -> None:
        for t in self.tasks:
            t.run(ctx)

    def result(self) -> list[Any]:
        return [t.result() for t in self.tasks]

    def release(self) -> None:
        for t in self.tasks:
            t.release()
