"""`orch profile --executor slurm`: the benchmark ranks as one Slurm allocation, through orch launch's path.

The same launcher as `orch launch --executor slurm` (runtime/launch/slurm.py: the same sbatch parameters
and setup template, a job record that `orch status`/`logs`/`cancel` know), running a ProfileTask
(runtime/profile/task.py) over `--nodes` nodes x the cluster's GPUs per node, one task per GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

from orch.planner.errors import OrchError
from orch.planner.specs import ClusterSpec, ModelSpec
from orch.runtime.launch.partition import fit_to_partition, read_partition
from orch.runtime.launch.sbatch import SlurmOptions, allocation_parameters, sbatch_text
from orch.runtime.launch.slurm import SlurmHandle, SlurmLauncher, python_command, setup_text
from orch.runtime.profile.cases import ProfileConfig
from orch.runtime.profile.task import ProfileTask


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
    given = cluster.cpus_per_gpu is not None
    params = fit_to_partition(params, read_partition(opts.partition), cpus_given=given, memory_gb_per_rank=0.0)
    return params, sbatch_text(params, str(Path(out) / "slurm" / "%j"), python_command())


def submit_profile(
    model: ModelSpec,
    cluster: ClusterSpec,
    cfg: ProfileConfig,
    nodes: int,
    opts: SlurmOptions,
    *,
    workdir: str | os.PathLike[str],
    device: str = "auto",
) -> SlurmHandle:
    out = Path(workdir).absolute()
    params, _ = profile_parameters(model, cluster, nodes, opts, out)
    task = ProfileTask(cfg, str(out), nodes * cluster.gpus_per_node, device=device)
    task.prepare()
    return SlurmLauncher(params).submit(task)


__all__ = ["profile_parameters", "submit_profile"]
