"""One rank's share of the model, built once: build -> pipeline stage -> experts -> parallelize.

1. `models/build.py`: the modules this rank serves, from their source (a Hugging Face family on meta, a user's
   factory or orch's reference, full on the CPU from the seed), masters in fp32 under a 16-bit compute dtype;
2. the LLM keeps its pipeline stage's layers (`keep_stage`);
3. every module's EP/EDP groups (a world collective) and this rank's experts;
4. `parallel/parallelize.py` per module: TP -> recompute -> FSDP2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from orch.planner.plan import Plan
from orch.runtime.models.build import build_modules
from orch.runtime.models.contract import CausalLM, Staged
from orch.runtime.parallel.context import CPGroup, cp_group
from orch.runtime.parallel.expert import ExpertParallel, build_expert_parallel, is_expert_param
from orch.runtime.parallel.fsdp import DataParallelSteps, master_dtype
from orch.runtime.parallel.grid import Grid
from orch.runtime.parallel.parallelize import parallelize
from orch.runtime.parallel.pipeline import PipelineStage
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.support import UnsupportedPlan


@dataclass
class RankModel:
    """The modules this rank serves, parallelised, and what drives them."""

    modules: dict[str, nn.Module]
    cp: dict[str, CPGroup | None]  # per served module; None without CP
    stage: PipelineStage | None  # the LLM's pipeline stage on this rank (None: the rank serves no LLM)
    ep: dict[str, ExpertParallel]
    data_parallel: DataParallelSteps


def build_rank_model(
    plan: Plan, grids: dict[str, Grid], cfg: TrainConfig, rank: int, device: torch.device
) -> RankModel:
    model = plan.model
    served = [n for n in model.modules if grids[n].coord(rank) is not None]
    cp = {n: cp_group(grids[n], rank, device) for n in served}
    modules = build_modules(model, cfg.seed, master_dtype(cfg.torch_dtype), cfg.model_factory, served)
    stage = None
    if model.llm_name in modules:
        stage = _keep_stage(plan, grids[model.llm_name], modules[model.llm_name], cfg, rank, cp, device)
    layouts = {n: mp.layout.ep for n, mp in plan.modules.items()}
    ep = build_expert_parallel(grids, layouts, modules, rank, device.type)
    shards = {}
    for name, module in sorted(modules.items()):
        ignored = None
        if name in ep:  # experts differ between the DP ranks: summed over their EDP group instead
            ignored = {pn for pn, _ in module.named_parameters() if is_expert_param(pn)}
        shards[name] = parallelize(
            module, name=name, grid=grids[name], plan=plan.modules[name], device=device,
            dtype=cfg.torch_dtype, seed=cfg.seed, ignored=ignored,
        )  # fmt: skip
    # on the CPU the reshard modules' gathered bytes are sampled per block call (runtime/memory.py peak_bytes)
    return RankModel(modules, cp, stage, ep, DataParallelSteps(shards, watch=device.type == "cpu"))


def _keep_stage(
    plan: Plan,
    grid: Grid,
    llm: nn.Module,
    cfg: TrainConfig,
    rank: int,
    cp: dict[str, CPGroup | None],
    device: torch.device,
) -> PipelineStage:
    """The LLM cut to this rank's pipeline stage (after initialisation: every stage's weights are the full
    model's), and the stage that runs it."""
    name = plan.model.llm_name
    coord = grid.coord(rank)
    assert coord is not None
    if grid.pp > 1:
        if not isinstance(llm, Staged):
            raise UnsupportedPlan(f"modules.{name}: a pipeline needs the LLM's keep_stage")
        llm.keep_stage(coord.pp, grid.pp)
    return PipelineStage(cast(CausalLM, llm), grid, rank, plan.model.llm.hidden, cfg.torch_dtype, cp[name], device)
