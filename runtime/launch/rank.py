"""The one way a rank starts, whoever launched it: environment, device, process group, the task, clean-up.

`RankEnv` is read once from where the launcher put it (the local launcher's spawn index, or submitit's
JobEnvironment on Slurm). `run_rank` picks the rank's device and backend on its own node
(runtime/device.py), joins the world group with a timeout, runs the task's rank body and, if it raises,
records when and why (runtime/launch/failures.py) before re-raising; the process group is destroyed in
every case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orch.runtime.launch.failures import record_failure
from orch.runtime.preemption import Preemption

if TYPE_CHECKING:
    import torch

    from orch.runtime.launch.base import Task


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


@dataclass
class RankContext:
    """What a task's rank body is handed: its place, its device and backend, and its stop requests."""

    env: RankEnv
    device: torch.device
    backend: str
    preemption: Preemption = field(default_factory=Preemption)
    log_steps: bool = False  # print "orch: step K loss L" on stdout (rank 0; the Slurm job's log)


def rendezvous_port(job_id: object) -> int:
    """The rank-0 port of a Slurm job: one per job incarnation, so a requeued job never meets its
    predecessor's TIME_WAIT sockets."""
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    digits = int("".join(c for c in str(job_id) if c.isdigit()) or 0)
    return 20000 + (digits * 7 + restart) % 20000


def run_rank(task: Task, env: RankEnv, *, preemption: Preemption | None = None, log_steps: bool = False) -> RankContext:
    """Run `task` as rank `env.rank`: the rank-start path of every launcher. Returns the context it ran in."""
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
            timeout_s=task.timeout_s,
            backend=dev.backend,
            device=dev.device,
        )
        ctx = RankContext(env, dev.device, dev.backend, preemption or Preemption(), log_steps)
        try:
            task.run(ctx)
        finally:
            dist.destroy_process_group()
        return ctx
    except BaseException as exc:
        record_failure(task.workdir, env.rank, exc)
        raise
