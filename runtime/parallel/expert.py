"""Expert parallelism: a MoE module's experts split over `ep` consecutive DP indices.

EP is carved out of DP (planner/plan.py): DP indices [g*ep, (g+1)*ep) with the same (pp, cp, tp)
coordinate form EP group g. A rank's EP rank is its position in the group by global rank (the
order of `new_group`'s group ranks, hence of all_to_all splits): DP index d is EP rank d % ep
whenever the module's ranks ascend, as planner and hand plans lay them out. Expert e lives on EP
rank e // (experts / ep); the ranks with the same EP rank in every EP group (dp / ep of them) hold
the same experts and form its expert-data-parallel (EDP) group, over which expert gradients are
summed. The router and everything outside the experts stay replicated over the whole DP group.

The MoE blocks are the module's `ExpertBlock`s (runtime/models/contract.py: orch's reference `MoE`, and
transformers' sparse blocks through runtime/models/hf/moe.py); nothing here knows a family. In every MoE layer
a rank sorts its (token, choice) rows by expert and `ExpertParallel.__call__` exchanges them: a small
all_to_all_single of the per-expert row counts, one all_to_all_single with uneven splits carrying the rows to
their experts' owners, the owners' experts, and the reverse all_to_all_single carrying the results back (gloo's
list all_to_all does not take uneven sizes). Each move is an autograd function whose backward is the
reverse move, so backward runs the same collectives in reverse order. Every rank of an EP group
must therefore run the same number of MoE forwards and backwards: the executor runs exactly
num_micro_batches LLM micro-batches on every rank when ep > 1, empty ones included (runtime/
models/reference.py's LLM keeps a graph through every layer for zero samples).

Under TP every TP rank holds the same tokens and the same (unsharded) experts; EP groups are
per TP coordinate, so the TP replicas of an EP group exchange the same rows in parallel.

`dist.new_group` is a world collective: `build_expert_parallel` creates every module's EP and EDP
groups on every rank in the same order, whether or not the rank serves the module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from orch.planner.plan import ModulePlan
from orch.runtime.models.contract import ExpertBlock
from orch.runtime.models.reference import inverse_permutation
from orch.runtime.parallel.grid import Grid


def expert_owner(expert: int, experts: int, ep: int) -> int:
    """The EP rank that holds `expert` (contiguous blocks of experts / ep)."""
    return expert // (experts // ep)


def local_experts(ep_rank: int, experts: int, ep: int) -> list[int]:
    per = experts // ep
    return list(range(ep_rank * per, (ep_rank + 1) * per))


def unsupported_ep(name: str, mp: ModulePlan, experts: int, is_llm: bool) -> str | None:
    """Why this module's ep cannot run (None if it can): runtime/train/support.py's check_supported."""
    ep = mp.layout.ep
    if ep == 1:
        return None
    if not is_llm:  # an encoder's micro-batch loop does not run the empty micro-batches EP needs
        return f"modules.{name}.layout.ep: {ep}: expert parallelism is executed for the LLM only"
    if experts % ep:
        return (
            f"modules.{name}.layout.ep: {ep} does not divide the module's {experts} experts "
            f"(expert parallelism splits the experts evenly over the EP group)"
        )
    return None


def _a2a(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """Rows to other ranks by uneven splits; backward moves the gradients back the same way reversed."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (out_splits, in_splits), group
        return _a2a(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out_splits, in_splits = ctx.splits
        return _a2a(grad, in_splits, out_splits, ctx.group), None, None, None


@dataclass
class ExpertParallel:
    """One module's EP state on this rank; as an `ExpertBlock`'s `exchange`, runs rows on their experts' owners."""

    ep: int
    ep_rank: int
    experts: int
    group: Any  # this rank's EP group
    edp_group: Any  # this rank's expert-data-parallel group, None when dp == ep

    @property
    def local(self) -> list[int]:
        return local_experts(self.ep_rank, self.experts, self.ep)

    def __call__(self, moe: ExpertBlock, x_ND: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor:
        """x_ND: rows sorted by expert, counts_E rows per expert. Returns the experts' outputs, same order."""
        per = self.experts // self.ep
        send_SL = counts_E.to(torch.int64).view(self.ep, per)  # per destination EP rank, per its local expert
        recv_SL = torch.empty_like(send_SL)
        dist.all_to_all_single(recv_SL, send_SL, group=self.group)
        in_splits, out_splits = send_SL.sum(1).tolist(), recv_SL.sum(1).tolist()
        recv_ND = AllToAll.apply(x_ND, out_splits, in_splits, self.group)
        # Received rows are grouped by source, then by local expert: regroup them by local expert.
        seg_S_L = torch.arange(self.ep * per, device=recv_SL.device).view(self.ep, per)
        expert_major = (seg_S_L % per) * self.ep + seg_S_L // per  # segment (s, l) -> position l * ep + s
        key_N = torch.repeat_interleave(expert_major.reshape(-1), recv_SL.reshape(-1))
        perm_N = torch.argsort(key_N, stable=True)
        y_ND = moe.run_experts(recv_ND[perm_N], recv_SL.sum(0).tolist(), self.local)
        back_ND = y_ND[inverse_permutation(perm_N)]
        return AllToAll.apply(back_ND, in_splits, out_splits, self.group)


def ep_groups(grid: Grid, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """(EP groups, EDP groups) of a grid as ascending global rank lists, in a fixed order.

    An EP group's i-th rank is EP rank i; EDP group r holds EP rank r of every EP group.
    """
    eps, edps = [], []
    for pp in range(grid.pp):
        for cp in range(grid.cp):
            for tp in range(grid.tp):
                mine = [sorted(grid.rank_at(pp, g * ep + r, cp, tp) for r in range(ep)) for g in range(grid.dp // ep)]
                eps += mine
                edps += [sorted(group[r] for group in mine) for r in range(ep)]
    return eps, edps


def build_expert_parallel(
    grids: dict[str, Grid], layouts: dict[str, int], modules: dict[str, nn.Module], rank: int, device_type: str
) -> dict[str, ExpertParallel]:
    """Create every module's EP/EDP groups (on every rank, name order), then shard this rank's experts.

    layouts: ep degree per module name. Served MoE modules with ep > 1 keep only their local
    experts (`ExpertBlock.keep_experts`, given the EP group as a 1-D DeviceMesh of `device_type`) and get an
    `ExpertParallel` as every MoE block's exchange.
    """
    out: dict[str, ExpertParallel] = {}
    for name in sorted(grids):
        ep = layouts.get(name, 1)
        if ep == 1:
            continue
        grid = grids[name]
        eps, edps = ep_groups(grid, ep)
        mine: dict[str, Any] = {}
        ep_rank, ep_ranks = 0, []
        for kind, lists in (("ep", eps), ("edp", edps)):
            for ranks in lists:
                if kind == "ep" and rank in ranks:
                    ep_rank, ep_ranks = ranks.index(rank), ranks
                if len(ranks) == 1:
                    continue
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine[kind] = group
        c = grid.coord(rank)
        if c is None or name not in modules:
            continue
        moes = [m for m in modules[name].modules() if isinstance(m, ExpertBlock)]
        if not moes:
            continue
        state = ExpertParallel(ep, ep_rank, moes[0].num_experts, mine["ep"], mine.get("edp"))
        mesh = DeviceMesh.from_group(mine["ep"], device_type, mesh=ep_ranks, mesh_dim_names=("ep",))
        for moe in moes:
            moe.keep_experts(state.local, mesh)
            moe.exchange = state
        out[name] = state
    return out


def is_expert_param(pname: str) -> bool:
    """A parameter of an expert MLP (named `...mlp.experts.<e>....` in runtime/models/reference.py,
    `...mlp.experts.gate_up_proj` in transformers' stacked experts)."""
    return ".experts." in f".{pname}"
