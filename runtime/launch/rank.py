"""The one way a rank starts, whoever launched it: environment, device, process group, the task, clean-up.

`RankEnv` is read once from where the launcher put it (the local launcher's spawn index, submitit's
JobEnvironment on Slurm, or torch's standard variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT, set by torchrun or a Kubernetes PyTorchJob). `run_rank` picks the rank's device and backend
on its own node (runtime/device.py), joins the world group with a timeout, runs the task's rank body and, if it raises,
records when and why (runtime/launch/failures.py) before re-raising; the process group is destroyed in
every case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from orch.planner.errors import OrchError
from orch.runtime.launch.failures import record_failure
from orch.runtime.preemption import Preemption

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RankEnv:
    """Where this rank stands in the job (a value: read once from the launcher's environment)."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    master: str = "127.0.0.1"
    port: int = 29500
    job_id: str = "local"
    device: str = "auto"  # what the task asked for, resolved by the launcher where it can be (runtime/device.py)
    # How the process group meets: None is tcp://master:port (rank 0 hosts the store); "env://" under torchrun,
    # whose agent may already host the store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE): torch's own rule.
    init_method: str | None = None

    @classmethod
    def from_submitit(cls, device: str) -> RankEnv:
        """This Slurm task's place, from submitit's JobEnvironment; the port is the job incarnation's own."""
        import submitit

        env = submitit.JobEnvironment()
        return cls(
            rank=env.global_rank,
            world=env.num_tasks,
            local_rank=env.local_rank,
            local_world=env.num_tasks // max(1, env.num_nodes),
            master=env.hostnames[0],
            port=rendezvous_port(env.job_id),
            job_id=str(env.job_id),
            device=device,  # chosen in the task, on its node: a GPU per task under NCCL, else gloo
        )

    @classmethod
    def from_torch_env(cls, device: str, environ: dict[str, str] | None = None) -> RankEnv:
        """This rank's place from the variables torchrun (or a Kubernetes PyTorchJob) sets; OrchError naming the
        first one missing or not a number."""
        env = dict(os.environ if environ is None else environ)
        missing = [name for name in TORCH_ENV if not env.get(name)]
        if missing:
            raise OrchError(
                f"{missing[0]} is not set: start this with torchrun (or a launcher that sets {', '.join(TORCH_ENV)})"
            )

        def number(name: str, default: str | None = None) -> int:
            text = env.get(name) or default or ""
            if not text.isdigit():
                raise OrchError(f"{name}={text!r}: expected a non-negative integer")
            return int(text)

        rank, world, local_rank = number("RANK"), number("WORLD_SIZE"), number("LOCAL_RANK")
        if not rank < world:
            raise OrchError(f"RANK={rank}: expected less than WORLD_SIZE={world}")
        return cls(
            rank=rank,
            world=world,
            local_rank=local_rank,
            # Absent outside torchrun (one process per pod): this rank needs only its own device.
            local_world=number("LOCAL_WORLD_SIZE", str(local_rank + 1)),
            master=env["MASTER_ADDR"],
            port=number("MASTER_PORT"),
            job_id=env.get("TORCHELASTIC_RUN_ID", "torchrun"),
            device=device,  # chosen on the rank's node, as on Slurm
            init_method="env://",
        )


TORCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # torch's standard rank variables


@dataclass
class RankContext:
    """What a task's rank body is handed: its place, its device and backend, and its stop requests."""

    env: RankEnv
    device: torch.device
    backend: str
    preemption: Preemption = field(default_factory=Preemption)
    log_steps: bool = False  # print "orch: " and the progress line on stdout (rank 0; the Slurm job's log)


class Task(Protocol):
    world_size: int
    workdir: str
    device: str  # "auto" | "cpu" | "cuda" (runtime/device.py)
    timeout_s: float  # a collective blocked longer than this on a dead peer fails
    # A task whose ranks beat (runtime/launch/heartbeat.py) may also have `watchdog_s`: the launcher ends the
    # job when a rank makes no progress for that long (absent or 0: no watchdog).

    def prepare(self) -> None:
        """Once, before any rank starts (the launcher's host, or rank 0 of a Slurm job before the rendezvous)."""

    def run(self, ctx: RankContext) -> None:
        """One rank's body, inside the world process group."""

    def result(self) -> Any:
        """What the ranks produced, read from the workdir once they are done."""

    def release(self) -> None:
        """What `prepare` holds for the run's life (the run directory's lock), freed once the ranks ended, in the
        process that prepared (a process's exit frees it too)."""


WATCHDOG_FIRST_S = 60.0  # how much later than the watchdog a collective times out


def collective_timeout_s(task: Task) -> float:
    """The process group's timeout: the task's, or, with a watchdog, long enough after it that the watchdog names
    a rank that stopped before a collective times out on a healthy one (and gets blamed)."""
    watchdog_s = float(getattr(task, "watchdog_s", 0.0) or 0.0)
    return max(task.timeout_s, watchdog_s + WATCHDOG_FIRST_S) if watchdog_s > 0 else task.timeout_s


def rendezvous_port(job_id: object) -> int:
    """The rank-0 port of a Slurm job: one per job incarnation, so a requeued job never meets its
    predecessor's TIME_WAIT sockets."""
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    digits = int("".join(c for c in str(job_id) if c.isdigit()) or 0)
    return 20000 + (digits * 7 + restart) % 20000


class PrepareRefused(OrchError):
    """Rank 0's `Task.prepare` refused the run (a workdir of another model, one in use): every rank says it."""


def run_rank(
    task: Task,
    env: RankEnv,
    *,
    preemption: Preemption | None = None,
    log_steps: bool = False,
    prepared: tuple[str | None] | None = None,
) -> RankContext:
    """Run `task` as rank `env.rank`: the rank-start path of every launcher. Returns the context it ran in.

    `prepared`: where rank 0 prepared the task itself before the rendezvous (Slurm), rank 0's outcome, (None,)
    or (its refusal,); the ranks meet anyway and rank 0 tells them, so a refusal ends every rank at once
    instead of leaving them at the rendezvous until its timeout. A failure is recorded before the process
    group goes: its peers fail on the closed connections after this rank's record is written, so the earliest
    record is the cause."""
    try:
        import torch.distributed as dist

        from orch.runtime.device import rank_device
        from orch.runtime.launch.procgroup import init_rank

        dev = rank_device(env.device, env.local_rank, env.local_world)
        init_rank(
            env.rank,
            env.world,
            master=env.master,
            port=env.port,
            init_method=env.init_method,
            timeout_s=collective_timeout_s(task),
            backend=dev.backend,
            device=dev.device,
        )
    except BaseException as exc:
        record_failure(task.workdir, env.rank, exc)
        raise
    ctx = RankContext(env, dev.device, dev.backend, preemption or Preemption(), log_steps)
    try:
        if prepared is not None:
            outcome = list(prepared)
            dist.broadcast_object_list(outcome, src=0)
            if outcome[0] is not None:
                raise PrepareRefused(str(outcome[0]))
        task.run(ctx)
    except PrepareRefused:
        raise  # not recorded: the workdir may be another live run's (its lock refused this one)
    except BaseException as exc:
        record_failure(task.workdir, env.rank, exc)
        raise
    finally:
        dist.destroy_process_group()
    return ctx
