"""The gradient sync FSDP2 does not do: the local experts of an expert-parallel module.

Every other parameter is summed by its module's FSDP2 units (runtime/parallel/fsdp.py). Under EP the
ranks of one DP group hold different experts, so FSDP2 ignores them, and a local expert's gradient is
summed over the expert-data-parallel group (the ranks holding the same experts), then over the CP group
(each CP rank routes its own positions' tokens). No averaging: the loss is already divided by the global
label-token count, so the sum is the single-process gradient.

Coalesced: per module, the experts' gradients are flattened into one buffer per dtype, summed by one
all_reduce per group, and copied back. Gloo sums element by element whatever the buffer, so this is the
per-parameter sum at one collective per module, dtype and group.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from orch.runtime.parallel.context import CPGroup
from orch.runtime.parallel.expert import ExpertParallel, is_expert_param
from orch.runtime.parallel.tensor import local_part
from orch.runtime.train.trace import Span


def all_reduce_flat(grads: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Sum `grads` (same dtype) over `group` in place with one all_reduce of their concatenation."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def sync_expert_grads(
    modules: dict[str, nn.Module],
    ep: dict[str, ExpertParallel],
    cp: dict[str, CPGroup | None],
    spans: list[Span],
) -> None:
    """Sum every expert-parallel module's local expert gradients over its EDP group, then its CP group."""
    for name in sorted(ep):
        t = time.perf_counter()
        buckets: dict[torch.dtype, list[torch.Tensor]] = {}
        for pname, p in modules[name].named_parameters():
            if not is_expert_param(pname) or not p.requires_grad:
                continue
            if p.grad is None:  # no token reached this expert on this rank
                p.grad = torch.zeros_like(p)
            # stacked experts (transformers') are a DTensor sharded over the EP group: this rank's experts
            buckets.setdefault(p.grad.dtype, []).append(local_part(p.grad))
        module_cp = cp.get(name)
        for grads in buckets.values():
            for group in (ep[name].edp_group, module_cp.group if module_cp is not None else None):
                if group is not None:
                    all_reduce_flat(grads, group)
        spans.append((name, "grad_sync", t, time.perf_counter()))
