"""Multiway largest differencing (Karmarkar–Karp): a topology-blind reference for the dispatcher.

bench/bench_balance.py reports it beside LPT and the dispatcher's modes; no mode uses it. Ties
break by sample index (stable sorts), so the same input gives the same answer.
"""

from __future__ import annotations

import heapq

import numpy as np

from orch.planner.balance.cost import FloatArray, IntArray


def karmarkar_karp(costs: FloatArray, num_ranks: int) -> IntArray:
    """Multiway largest differencing (Karmarkar–Karp): merge the two partitions of largest spread.

    A partition is kept sparse, as its non-empty subsets sorted by sum; merging pairs the largest
    subsets of one with the smallest of the other. Subset membership is a union-find over samples.
    O(n·N) in the worst case: a reference for the benchmark, not the fast path.
    """
    n = costs.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    parent = np.arange(n, dtype=np.int64)
    sums: dict[int, FloatArray] = {}
    reps: dict[int, IntArray] = {}
    heap: list[tuple[float, int]] = []
    for i in range(n):
        sums[i] = np.array([costs[i]])
        reps[i] = np.array([i], dtype=np.int64)
        spread = float(costs[i]) if num_ranks > 1 else 0.0
        heap.append((-spread, i))
    heapq.heapify(heap)
    next_id = n
    while len(heap) > 1:
        _, a = heapq.heappop(heap)
        _, b = heapq.heappop(heap)
        sa, ra, sb, rb = sums.pop(a), reps.pop(a), sums.pop(b), reps.pop(b)
        if sa.size + sb.size <= num_ranks:
            s = np.concatenate([sa, sb])
            r = np.concatenate([ra, rb])
        else:
            # a's subsets descending against b's ascending; missing subsets are empty (sum 0)
            pad_a = num_ranks - sa.size
            pad_b = num_ranks - sb.size
            s = np.concatenate([sa, np.zeros(pad_a)]) + np.concatenate([np.zeros(pad_b), sb[::-1]])
            ra_full = np.concatenate([ra, np.full(pad_a, -1, dtype=np.int64)])
            rb_full = np.concatenate([np.full(pad_b, -1, dtype=np.int64), rb[::-1]])
            both = (ra_full >= 0) & (rb_full >= 0)
            parent[rb_full[both]] = ra_full[both]
            r = np.where(ra_full >= 0, ra_full, rb_full)
        order = np.argsort(-s, kind="stable")
        s, r = s[order], r[order]
        spread = float(s[0] - (s[-1] if s.size == num_ranks else 0.0))
        sums[next_id], reps[next_id] = s, r
        heapq.heappush(heap, (-spread, next_id))
        next_id += 1
    (last,) = reps.values()
    while True:
        up = parent[parent]
        if np.array_equal(up, parent):
            break
        parent = up
    bucket_of_rep = np.full(n, -1, dtype=np.int64)
    bucket_of_rep[last] = np.arange(last.size)
    return bucket_of_rep[parent]
