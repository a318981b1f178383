"""Activation recompute as the plan says (ModulePlan.recompute), per module, on each transformer block.

* full: a block keeps only its input; its forward runs again in backward (torch.utils.checkpoint).
* selective: the block is checkpointed with a selective policy that keeps the outputs of its matrix
  products (the linear layers) and recomputes everything between them (attention scores, masks, the
  softmax, norms, activation functions): Korthikanti et al.'s selective recompute, whose large term is
  the attention core, as an op-level policy that applies to orch's reference modules and Hugging Face
  layers alike.

Applied before data parallelism (the FSDP2 hooks wrap the checkpointed forward) and with the same
names: the block's `forward` is replaced on the instance, so parameter names do not change. Recompute
replays the same operations on the same values, so it changes no loss.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn

from orch.planner.plan import Recompute
from orch.runtime.models.contract import block_units


def _keep_matmuls(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    kept = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return CheckpointPolicy.MUST_SAVE if op in kept else CheckpointPolicy.PREFER_RECOMPUTE


def apply_recompute(module: nn.Module, mode: Recompute) -> int:
    """Checkpoint every block of `module` as `mode` says; returns how many blocks were wrapped."""
    if mode == Recompute.NONE:
        return 0
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts, noop_context_fn

    context = (
        noop_context_fn
        if mode == Recompute.FULL
        else functools.partial(create_selective_checkpoint_contexts, _keep_matmuls)
    )
    blocks = block_units(module)
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward, context, checkpoint)  # type: ignore[method-assign]
    return len(blocks)


def _checkpointed(forward: Any, context: Any, checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
    return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)
