"""Gradient sync after a step's backward: each module's gradients summed over its data-parallel ranks.

No averaging: the loss is already divided by the global label-token count, so the sum is the
single-process gradient. With CP every rank's gradients are partial (its positions only), so the sum
is over the flattened (dp, cp) group. Under EP the local experts' gradients sum over the
expert-data-parallel group, then over the CP group (each CP rank routes its own positions' tokens).

Coalesced: per module, the rank-local gradients (TP shards as they are) are flattened into one buffer
per dtype, summed by one all_reduce, and copied back. Gloo sums element by element whatever the
buffer, so this is the per-parameter sum at one collective per module and dtype.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from orch.runtime.parallel.context import CPGroup
from orch.runtime.parallel.expert import ExpertParallel, is_expert_param
from orch.runtime.parallel.grid import Grid
from orch.runtime.parallel.tensor import local_part
from orch.runtime.train.trace import Span


def all_reduce_flat(grads: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Sum `grads` (same dtype) over `group` in place with one all_reduce of their concatenation."""
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        g.copy_(part.view_as(g))


def sync_grads(
    modules: dict[str, nn.Module],
    grids: dict[str, Grid],
    ep: dict[str, ExpertParallel],
    cp: dict[str, CPGroup | None],
    spans: list[Span],
) -> None:
    """Sum every served module's gradients over its DP (or (dp, cp)) group; one span per module."""
    for name, module in modules.items():
        t = time.perf_counter()
        grid = grids[name]
        dp_group = grid.submesh("dp").get_group() if grid.dp > 1 else None
        if grid.cp > 1:
            dp_group = grid.flat_group("dp", "cp")
        experts = ep.get(name)
        buckets: dict[tuple[bool, torch.dtype], list[torch.Tensor]] = {}
        for pname, p in module.named_parameters():
            if not p.requires_grad:  # frozen: no gradient anywhere, nothing to sum
                continue
            if p.grad is None:  # no tokens of this modality on this rank
                p.grad = torch.zeros_like(p)
            local = local_part(p.grad)
            buckets.setdefault((experts is not None and is_expert_param(pname), local.dtype), []).append(local)
        module_cp = cp.get(name)
        for (expert, _), grads in buckets.items():
            if experts is not None and expert:
                groups = [experts.edp_group, module_cp.group if module_cp is not None else None]
            else:
                groups = [dp_group]
            for group in (g for g in groups if g is not None):
                all_reduce_flat(grads, group)
        spans.append((name, "grad_sync", t, time.perf_counter()))
