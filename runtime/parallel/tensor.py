"""Tensor parallelism, one mechanism for every module kind: PyTorch's DTensor `parallelize_module` with the
plan the module names by parameter path (`tp_plan()`, runtime/models/contract.py).

Megatron-style: q/k/v and the MLP's first projections column-parallel (each rank holds heads/tp heads and
ffn/tp columns), o and the MLP's last projection row-parallel (partial sums all-reduced). Embedding, norms,
stems, projectors and the LM head stay replicated: at these widths their compute is negligible, and
replicated inputs give every TP rank the full gradient of a replicated activation, which the boundary
communicators rely on. A module that names no plan (a user's `--model-factory` module) is sharded wherever
orch's reference `Block`s occur in it (`reference.block_tp_plan`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle


def local_part(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank holds: a DTensor's local shard, a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t  # type: ignore[no-any-return]


def local_nbytes(t: torch.Tensor) -> int:
    """Bytes this rank holds of `t` (a DTensor's local shard)."""
    local = local_part(t)
    return local.numel() * local.element_size()


def tp_plan_of(module: nn.Module) -> dict[str, ParallelStyle]:
    """The module's own TP plan, or that of the reference Blocks inside it."""
    from orch.runtime.models.contract import TensorParallel
    from orch.runtime.models.reference import block_tp_plan

    return module.tp_plan() if isinstance(module, TensorParallel) else block_tp_plan(module)


def apply_tp(module: nn.Module, *, tp_mesh: DeviceMesh | None) -> None:
    """Shard `module` over `tp_mesh` in place by its plan (a no-op without a mesh or for a mesh of size 1), then
    let it adjust what its config says but TP changes (`after_tp(tp)`, e.g. a head count used in a reshape)."""
    if tp_mesh is None or tp_mesh.size() == 1:
        return
    from torch.distributed.tensor.parallel import parallelize_module

    from orch.runtime.models.contract import AdjustsAfterTP

    plan = tp_plan_of(module)
    if plan:
        parallelize_module(module, tp_mesh, plan)
    if isinstance(module, AdjustsAfterTP):
        module.after_tp(tp_mesh.size())
