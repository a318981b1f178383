"""A fused q/k/v projection sharded by heads: the Qwen-VL towers' `attn.qkv`, one Linear whose output rows are
all the queries, then all the keys, then all the values ([3 x width, in]; the attention reshapes its output to
[tokens, 3, heads, head_dim]).

A column split of those rows as they are would give TP rank 0 every query and half the keys. So the weight is
held as the same values viewed [3, width, in] (bias [3, width]), and TP shards dim 1: each rank holds rows
[r x width / tp, (r + 1) x width / tp) of q, of k and of v, whole heads of each, and its output reshapes to
[tokens, 3, heads / tp, head_dim] as the attention expects once its head count is divided (`after_tp`). The view
is the layout at every TP degree (a checkpoint is the same whatever the plan); the safetensors' [3 x width, in]
is read into it (runtime/models/hf/weights.py) and written back from it (export.py) by reshaping, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from orch.runtime.parallel.tensor import local_part

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


class GroupedQKV(nn.Module):
    """The fused Linear `fused`, its parameters viewed by group (q, k, v): the same values, the same output."""

    def __init__(self, fused: nn.Linear) -> None:
        super().__init__()
        width = fused.out_features // 3
        self.weight = nn.Parameter(fused.weight.view(3, width, fused.in_features), fused.weight.requires_grad)
        self.bias = None if fused.bias is None else nn.Parameter(fused.bias.view(3, width), fused.bias.requires_grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # This rank's rows (all of them without TP), q then k then v: [tokens, 3 x width / tp].
        bias = None if self.bias is None else local_part(self.bias).flatten()
        return F.linear(x, local_part(self.weight).flatten(0, 1), bias)


def group_fused_qkv(attention: nn.Module, name: str = "qkv") -> None:
    """Replace `attention.<name>` (an nn.Linear of q, k and v rows) by its GroupedQKV."""
    fused = getattr(attention, name)
    if not isinstance(fused, GroupedQKV):
        setattr(attention, name, GroupedQKV(fused))


class GroupedColwise(ParallelStyle):
    """TP of a GroupedQKV: its parameters sharded on dim 1 (whole heads of q, k and v per rank), its input
    replicated (every rank's gradient of it summed over the TP group in the backward, as ColwiseParallel does),
    its output this rank's local columns."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import distribute_module

        if not isinstance(module, GroupedQKV):
            raise TypeError(f"GroupedColwise shards a GroupedQKV, not {type(module).__name__}")
        return distribute_module(module, device_mesh, self._shard_params, input_fn=self._replicate_input)

    def _shard_params(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        from torch.distributed.tensor import Shard, distribute_tensor

        for pname, p in list(module.named_parameters(recurse=False)):
            sharded = distribute_tensor(p, mesh, [Shard(1)], src_data_rank=self.src_data_rank)
            module.register_parameter(pname, nn.Parameter(sharded, p.requires_grad))

    @staticmethod
    def _replicate_input(module: nn.Module, inputs: tuple[Any, ...], mesh: DeviceMesh) -> tuple[Any, ...]:
        from torch.distributed.tensor import DTensor, Partial, Replicate

        x = inputs[0]
        if isinstance(x, DTensor):
            x = x.redistribute(mesh, [Replicate()]).to_local()
        replicated = DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        return (replicated.to_local(grad_placements=[Partial()]), *inputs[1:])
