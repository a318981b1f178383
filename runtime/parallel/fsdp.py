"""FSDP2 for each module over its (dp, cp) ranks, as the plan says
(ModulePlan.data_parallel): `fully_shard` (fsdp: parameters, gradients and optimizer state sharded)
or FSDP2's `replicate` (whole state on every rank, gradients all-reduced). One FSDP unit per
transformer block, then the module (torchtitan's order: TP, recompute, then data parallelism).

One gather and one reduction per step, whatever the schedule. Post-balancing gives DP ranks different
numbers of calls of a module in a step (micro-batches, encoder chunks, none at all when a rank holds no
sample of a modality), while FSDP2's own hooks gather before every forward and reduce after the last
backward, collectives every DP rank must join equally. So each step is driven from outside, as
torch.distributed.pipelining drives FSDP2 under a pipeline schedule: `begin()` gathers every unit's
parameters (reshard after forward and after backward off, gradient sync off: the backward of each call
only accumulates full-size gradients), and `finish()` runs every unit's post-backward in the same order
on every rank (reduce-scatter or all-reduce, zeros for a parameter this rank never used), then FSDP2's
final callback. Between steps only the shards exist.

Gradients are summed, not averaged (divide factor 1): the loss is already divided by the global
label-token count. Mixed precision (`--dtype bfloat16`): fp32 masters, bf16 compute, fp32 reduction
(MixedPrecisionPolicy). Under EP the experts differ between DP ranks: FSDP2 ignores them and their
gradients go over the expert-data-parallel group as before (runtime/train/grad_sync.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from orch.planner.plan import DataParallel
from orch.runtime.models.contract import block_units
from orch.runtime.parallel.tensor import local_part

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule


def master_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype parameters are kept in: fp32 masters under a 16-bit compute dtype, else the run's."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


def _policy(dtype: torch.dtype) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if master_dtype(dtype) == dtype:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


@dataclass
class ModuleShards:
    """One module's FSDP2 units (its blocks, then the module itself last)."""

    name: str
    mode: DataParallel
    units: list[FSDPModule] = field(default_factory=list)

    @property
    def root(self) -> FSDPModule:
        return self.units[-1]


def apply_fsdp(
    module: nn.Module,
    *,
    name: str,
    mesh: DeviceMesh,
    mode: DataParallel,
    dtype: torch.dtype,
    ignored: set[nn.Parameter] | None = None,
) -> ModuleShards:
    """Apply fully_shard (fsdp) or replicate to `module`'s blocks and then to it, over `mesh` (its (dp, cp) ranks);
    `dtype` is the compute dtype (mixed precision when it is narrower than the masters)."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.fsdp import fully_shard

    policy = _policy(dtype)
    out = ModuleShards(name, mode)
    for unit in [*block_units(module), module]:
        mine = {p for p in unit.parameters() if ignored and p in ignored} or None
        if mode == DataParallel.FSDP:
            fully_shard(unit, mesh=mesh, reshard_after_forward=False, mp_policy=policy, ignored_params=mine)
        else:
            replicate(unit, mesh=mesh, mp_policy=policy, ignored_params=mine)
        out.units.append(unit)  # type: ignore[arg-type]
    for unit in out.units:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain sum (gloo has no PREMUL_SUM); no division by 1
        unit.set_reduce_scatter_unused_params(True)
    out.root._get_fsdp_state()._lazy_init()  # the root's state now, not at a first forward some rank may not run
    return out


class DataParallelSteps:
    """Every served module's units, driven once per step: `begin()` before the first forward, `finish()` after
    the last backward. Modules in name order, units in a fixed order: the same collectives on every rank."""

    def __init__(self, shards: dict[str, ModuleShards]) -> None:
        self.shards = dict(sorted(shards.items()))

    def _units(self) -> list[FSDPModule]:
        return [u for s in self.shards.values() for u in s.units]

    def begin(self) -> None:
        for unit in self._units():
            unit.set_requires_gradient_sync(False, recurse=False)
            unit.set_reshard_after_backward(False, recurse=False)
            unit.set_is_last_backward(False)
        for unit in self._units():
            unit.unshard()

    def finish(self) -> None:
        units = self._units()
        for unit in units:
            unit.set_requires_gradient_sync(True, recurse=False)
            unit.set_reshard_after_backward(True, recurse=False)
            unit.set_is_last_backward(True)
        for shards in self.shards.values():
            for unit in reversed(shards.units):  # backward order: the last block first, the module's own last
                for group in unit._get_fsdp_state()._fsdp_param_groups:
                    group.post_backward()
            shards.root._get_fsdp_state()._root_post_backward_final_callback()

    def gathered_bytes(self) -> int:
        """Bytes of the full-size parameters and gradients the units hold now (between begin and finish)."""
        total = 0
        for unit in self._units():
            for group in unit._get_fsdp_state()._fsdp_param_groups:
                for fp in group.fsdp_params:
                    if group.is_unsharded and hasattr(fp, "_unsharded_param"):
                        p = fp.unsharded_param
                        grad = fp.unsharded_accumulated_grad if fp.unsharded_accumulated_grad is not None else p.grad
                        for t in (p, grad) if grad is not None else (p,):
                            local = local_part(t)
                            total += local.numel() * local.element_size()
        return total
