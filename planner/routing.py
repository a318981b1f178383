"""Routing tables: the one primitive behind post-balancing and the boundary communicators.

A table says, for every sample of a global batch, which rank of the source layout holds it
and which rank of the destination layout must hold it (docs/design.md, One primitive). Ranks here
are indices in a layout's DP dimension, not global ranks. The transport contract, relied on
by the runtime's all_to_all_single:

* a rank holds its samples in ascending sample id;
* it sends them grouped by destination rank, ascending id inside a group (`send_plan`);
* a rank receives groups in source-rank order (`recv_plan`), and restores ascending ids
  with the permutation `recv_plan` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

from orch.planner.errors import OrchError


class RoutingError(OrchError):
    pass


@dataclass(frozen=True)
class SendPlan:
    ids: tuple[int, ...]  # sample ids in send order
    splits: tuple[int, ...]  # samples per destination rank


@dataclass(frozen=True)
class RecvPlan:
    ids: tuple[int, ...]  # sample ids in receive order
    splits: tuple[int, ...]  # samples per source rank
    order: tuple[int, ...]  # order[k] = position in the receive buffer of the k-th held sample


@dataclass(frozen=True)
class RouteTable:
    src: tuple[int, ...]
    dst: tuple[int, ...]
    num_src: int
    num_dst: int

    def __post_init__(self) -> None:
        if len(self.src) != len(self.dst):
            raise RoutingError(f"src has {len(self.src)} samples, dst has {len(self.dst)}")
        for name, ranks, n in (("src", self.src, self.num_src), ("dst", self.dst, self.num_dst)):
            bad = [r for r in ranks if not 0 <= r < n]
            if bad:
                raise RoutingError(f"{name} rank {bad[0]} outside 0..{n - 1}")

    @classmethod
    def build(cls, src: list[int], dst: list[int], num_src: int, num_dst: int) -> RouteTable:
        return cls(tuple(int(r) for r in src), tuple(int(r) for r in dst), num_src, num_dst)

    @classmethod
    def identity(cls, ranks: list[int], num_ranks: int) -> RouteTable:
        return cls.build(ranks, ranks, num_ranks, num_ranks)

    @property
    def num_samples(self) -> int:
        return len(self.src)

    def inverse(self) -> RouteTable:
        return RouteTable(self.dst, self.src, self.num_dst, self.num_src)

    def then(self, other: RouteTable) -> RouteTable:
        """Apply self, then other: other's sources must be self's destinations."""
        if other.src != self.dst or other.num_src != self.num_dst:
            raise RoutingError("cannot compose: the second table does not start where the first ends")
        return RouteTable(self.src, other.dst, self.num_src, other.num_dst)

    def held(self, rank: int) -> list[int]:
        """Sample ids on destination `rank` after the move, ascending."""
        return [i for i, d in enumerate(self.dst) if d == rank]

    def source_held(self, rank: int) -> list[int]:
        return [i for i, s in enumerate(self.src) if s == rank]

    def send_plan(self, rank: int) -> SendPlan:
        ids = sorted(self.source_held(rank), key=lambda i: (self.dst[i], i))
        splits = [0] * self.num_dst
        for i in ids:
            splits[self.dst[i]] += 1
        return SendPlan(tuple(ids), tuple(splits))

    def recv_plan(self, rank: int) -> RecvPlan:
        ids = sorted(self.held(rank), key=lambda i: (self.src[i], i))
        splits = [0] * self.num_src
        for i in ids:
            splits[self.src[i]] += 1
        position = {sid: k for k, sid in enumerate(ids)}
        order = tuple(position[sid] for sid in sorted(ids))
        return RecvPlan(tuple(ids), tuple(splits), order)

    def moved(self) -> int:
        """Samples whose rank changes (same-numbered ranks count as the same rank)."""
        return sum(1 for s, d in zip(self.src, self.dst, strict=True) if s != d)
