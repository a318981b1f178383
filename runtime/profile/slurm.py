"""`orch profile --executor slurm`: the benchmark ranks as one Slurm allocation, through orch launch's path.

The same submitit submission as `orch launch --executor slurm` (runtime/launch/slurm.py `submit_task`, the
same sbatch parameters and setup template, a job record that `orch status`/`logs`/`cancel` know):
`--nodes` nodes x the cluster's GPUs per node, one task per GPU. Each task takes its rank, local
rank and the master address from submitit's JobEnvironment, picks its device and backend on its
node (runtime/device.py: CUDA + NCCL with a GPU per task, else gloo), and runs `profile_rank`,
the body of the local profile; rank 0 writes the raw results to WORKDIR/profile-raw.json, from
which the submitting host builds the profile once the job has completed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from orch.planner.errors import OrchError
from orch.planner.profile import Profile
from orch.planner.specs import ClusterSpec, ModelSpec
from orch.runtime.launch.sbatch import SlurmOptions, allocation_parameters, sbatch_text
from orch.runtime.launch.slurm import JobRecord, _python, rendezvous_port, setup_text, submit_task
from orch.runtime.profile.bench import ProfileConfig, build_profile

RAW = "profile-raw.json"


@dataclass(frozen=True)
class ProfileTask:
    """The submitit callable: one instance runs in every task of the allocation."""

    cfg: ProfileConfig
    workdir: str
    device: str = "auto"
    timeout_s: float = 300.0

    def __call__(self) -> None:
        import submitit
        import torch.distributed as dist

        from orch.runtime.device import rank_device
        from orch.runtime.launch.procgroup import init_rank
        from orch.runtime.profile.bench import profile_rank

        env = submitit.JobEnvironment()
        per_node = env.num_tasks // max(1, env.num_nodes)
        dev = rank_device(self.device, env.local_rank, per_node)
        port = rendezvous_port(env.job_id)
        init_rank(
            env.global_rank,
            env.num_tasks,
            master=env.hostnames[0],
            port=port,
            timeout_s=self.timeout_s,
            backend=dev.backend,
            device=dev.device,
        )
        try:
            raw = profile_rank(env.global_rank, env.num_tasks, self.cfg, device=str(dev.device))
            if raw is not None:
                raw["backend"] = dev.backend
                Path(self.workdir).mkdir(parents=True, exist_ok=True)
                (Path(self.workdir) / RAW).write_text(json.dumps(raw))
            dist.barrier()
        finally:
            dist.destroy_process_group()


def profile_parameters(
    model: ModelSpec, cluster: ClusterSpec, nodes: int, opts: SlurmOptions, workdir: str | os.PathLike[str]
) -> tuple[dict[str, object], str]:
    """(submitit parameters, sbatch text) of a profile over `nodes` nodes of `cluster`."""
    if nodes < 1:
        raise OrchError(f"--nodes {nodes}: expected at least 1 node")
    out = str(Path(workdir).absolute())
    params = allocation_parameters(
        f"orch-profile-{model.name}", nodes, cluster.gpus_per_node, cluster.cpus_per_gpu, opts, out, setup_text(opts)
    )
    return params, sbatch_text(params, str(Path(out) / "slurm" / "%j"), _python())


def submit_profile(
    model: ModelSpec,
    cluster: ClusterSpec,
    cfg: ProfileConfig,
    nodes: int,
    opts: SlurmOptions,
    *,
    workdir: str | os.PathLike[str],
    device: str = "auto",
) -> JobRecord:
    out = Path(workdir).absolute()
    params, _ = profile_parameters(model, cluster, nodes, opts, out)
    (out / RAW).unlink(missing_ok=True)
    world = nodes * cluster.gpus_per_node
    return submit_task(ProfileTask(cfg, str(out), device), params, out, world_size=world, steps=0)


def collect_profile(record: JobRecord, model: ModelSpec, cfg: ProfileConfig) -> Profile:
    """The profile of a completed job, from rank 0's raw results."""
    path = Path(record.workdir) / RAW
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise OrchError(f"job {record.job_id}: no profile results in {path} ({exc})") from None
    return build_profile(raw, model, cfg, record.world_size, str(raw.get("backend", "gloo")))


__all__ = ["ProfileTask", "collect_profile", "profile_parameters", "submit_profile"]
