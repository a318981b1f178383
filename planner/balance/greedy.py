"""Topology-blind balancers over sample costs: LPT, LPT by rounds, and local searches.

Each returns, for every sample, the rank (bucket) it runs on. They are the references the
topology-first dispatcher is measured against (bench/bench_balance.py) and its building blocks.
Ties break by sample index (stable sorts), so the same input gives the same answer.
"""

from __future__ import annotations

import heapq

import numpy as np

from orch.planner.balance.cost import FloatArray, IntArray
from orch.planner.errors import InfeasibleError


def descending(costs: FloatArray) -> IntArray:
    """Sample indices by cost, largest first, ties by index."""
    return np.argsort(-costs, kind="stable").astype(np.int64)


def lpt(
    costs: FloatArray,
    num_ranks: int,
    lengths: IntArray | None = None,
    cap: int | None = None,
    order: IntArray | None = None,
) -> IntArray:
    """Largest processing time first: each sample, largest first, to the least loaded rank.

    With a token cap, to the least loaded rank that still has room. A Python heap over ranks:
    exact LPT, under 1 µs per sample, so the reference rather than the fast path. `order`: the
    samples largest first, ties by index (descending(costs)), when the caller has it already.
    """
    order = descending(costs) if order is None else order
    if cap is None or lengths is None:
        return _lpt_uncapped(costs, num_ranks, order)
    cost_list = costs.tolist()
    heap = [(0.0, r) for r in range(num_ranks)]
    dest = np.zeros(costs.size, dtype=np.int64)
    tokens = [0] * num_ranks
    lens = lengths.tolist()
    for i in order.tolist():
        c = cost_list[i]
        skipped = []
        while heap:
            load, r = heapq.heappop(heap)
            if tokens[r] + lens[i] <= cap:
                break
            skipped.append((load, r))
        else:
            raise InfeasibleError(f"lpt: no rank has room for a sample of {lens[i]} tokens under max_tokens {cap}")
        tokens[r] += lens[i]
        heapq.heappush(heap, (load + c, r))
        for item in skipped:
            heapq.heappush(heap, item)
        dest[i] = r
    return dest


_BLOCK = 64  # equal-cost runs at least this long are placed by one vectorised water-fill


def _lpt_uncapped(costs: FloatArray, num_ranks: int, order: IntArray) -> IntArray:
    """Exact LPT without a token cap; runs of equal costs (fixed-size images, clipped clips) in one step.

    For b samples of equal cost c > 0, the heap would hand them out in the order of the pairs
    (L_r + j·c, r), smallest first, with L_r + j·c summed one c at a time: a row-wise cumsum gives
    exactly those floats, and the b smallest pairs in (value, rank) order are the heap's b pops.
    Other samples go through the heap one at a time, so the result is the heap's, sample for sample.
    """
    n = costs.size
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    sorted_costs = costs[order]
    starts = np.flatnonzero(np.concatenate([[True], sorted_costs[1:] != sorted_costs[:-1], [True]]))
    loads = np.zeros(num_ranks)
    heap: list[tuple[float, int]] | None = [(0.0, r) for r in range(num_ranks)]
    cost_list = sorted_costs.tolist()
    order_list = order.tolist()
    replace = heapq.heapreplace
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        c = cost_list[a]
        size = b - a
        cols = 0
        if size >= _BLOCK and c > 0:
            if heap is not None:
                for load, r in heap:
                    loads[r] = load
                heap = None
            # a rank takes at most this many: it starts within (max - min) of the least loaded
            cols = size // num_ranks + int((loads.max() - loads.min()) // c) + 2
        if cols and cols * num_ranks <= 8 * size + 4 * num_ranks:
            steps = np.full((num_ranks, cols + 1), c)
            steps[:, 0] = loads
            vals = np.cumsum(steps, axis=1)  # vals[r, j]: the load rank r offers its (j + 1)-th sample at
            offer = vals[:, :cols].ravel()
            rank = np.repeat(np.arange(num_ranks), cols)
            pick = np.lexsort((rank, offer))[:size]
            out[order[a:b]] = rank[pick]
            taken = np.bincount(rank[pick], minlength=num_ranks)
            loads = vals[np.arange(num_ranks), taken]
            continue
        if heap is None:
            heap = sorted(zip(loads.tolist(), range(num_ranks), strict=True))
        for k in range(a, b):
            load, r = heap[0]
            replace(heap, (load + c, r))
            out[order_list[k]] = r
    return out


def lpt_rounds(costs: FloatArray, num_ranks: int) -> IntArray:
    """LPT in rounds of N samples, vectorised: the k-th largest of a round goes to the k-th least loaded rank.

    Within a round every rank receives one sample, so this is LPT whenever the round's samples do
    not reorder the ranks mid-round; close to it otherwise, at numpy speed.
    """
    order = descending(costs)
    dest = np.empty(costs.size, dtype=np.int64)
    loads = np.zeros(num_ranks)
    for start in range(0, order.size, num_ranks):
        chunk = order[start : start + num_ranks]
        ranks = np.argsort(loads, kind="stable")[: chunk.size]
        dest[chunk] = ranks
        loads[ranks] += costs[chunk]
    return dest


def move_sample(
    dest: IntArray,
    loads: FloatArray,
    tokens: IntArray | None,
    costs: FloatArray,
    lengths: IntArray | None,
    sample: int,
    src: int,
    dst: int,
) -> None:
    """Move one sample from rank `src` to `dst` in place: its destination, the loads and the token counts."""
    dest[sample] = dst
    loads[src] -= costs[sample]
    loads[dst] += costs[sample]
    if tokens is not None and lengths is not None:
        tokens[src] -= lengths[sample]
        tokens[dst] += lengths[sample]


def improve(
    costs: FloatArray,
    dest: IntArray,
    num_ranks: int,
    dp_per_node: int,
    target: float,
    lengths: IntArray | None = None,
    cap: int | None = None,
    max_iters: int = 200,
) -> IntArray:
    """Lower the max rank cost by moves and swaps out of the max rank, until it is at most `target`.

    A move goes to the least loaded rank of the same node when that is as good as the least loaded
    rank anywhere (bytes stay inside the node); a swap pairs a sample of the max rank with a smaller
    one of one of the 8 least loaded ranks. Stops when no single move or swap lowers the max.
    """
    dest = dest.copy()
    loads = np.bincount(dest, weights=costs, minlength=num_ranks).astype(np.float64)
    tokens = (
        np.bincount(dest, weights=lengths, minlength=num_ranks).astype(np.int64)
        if lengths is not None and cap is not None
        else None
    )
    eps = 1e-9 * max(float(loads.max(initial=0.0)), 1.0)
    if float(loads.max(initial=0.0)) <= target + eps:
        return dest
    members = _RankMembers(dest, num_ranks)
    for _ in range(max_iters):
        top = int(np.argmax(loads))
        peak = float(loads[top])
        if peak <= target + eps:
            break
        mine = members.of(top)
        c = costs[mine]
        best: tuple[float, int, int, int] | None = None  # (new pair max, sample, to rank, swapped sample or -1)
        node = top // dp_per_node
        local = node * dp_per_node + int(np.argmin(loads[node * dp_per_node : (node + 1) * dp_per_node]))
        far = int(np.argmin(loads))
        for t in (local, far):
            if t == top:
                continue
            pair = np.maximum(loads[t] + c, peak - c)
            if tokens is not None and lengths is not None and cap is not None:
                pair = np.where(tokens[t] + lengths[mine] <= cap, pair, np.inf)
            k = int(np.argmin(pair))
            # the node-local rank wins ties: it is tried first and only a strictly better far move replaces it
            if pair[k] < peak - eps and (best is None or pair[k] < best[0] - eps):
                best = (float(pair[k]), int(mine[k]), t, -1)
        if best is None or best[0] > target + eps:
            for t in np.argsort(loads, kind="stable")[:8].tolist():
                if t == top:
                    continue
                theirs = members.of(t)
                if theirs.size == 0:
                    continue
                delta = c[:, None] - costs[theirs][None, :]
                pair = np.maximum(peak - delta, loads[t] + delta)
                pair = np.where(delta > 0, pair, np.inf)
                if tokens is not None and lengths is not None and cap is not None:
                    dtok = lengths[mine][:, None] - lengths[theirs][None, :]
                    pair = np.where((tokens[t] + dtok <= cap) & (tokens[top] - dtok <= cap), pair, np.inf)
                flat = int(np.argmin(pair))
                i, j = divmod(flat, theirs.size)
                if pair[i, j] < peak - eps and (best is None or pair[i, j] < best[0] - eps):
                    best = (float(pair[i, j]), int(mine[i]), t, int(theirs[j]))
        if best is None:
            break
        _, s, t, u = best
        move_sample(dest, loads, tokens, costs, lengths, s, top, t)
        members.move(s, top, t)
        if u >= 0:  # a swap: the partner comes back
            move_sample(dest, loads, tokens, costs, lengths, u, t, top)
            members.move(u, t, top)
    return dest


class _RankMembers:
    """The samples of each rank in index order, as np.flatnonzero(dest == rank) gives them, from one
    stable sort of dest and kept as samples move: a local search's step reads a few ranks, not all of dest."""

    def __init__(self, dest: IntArray, num_ranks: int) -> None:
        self._order = np.argsort(dest, kind="stable")
        self._bounds = np.searchsorted(dest[self._order], np.arange(num_ranks + 1))
        self._moved: dict[int, IntArray] = {}  # ranks whose members changed since the sort

    def of(self, rank: int) -> IntArray:
        got = self._moved.get(rank)
        if got is None:
            return self._order[self._bounds[rank] : self._bounds[rank + 1]]
        return got

    def move(self, sample: int, src: int, dst: int) -> None:
        a = self.of(src)
        self._moved[src] = a[a != sample]
        b = self.of(dst)
        self._moved[dst] = np.insert(b, int(np.searchsorted(b, sample)), sample)


def _cheapest_subset(lengths: IntArray, costs: FloatArray, lo: int, hi: int) -> tuple[float, IntArray] | None:
    """The subset of items with total length in [lo, hi] of least total cost (0/1 knapsack over
    lengths), as (cost, indices); None when no subset reaches lo within hi."""
    if hi < lo or hi < 0:
        return None
    best = np.full(hi + 1, np.inf)
    best[0] = 0.0
    took = np.zeros((lengths.size, hi + 1), dtype=bool)
    for i, (n, c) in enumerate(zip(lengths.tolist(), costs.tolist(), strict=True)):
        if n > hi:
            continue
        shifted = np.full(hi + 1, np.inf)
        shifted[n:] = best[: hi + 1 - n] + c
        took[i] = shifted < best
        best = np.minimum(best, shifted)
    w = lo + int(np.argmin(best[lo:]))
    if not np.isfinite(best[w]):
        return None
    cost, chosen = float(best[w]), []
    for i in range(lengths.size - 1, -1, -1):  # walk the choices back from the last item
        if took[i, w]:
            chosen.append(i)
            w -= int(lengths[i])
    return cost, np.asarray(chosen[::-1], dtype=np.int64)


def exchange_under_cap(
    costs: FloatArray,
    lengths: IntArray,
    dest: IntArray,
    num_ranks: int,
    cap: int,
    max_iters: int = 64,
) -> IntArray:
    """Lower the max rank cost under a tight token cap by one-for-several exchanges.

    When every rank is near `cap` tokens, neither a move nor a one-for-one swap fits (a swap that
    lowers the max rank's cost hands it a shorter sample, freeing tokens only on a rank that has
    none to spare). What fits: one long sample of the max rank against several shorter ones of
    another rank with about as many tokens, cheaper together when cost grows faster than length
    (attention). Per round, for each sample of the max rank and each of the 8 least loaded ranks,
    the cheapest set of that rank's samples whose tokens make the exchange fit on both ranks
    (`_cheapest_subset`); the exchange that lowers the pair's max most is applied. Every rank
    stays under `cap` throughout.
    """
    dest = dest.copy()
    loads = np.bincount(dest, weights=costs, minlength=num_ranks).astype(np.float64)
    tokens = np.bincount(dest, weights=lengths, minlength=num_ranks).astype(np.int64)
    eps = 1e-9 * max(float(loads.max(initial=0.0)), 1.0)
    for _ in range(max_iters):
        top = int(np.argmax(loads))
        peak = float(loads[top])
        best: tuple[float, int, int, IntArray] | None = None  # (new pair max, sample, rank, taken back)
        mine = np.flatnonzero(dest == top)
        mine = mine[np.argsort(-costs[mine], kind="stable")].tolist()
        for t in np.argsort(loads, kind="stable")[:9].tolist():
            if t == top:
                continue
            theirs = np.flatnonzero(dest == t)
            for s in mine:
                lo = int(tokens[t] + lengths[s] - cap)  # t gives back at least this for s to fit
                hi = int(cap - tokens[top] + lengths[s])  # and top takes at most this
                if lo <= 0:
                    continue  # a plain move fits: greedy.improve's job
                found = _cheapest_subset(lengths[theirs], costs[theirs], lo, hi)
                if found is None:
                    continue
                delta = float(costs[s]) - found[0]
                pair = max(peak - delta, float(loads[t]) + delta)
                if delta > 0 and pair < peak - eps and (best is None or pair < best[0] - eps):
                    best = (pair, s, t, theirs[found[1]])
        if best is None:
            break
        _, s, t, back = best
        move_sample(dest, loads, tokens, costs, lengths, s, top, t)
        for u in back.tolist():
            move_sample(dest, loads, tokens, costs, lengths, u, t, top)
    return dest
