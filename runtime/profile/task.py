"""`orch profile` as a launcher task: every rank runs the benchmark body, rank 0 writes the raw results.

The same task runs on the local launcher (gloo ranks on this machine) and on Slurm (one task per GPU of
`--nodes` nodes, each picking its device on its node: CUDA + NCCL with a GPU per task, else gloo); the
submitting host builds the profile from WORKDIR/profile-raw.json once the ranks are done (`result`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from orch.planner.errors import OrchError
from orch.planner.io import write_text_atomic
from orch.planner.profile import Profile
from orch.planner.specs import ModelSpec
from orch.runtime.profile.build import build_profile
from orch.runtime.profile.cases import ProfileConfig
from orch.runtime.workdir.files import make_workdir

if TYPE_CHECKING:
    from orch.runtime.launch.rank import RankContext

RAW = "profile-raw.json"


@dataclass
class ProfileTask:
    cfg: ProfileConfig
    workdir: str
    world_size: int
    device: str = "cpu"
    timeout_s: float = 300.0

    @property
    def raw_path(self) -> Path:
        return Path(self.workdir) / RAW

    def prepare(self) -> None:
        make_workdir(self.workdir)
        self.raw_path.unlink(missing_ok=True)

    def run(self, ctx: RankContext) -> None:
        import torch.distributed as dist

        from orch.runtime.profile.bench import profile_rank

        raw = profile_rank(ctx.env.rank, ctx.env.world, self.cfg, device=str(ctx.device))
        if raw is not None:
            raw["backend"] = ctx.backend
            write_text_atomic(self.raw_path, json.dumps(raw))
        dist.barrier()

    def release(self) -> None:
        pass

    def result(self) -> Profile:
        try:
            raw = json.loads(self.raw_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise OrchError(f"{self.raw_path}: no profile results ({exc})") from None
        model = ModelSpec.model_validate_json(self.cfg.model_json)
        return build_profile(raw, model, self.cfg, self.world_size, str(raw.get("backend", "gloo")))
