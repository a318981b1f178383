"""`orch profile --executor local`: the benchmark ranks as local gloo processes, through orch launch's path.

The same local launcher as `orch launch --executor local` (runtime/launch/local.py), running a
ProfileTask (runtime/profile/task.py) on `nproc` processes of this machine.
"""

from __future__ import annotations

import os

from orch.planner.errors import OrchError
from orch.planner.profile import Profile
from orch.runtime.profile.cases import ProfileConfig


def run_profile_local(cfg: ProfileConfig, *, nproc: int, workdir: str | os.PathLike[str]) -> Profile:
    """Profile on `nproc` local gloo processes (the local launcher running a ProfileTask)."""
    from orch.runtime.launch.base import LaunchError
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.profile.task import ProfileTask

    if nproc < 1 or nproc % cfg.ranks_per_node:
        raise OrchError(f"--nproc {nproc}: must be a positive multiple of {cfg.ranks_per_node} ranks per node")
    task = ProfileTask(cfg, str(workdir), nproc, device="cpu")
    try:
        profile: Profile = LocalLauncher(nproc).submit(task).result()
    except LaunchError as exc:
        raise OrchError(f"profile rank {exc.rank} failed: {exc.message}") from None
    return profile


__all__ = ["run_profile_local"]
