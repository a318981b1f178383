"""Boundary communicators: encoder outputs from the encoder's layout into the LLM's, and back.

Equal-DP, Fan-in and Fan-out, colocated or not, are one operation (docs/design.md): a RouteTable
from each sample's DP index in the encoder to its DP index in the LLM, moved by
`transport.routed` (one all_to_all_single; the inverse table in backward). Colocated edges
keep the bytes inside the shared rank set because both grids use the same ranks; disjoint
islands exchange leader to leader. So any DP ratio works (2 -> 3 as well as 4 -> 2), and the
edge's `kind` is a label checked against the two grids, not a code path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orch.planner.plan import Edge, EdgeKind, Transport
from orch.planner.routing import RouteTable
from orch.runtime.data.batch import GlobalBatch, initial_dp_index
from orch.runtime.parallel.grid import Grid
from orch.runtime.parallel.transport import P2P, Route, routed


def expected_kind(src_dp: int, dst_dp: int) -> EdgeKind:
    if src_dp == dst_dp:
        return EdgeKind.EQUAL_DP
    return EdgeKind.FAN_IN if src_dp > dst_dp else EdgeKind.FAN_OUT


@dataclass(frozen=True)
class Boundary:
    """One encoder -> LLM edge of a plan, with the grids on either side."""

    edge: Edge
    src: Grid
    dst: Grid

    def __post_init__(self) -> None:
        want = expected_kind(self.src.dp, self.dst.dp)
        if self.edge.kind != want:
            raise ValueError(f"edge {self.edge.src}->{self.edge.dst}: kind {self.edge.kind}, dp ratio says {want}")
        shared = set(self.src.ranks) & set(self.dst.ranks)
        if self.edge.transport == Transport.P2P and shared:
            raise ValueError(f"edge {self.edge.src}->{self.edge.dst}: p2p but ranks {sorted(shared)[:3]} are shared")

    def route(
        self,
        batch: GlobalBatch,
        table: RouteTable | None = None,
        only: frozenset[int] | None = None,
        rows: tuple[int, ...] | None = None,
    ) -> Route:
        """This step's table: each sample from its encoder DP index to its LLM DP index.

        Without `table`, the unbalanced one (initial placement on both sides); the orchestrator
        passes its composed table (runtime/train/post_balance.py, StepTables.boundary_table), with `rows`
        the LLM rows of each of its units where they are not the batch's samples (an encoder's pieces,
        `StepTables.boundary_rows`). With `only`, the other units carry no rows (one micro-batch's move of
        the graph schedule).
        """
        n = batch.size
        if table is None:
            table = RouteTable.build(
                [initial_dp_index(i, self.src.dp) for i in range(n)],
                [initial_dp_index(i, self.dst.dp) for i in range(n)],
                self.src.dp,
                self.dst.dp,
            )
        if rows is None:
            rows = tuple(batch.projected(self.edge.src, i) for i in range(n))
        if only is not None:
            rows = tuple(r if i in only else 0 for i, r in enumerate(rows))
        return Route(table, self.src, self.dst, rows, src_stage=self.src.pp - 1, dst_stage=0)

    def forward(
        self,
        x: torch.Tensor,
        batch: GlobalBatch,
        rank: int,
        world: int,
        table: RouteTable | None = None,
        *,
        only: frozenset[int] | None = None,
        p2p: P2P | None = None,
        rows: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """Autograd-aware move of this rank's encoder rows (ascending sample ids) into the LLM layout.

        `only` and `p2p`: one micro-batch's samples, point to point (the graph-aware 1F1B).
        """
        if not x.requires_grad:
            # The backward is a collective every rank must join: give it a graph node on every rank.
            x = x.detach().requires_grad_()
        return routed(x, self.route(batch, table, only, rows), rank, world, p2p)
