"""Tensor parallelism for the reference modules, with PyTorch's DTensor `parallelize_module`.

Megatron-style: q/k/v and the MLP's first projections column-parallel (each rank holds
heads/tp heads and ffn/tp columns), o and the MLP's last projection row-parallel (partial
sums all-reduced). Embedding, norms, stems, projectors and the LM head stay replicated: at
these widths their compute is negligible, and replicated inputs give every TP rank the full
gradient of a replicated activation, which the boundary communicators rely on. MoE blocks
(runtime/models/reference.py `MoE`) keep router and experts unsharded: only their attention is TP-sharded,
and every TP rank runs the same experts on the same tokens (expert parallelism splits experts
over DP indices instead, runtime/parallel/expert.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from orch.runtime.models.reference import Block, GeluMLP, MoE


def _block_plan(block: Block) -> dict[str, ColwiseParallel | RowwiseParallel]:
    plan: dict[str, ColwiseParallel | RowwiseParallel] = {
        "attn.q": ColwiseParallel(),
        "attn.k": ColwiseParallel(),
        "attn.v": ColwiseParallel(),
        "attn.o": RowwiseParallel(),
    }
    if isinstance(block.mlp, MoE):  # experts stay unsharded: every TP rank computes the same experts
        return plan
    if isinstance(block.mlp, GeluMLP):
        plan |= {"mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()}
    else:
        plan |= {"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    return plan


def local_part(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank holds: a DTensor's local shard, a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t  # type: ignore[no-any-return]


def apply_tp(module: nn.Module, *, tp_mesh: DeviceMesh) -> None:
    """Shard every Block of `module` over `tp_mesh` in place (a no-op for a mesh of size 1)."""
    if tp_mesh.size() == 1:
        return
    for block in module.modules():
        if isinstance(block, Block):
            parallelize_module(block, tp_mesh, _block_plan(block))
