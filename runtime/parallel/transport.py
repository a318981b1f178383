"""Move per-sample tensors between two layouts with one `all_to_all_single` (docs/design.md, One primitive).

A `Route` is a planner RouteTable over DP indices plus the two grids it joins. Every rank
knows every sample's row count (lengths of the global batch are known everywhere), so the
split sizes are computed locally, with no extra collective for counts.

Transport (the simplest correct form, docs/design.md): the leader of each DP index (tp 0, cp 0,
at the boundary PP stage) sends and receives, every other world rank takes part with zero
splits, then the destination leader broadcasts inside its TP x CP replica group. The list
form `all_to_all` with uneven sizes does not work on gloo, hence the single flat buffer.

Gradients: activations are replicated over TP/CP and the modules are Megatron-style, so
every replica holds the same full gradient of a boundary activation (under CP the LLM sums
its ranks' partial prefix gradients over the CP group to keep this, runtime/parallel/context.py); the backward is the
same move by the inverse route (leader's gradient only, then broadcast at the source).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from orch.planner.routing import RouteTable
from orch.runtime.parallel.grid import Grid


@dataclass(frozen=True)
class Route:
    table: RouteTable  # sample -> (source DP index, destination DP index)
    src: Grid
    dst: Grid
    rows: tuple[int, ...]  # rows of each sample's tensor, global sample ids
    src_stage: int = 0  # PP stage of src that holds the tensors (an encoder's last stage)
    dst_stage: int = 0  # PP stage of dst that consumes them (the LLM's first stage)

    def __post_init__(self) -> None:
        if self.table.num_src != self.src.dp or self.table.num_dst != self.dst.dp:
            raise ValueError(
                f"table {self.table.num_src}->{self.table.num_dst} does not join dp{self.src.dp}->dp{self.dst.dp}"
            )
        if len(self.rows) != self.table.num_samples:
            raise ValueError(f"{len(self.rows)} row counts for {self.table.num_samples} samples")

    def inverse(self) -> Route:
        return Route(self.table.inverse(), self.dst, self.src, self.rows, self.dst_stage, self.src_stage)

    def src_index(self, rank: int) -> int | None:
        """The DP index this rank holds at the source stage (any replica), else None."""
        c = self.src.coord(rank)
        return c.dp if c is not None and c.pp == self.src_stage else None

    def dst_index(self, rank: int) -> int | None:
        c = self.dst.coord(rank)
        return c.dp if c is not None and c.pp == self.dst_stage else None

    def held_rows(self, dst_index: int) -> int:
        return sum(self.rows[i] for i in self.table.held(dst_index))

    def source_rows(self, src_index: int) -> int:
        return sum(self.rows[i] for i in self.table.source_held(src_index))


def _replica_group(grid: Grid) -> Any:
    if grid.cp > 1:  # the flattened (cp, tp) group, created by build_meshes
        return grid.flat_group("cp", "tp")
    return grid.submesh("tp").get_group()


@dataclass
class P2P:
    """Point-to-point instead of the world all_to_all: only the ranks a move concerns take part.

    For schedules where the two sides of a boundary run different programs at the same time
    (the graph-aware 1F1B): leaders exchange by isend/irecv under `tag` (the inverse move, in
    backward, uses tag + 1), and the sends stay in `pending` until the caller waits for them.
    """

    tag: int
    pending: list[Any]


def move(x: torch.Tensor, route: Route, rank: int, world: int, p2p: P2P | None = None) -> torch.Tensor:
    """Rows of the samples this rank holds at the source (ascending ids) -> rows it holds at the destination.

    Every world rank calls this, in the same order (with `p2p`: the source and destination ranks of the
    route, in the same order per pair). Ranks outside the destination stage get [0, width].
    """
    width = x.shape[1]
    table, src, dst = route.table, route.src, route.dst
    in_splits, out_splits = [0] * world, [0] * world
    send = x.new_zeros(0, width)
    s_idx, d_idx = route.src_index(rank), route.dst_index(rank)

    if s_idx is not None and src.leader(s_idx, route.src_stage) == rank:
        held = table.source_held(s_idx)
        if x.shape[0] != route.source_rows(s_idx):
            raise ValueError(f"rank {rank}: {x.shape[0]} rows, the route expects {route.source_rows(s_idx)}")
        parts = dict(zip(held, x.split([route.rows[i] for i in held]), strict=True))
        plan = table.send_plan(s_idx)
        send = torch.cat([parts[i] for i in plan.ids]) if plan.ids else send
        for i in plan.ids:
            in_splits[dst.leader(table.dst[i], route.dst_stage)] += route.rows[i] * width

    recv_ids: tuple[int, ...] = ()
    if d_idx is not None and dst.leader(d_idx, route.dst_stage) == rank:
        rplan = table.recv_plan(d_idx)
        recv_ids = rplan.ids
        for i in rplan.ids:
            out_splits[src.leader(table.src[i], route.src_stage)] += route.rows[i] * width

    if p2p is None:
        recv = x.new_empty(sum(out_splits))
        dist.all_to_all_single(recv, send.reshape(-1).contiguous(), out_splits, in_splits)
    else:
        recv = _exchange(send.reshape(-1).contiguous(), in_splits, out_splits, rank, p2p)
    recv = recv.view(-1, width)

    if d_idx is None:
        return x.new_zeros(0, width)
    if recv_ids:  # restore ascending sample ids (the routing contract: recv_plan.order)
        parts_r = recv.split([route.rows[i] for i in recv_ids])
        recv = torch.cat([parts_r[k] for k in table.recv_plan(d_idx).order])
    if dst.tp * dst.cp > 1:
        out = recv if dst.leader(d_idx, route.dst_stage) == rank else x.new_empty(route.held_rows(d_idx), width)
        dist.broadcast(out, src=dst.leader(d_idx, route.dst_stage), group=_replica_group(dst))
        return out
    return recv


def _exchange(send: torch.Tensor, in_splits: list[int], out_splits: list[int], rank: int, p2p: P2P) -> torch.Tensor:
    """The all_to_all_single of `move` as point-to-point: sends queued in p2p.pending, receives waited."""
    recv = send.new_empty(sum(out_splits))
    offsets = [0]
    for n in out_splits:
        offsets.append(offsets[-1] + n)
    pieces = send.split(in_splits)
    for peer, (piece, n) in enumerate(zip(pieces, in_splits, strict=True)):
        if n and peer != rank:
            p2p.pending.append(dist.isend(piece.contiguous(), dst=peer, tag=p2p.tag))
    works = []
    for peer, n in enumerate(out_splits):
        if n and peer != rank:
            works.append(dist.irecv(recv[offsets[peer] : offsets[peer + 1]], src=peer, tag=p2p.tag))
        elif n:
            recv[offsets[peer] : offsets[peer + 1]] = pieces[peer]
    for work in works:
        work.wait()
    return recv


class _Move(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, route: Route, rank: int, world: int, p2p: P2P | None
    ) -> torch.Tensor:
        ctx.route, ctx.rank, ctx.world, ctx.p2p = route, rank, world, p2p
        return move(x.detach(), route, rank, world, p2p)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:  # type: ignore[override]
        p2p = ctx.p2p if ctx.p2p is None else P2P(ctx.p2p.tag + 1, ctx.p2p.pending)
        return move(grad.contiguous(), ctx.route.inverse(), ctx.rank, ctx.world, p2p), None, None, None, None


def routed(x: torch.Tensor, route: Route, rank: int, world: int, p2p: P2P | None = None) -> torch.Tensor:
    """Autograd-aware `move`: forward by the route, backward by its inverse.

    Every world rank must run the backward too (it is a collective): `x` must require grad on
    every rank, a [0, width] leaf where the rank holds nothing at the source. With `p2p`, only
    the route's source and destination ranks take part, forward and backward.
    """
    return _Move.apply(x, route, rank, world, p2p)
