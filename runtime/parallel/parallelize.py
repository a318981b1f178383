"""One place to parallelise a module of any kind, in torchtitan's order: tensor parallelism, then activation
recompute, then FSDP2 (data parallelism over the module's (dp, cp) ranks).

What each step reads of the module is its contract (runtime/models/contract.py): `tp_plan()` / `after_tp`,
`block_units()`, and for a module built on meta (Hugging Face families) `materialize`. Pipeline stages
(`keep_stage`) and expert parallelism are cut before this, on the whole model (runtime/train/rank_model.py):
they decide which parameters a rank has at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from orch.runtime.parallel.fsdp import ModuleShards, apply_fsdp
from orch.runtime.parallel.recompute import apply_recompute
from orch.runtime.parallel.tensor import apply_tp

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from orch.planner.plan import ModulePlan
    from orch.runtime.parallel.grid import Grid


def is_on_meta(module: nn.Module) -> bool:
    return any(p.is_meta for p in module.parameters())


def place(module: nn.Module, *, tp_mesh: DeviceMesh | None, device: torch.device, seed: int, name: str) -> None:
    """This rank's TP share of `module` on `device`. A module initialised on the CPU from the seed (orch's
    reference, a user's factory) moves there and is then sharded (full tensors sliced: the values do not depend
    on the layout); a module built on meta is sharded there first, then only its share is allocated and filled
    (`materialize`: read from safetensors, or drawn from the seed)."""
    on_meta = is_on_meta(module)
    if not on_meta:
        module.to(device)
    apply_tp(module, tp_mesh=tp_mesh)
    if on_meta:
        module.materialize(device, seed, name)  # type: ignore[operator]


def parallelize(
    module: nn.Module,
    *,
    name: str,
    grid: Grid,
    plan: ModulePlan,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    ignored: set[str] | None = None,
) -> ModuleShards:
    """TP over the grid's tp axis, the plan's recompute on every block, FSDP2 (or replicate) over its (dp, cp)
    ranks; `dtype`: the compute dtype (mixed precision when the masters are wider). `ignored`: the names of the
    parameters FSDP2 leaves alone (experts that differ between DP ranks; by name, as placing a module on meta
    gives it new Parameters). Returns the module's FSDP2 units, driven once a step by
    `fsdp.DataParallelSteps`."""
    place(module, tp_mesh=grid.submesh("tp"), device=device, seed=seed, name=name)
    skip = {p for pn, p in module.named_parameters() if pn in ignored} if ignored else None
    apply_recompute(module, plan.recompute)
    return apply_fsdp(
        module,
        name=name,
        mesh=grid.dp_mesh,
        mode=plan.data_parallel,
        dtype=dtype,
        ignored=skip,
        sharding=plan.sharding,
    )
