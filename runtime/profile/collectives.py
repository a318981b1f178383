"""`orch profile`'s collective cases: nccl-tests-style collectives inside a node and across nodes.

Each link kind has its groups: the ranks of one node (intra_node) and the ranks of one local index
across the nodes (inter_node, with more than one node). A message of `nbytes` float32 bytes, as
nccl-tests counts it (all_gather: the gathered output; send_recv: every rank sends to the next).
"""

from __future__ import annotations

from typing import Any

from orch.runtime.profile.cases import CommCase, Link
from orch.runtime.profile.timing import Timer


def link_groups(rank: int, world: int, ranks_per_node: int) -> dict[Link, tuple[Any, list[int]]]:
    """This rank's (process group, ranks) of each link kind with more than one rank.

    Every rank creates every group in the same order (torch requires it).
    """
    import torch.distributed as dist

    rpn, nodes = ranks_per_node, world // ranks_per_node
    members: dict[Link, list[list[int]]] = {
        "intra_node": [list(range(n * rpn, (n + 1) * rpn)) for n in range(nodes)],
        "inter_node": [list(range(i, world, rpn)) for i in range(rpn)] if nodes > 1 else [],
    }
    groups: dict[Link, tuple[Any, list[int]]] = {}
    for link, sets in members.items():
        for ranks in sets:
            g = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks and g is not None:
                groups[link] = (g, ranks)
    return groups


def time_collective(case: CommCase, group: Any, ranks: list[int], rank: int, timer: Timer) -> float:
    """Seconds of one `case.op` over `group`; -1 where the backend lacks the op (left out of the profile)."""
    import torch
    import torch.distributed as dist

    dev, op, n = timer.device, case.op, len(ranks)
    numel = max(case.nbytes // 4 // n * n, n)  # float32, divisible by the group size
    x = torch.zeros(numel, dtype=torch.float32, device=dev)
    me = ranks.index(rank)
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(x, group=group)  # noqa: E731
    elif op == "all_gather":  # nccl-tests: the message is the gathered output
        parts = [torch.empty(numel // n, device=dev) for _ in range(n)]
        fn = lambda: dist.all_gather(parts, x[: numel // n], group=group)  # noqa: E731
    elif op == "reduce_scatter":
        out = torch.empty(numel // n, device=dev)
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
        fn = lambda: rs(out, x, group=group)  # noqa: E731
    elif op == "all_to_all":
        out = torch.empty_like(x)
        fn = lambda: dist.all_to_all_single(out, x, group=group)  # noqa: E731
    else:  # send_recv: every rank sends to the next and receives from the previous (nccl-tests sendrecv)
        buf = torch.empty_like(x)

        def fn() -> None:
            reqs = [
                dist.isend(x, ranks[(me + 1) % n], group=group),
                dist.irecv(buf, ranks[(me - 1) % n], group=group),
            ]
            for r in reqs:
                r.wait()

    try:
        return timer.time(fn, group)
    except (RuntimeError, NotImplementedError):
        return -1.0  # the backend lacks this op (gloo has no reduce_scatter); left out of the table


__all__ = ["link_groups", "time_collective"]
