"""The OrchMLLM paper's node-wise rearrangement (`--mode paper`), solved exactly with OR-Tools.

The paper keeps the balanced buckets (LPT here; the padded runs of padded.py) and chooses which
rank receives which bucket so that as many bytes as possible stay on their node. For 2,560 ranks
a bucket × rank assignment has 6.5 M arcs, so it is solved in two exact steps: a min-cost flow of
buckets to nodes (R buckets per node; arcs only where a bucket has bytes from the node, plus a
free hub) maximising bytes that stay on their node, then per node a linear sum assignment of its
buckets to its ranks maximising bytes that stay on their rank. This is the reference; it costs
about 0.1–1 s at 2,560 ranks (bench/bench_balance.py reports it).
"""

from __future__ import annotations

import numpy as np

from orch.planner.balance.cost import IntArray, PhaseArrays
from orch.planner.balance.greedy import lpt
from orch.planner.balance.padded import padded_runs
from orch.planner.errors import InfeasibleError


def _bucket_node_bytes(bucket: IntArray, ph: PhaseArrays, num_buckets: int) -> tuple[IntArray, IntArray, IntArray]:
    """Sparse (bucket, node, bytes) triples of the bytes each bucket holds from each origin node."""
    key = bucket * ph.num_nodes + ph.origin // ph.dp_per_node
    uniq, inv = np.unique(key, return_inverse=True)
    w = np.bincount(inv, weights=ph.bytes).astype(np.int64)
    return uniq // ph.num_nodes, uniq % ph.num_nodes, w


def buckets_to_nodes(bucket: IntArray, ph: PhaseArrays, num_buckets: int) -> IntArray:
    """Node of every bucket, R per node, maximising the bytes that stay on their node (min-cost flow)."""
    from ortools.graph.python import min_cost_flow

    num_nodes, dpn = ph.num_nodes, ph.dp_per_node
    b, m, w = _bucket_node_bytes(bucket, ph, num_buckets)
    # graph nodes: buckets 0..B-1, cluster nodes B..B+M-1, hub B+M, sink B+M+1
    hub, sink = num_buckets + num_nodes, num_buckets + num_nodes + 1
    tails = np.concatenate([b, np.arange(num_buckets), np.full(num_nodes, hub), num_buckets + np.arange(num_nodes)])
    heads = np.concatenate(
        [num_buckets + m, np.full(num_buckets, hub), num_buckets + np.arange(num_nodes), np.full(num_nodes, sink)]
    )
    caps = np.concatenate([np.ones(b.size + num_buckets), np.full(2 * num_nodes, dpn)]).astype(np.int64)
    costs = np.concatenate([-w, np.zeros(num_buckets + 2 * num_nodes, dtype=np.int64)]).astype(np.int64)
    flow = min_cost_flow.SimpleMinCostFlow()
    arcs = flow.add_arcs_with_capacity_and_unit_cost(tails, heads, caps, costs)
    supplies = np.zeros(sink + 1, dtype=np.int64)
    supplies[:num_buckets] = 1
    supplies[sink] = -num_buckets
    flow.set_nodes_supplies(np.arange(sink + 1), supplies)
    status = flow.solve()
    if status != flow.OPTIMAL:
        raise InfeasibleError(f"paper: bucket-to-node flow failed with status {status}")
    f = flow.flows(arcs)
    node = np.full(num_buckets, -1, dtype=np.int64)
    direct = f[: b.size] > 0
    node[b[direct]] = m[direct]
    via_hub = np.flatnonzero(node < 0)
    # buckets through the hub fill the nodes' remaining places in node order
    hub_flow = f[b.size + num_buckets : b.size + num_buckets + num_nodes]
    node[via_hub] = np.repeat(np.arange(num_nodes), hub_flow)[: via_hub.size]
    return node


def runs_to_nodes_greedy(bucket: IntArray, ph: PhaseArrays) -> IntArray:
    """Without OR-Tools: buckets by their best node's bytes, each to that node while it has places."""
    num_buckets = int(bucket.max(initial=-1)) + 1
    b, m, w = _bucket_node_bytes(bucket, ph, num_buckets)
    node = np.full(num_buckets, -1, dtype=np.int64)
    places = np.full(ph.num_nodes, ph.dp_per_node)
    for k in np.lexsort((b, -w)).tolist():
        if node[b[k]] < 0 and places[m[k]] > 0:
            node[b[k]] = m[k]
            places[m[k]] -= 1
    free = np.repeat(np.arange(ph.num_nodes), places)
    node[node < 0] = free[: int((node < 0).sum())]
    return node


def buckets_to_ranks(bucket: IntArray, bucket_node: IntArray, ph: PhaseArrays) -> IntArray:
    """Inside each node, an exact assignment of its buckets to its ranks maximising bytes left on their rank."""
    from ortools.graph.python import linear_sum_assignment

    dpn = ph.dp_per_node
    num_buckets = bucket_node.size
    s_node = bucket_node[bucket]
    same = ph.origin // dpn == s_node
    key = bucket * dpn + ph.origin % dpn
    stay = np.bincount(key[same], weights=ph.bytes[same], minlength=num_buckets * dpn).reshape(num_buckets, dpn)
    rank_of_bucket = np.zeros(num_buckets, dtype=np.int64)
    order = np.lexsort((np.arange(num_buckets), bucket_node))
    starts = np.searchsorted(bucket_node[order], np.arange(ph.num_nodes + 1))
    top = int(stay.max(initial=0.0))
    for node in range(ph.num_nodes):
        mine = order[starts[node] : starts[node + 1]]
        if mine.size == 0:
            continue
        solver = linear_sum_assignment.SimpleLinearSumAssignment()
        left = np.repeat(np.arange(dpn), dpn)
        right = np.tile(np.arange(dpn), dpn)
        weight = np.zeros((dpn, dpn), dtype=np.int64)
        weight[: mine.size] = stay[mine].astype(np.int64)
        solver.add_arcs_with_cost(left, right, (top - weight).reshape(-1))
        if solver.solve() != solver.OPTIMAL:
            raise InfeasibleError("paper: rank assignment failed")
        for k, bk in enumerate(mine.tolist()):
            rank_of_bucket[bk] = node * dpn + solver.right_mate(k)
    return rank_of_bucket[bucket]


def paper(ph: PhaseArrays) -> IntArray:
    if ph.n == 0:
        return ph.origin.copy()
    if ph.spec.padded:
        bucket = padded_runs(ph.costs, ph.lengths, ph.num_ranks, ph.spec.max_tokens)
    else:
        bucket = lpt(ph.costs, ph.num_ranks, ph.lengths, ph.spec.max_tokens)
    num_buckets = int(bucket.max()) + 1
    node = buckets_to_nodes(bucket, ph, num_buckets)
    return buckets_to_ranks(bucket, node, ph)
