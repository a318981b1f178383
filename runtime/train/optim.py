"""The optimizer of a run: its parameter groups, the learning rate of each step, and the gradient clip by the
global norm over every module and every sharding.

* Groups: one per module and decay class. AdamW decays matrices and embeddings only (not biases, norm
  weights or other vectors), as Megatron-LM and torchtitan do; a module's rate is the run's times its
  `module_lr` factor (a projector often trains faster than an encoder being unfrozen).
* Schedule: linear warmup over `warmup_steps` (step k at lr·(k+1)/warmup, its last step at lr), then
  constant, linear or cosine decay from there to `min_lr` at the last step. A function of the step
  alone, so a resumed run continues on the same curve with nothing to checkpoint but the step.
* Clipping: the norm of the whole model's gradient as one vector, as one process would compute it. Each
  rank adds the squares of the gradient entries it is the one to count (`_counts_here`): an FSDP or TP
  shard by every rank holding one, a replicated tensor by index 0 of the axes it is replicated over;
  experts by the first EP group; every pipeline stage its own layers. One all_reduce sums them. The
  factor is torch.nn.utils.clip_grad_norm_'s: max_norm / (norm + 1e-6), at most 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from orch.runtime.parallel.tensor import local_part

if TYPE_CHECKING:
    from orch.runtime.parallel.expert import ExpertParallel
    from orch.runtime.parallel.grid import Grid
    from orch.runtime.train.config import TrainConfig

SCHEDULES = ("constant", "linear", "cosine")


def lr_at(cfg: TrainConfig, step: int) -> float:
    """The learning rate of step `step` (0-based) of a run of `cfg.steps` steps."""
    if cfg.warmup_steps > 0 and step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.lr_schedule == "constant":
        return cfg.lr
    peak = max(cfg.warmup_steps - 1, 0)  # the step at the full rate: the last of the warmup, else the first
    progress = min(max(step - peak, 0) / max(cfg.steps - 1 - peak, 1), 1.0)
    if cfg.lr_schedule == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * shape


def _decays(pname: str, p: torch.Tensor) -> bool:
    return p.ndim >= 2


def param_groups(modules: dict[str, nn.Module], cfg: TrainConfig) -> list[dict[str, Any]]:
    """One group per (module, decays) with trainable parameters; `scale` is the module's lr factor."""
    factors = dict(cfg.module_lr)
    groups = []
    for name, module in modules.items():
        for decays in (True, False):
            params = [p for pn, p in module.named_parameters() if p.requires_grad and _decays(pn, p) == decays]
            if params:
                wd = cfg.weight_decay if decays and cfg.optimizer == "adamw" else 0.0
                groups.append({"params": params, "weight_decay": wd, "scale": factors.get(name, 1.0)})
    return groups


def build_optimizer(modules: dict[str, nn.Module], cfg: TrainConfig) -> torch.optim.Optimizer | None:
    """The run's optimizer over every trainable parameter of `modules` (None if there are none)."""
    groups = param_groups(modules, cfg)
    if not groups:
        return None
    # foreach=False: the foreach kernels do not take a mix of DTensor and plain parameters.
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, foreach=False)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, foreach=False)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; expected sgd or adamw")


def set_lr(optimizer: torch.optim.Optimizer, cfg: TrainConfig, step: int) -> float:
    """Set every group's rate for step `step`; returns the run's rate."""
    lr = lr_at(cfg, step)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("scale", 1.0)
    return lr


def _counts_here(grad: torch.Tensor, coord: Any, expert: bool, ep_degree: int) -> bool:
    """Whether this rank adds `grad`'s local entries to the norm: each entry of the whole gradient once.

    A DTensor (FSDP2 and TP shards, on meshes named dp, tp or the flattened dp_cp) counts on every rank
    along a sharded mesh dimension and on index 0 of a replicated one; the grid's axes it is not laid
    over (tp for a replicated weight, cp under plain DP) count at index 0. An expert (not FSDP-managed,
    summed over its EDP group and CP) counts on the first EP group, at cp and tp index 0."""
    if expert:
        return bool(coord.dp < ep_degree and coord.cp == 0 and coord.tp == 0)
    covered: set[str] = set()
    if hasattr(grad, "device_mesh"):
        mesh = grad.device_mesh
        for i, (dim, placement) in enumerate(zip(mesh.mesh_dim_names or (), grad.placements, strict=True)):
            covered.update(dim.split("_"))
            if placement.is_replicate() and mesh.get_local_rank(i) != 0:  # shards (strided ones too) count
                return False
    return all(getattr(coord, axis) == 0 for axis in ("dp", "cp", "tp") if axis not in covered)


def _counted(
    modules: dict[str, nn.Module], grids: dict[str, Grid], ep: dict[str, ExpertParallel], rank: int
) -> list[torch.Tensor]:
    """The gradients (local parts) whose squares this rank adds to the global norm."""
    from orch.runtime.parallel.expert import is_expert_param

    out = []
    for name, module in modules.items():
        c = grids[name].coord(rank)
        if c is None:
            continue
        experts = ep.get(name)
        for pname, p in module.named_parameters():
            if p.grad is None:
                continue
            expert = experts is not None and is_expert_param(pname)
            if _counts_here(p.grad, c, expert, experts.ep if experts is not None else 1):
                out.append(local_part(p.grad))
    return out


def global_grad_norm(
    modules: dict[str, nn.Module], grids: dict[str, Grid], ep: dict[str, ExpertParallel], rank: int, device: Any
) -> float:
    """The 2-norm of the whole model's gradient (collective over the world)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for g in _counted(modules, grids, ep, rank):
        total += g.detach().to(torch.float64).pow(2).sum()
    dist.all_reduce(total)
    return float(total.sqrt().item())


def clip_grads(modules: dict[str, nn.Module], norm: float, max_norm: float) -> None:
    """Scale every gradient by clip_grad_norm_'s factor for `norm` (no-op when under the limit)."""
    coef = max_norm / (norm + 1e-6)
    if coef >= 1.0:
        return
    for module in modules.values():
        for p in module.parameters():
            if p.grad is not None:
                local_part(p.grad).mul_(coef)


def weights_finite(modules: dict[str, nn.Module], device: Any) -> bool:
    """Whether every parameter is finite on every rank (collective: one all-reduce of a flag): no checkpoint is
    saved of weights an update made infinite or NaN (runtime/train/divergence.py)."""
    flags = [torch.isfinite(local_part(p.detach())).all() for m in modules.values() for p in m.parameters()]
    ok = torch.stack(flags).all() if flags else torch.ones((), dtype=torch.bool, device=device)
    bad = (~ok).to(torch.int32)
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad.item())
