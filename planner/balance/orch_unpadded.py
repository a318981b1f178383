"""`--mode orch` on an unpadded phase (rank cost = the sum of its samples' costs): reach the
balanced max cost, moving as few bytes as possible.

The cost cap comes first (C = lower bound × (1 + SLACK)) and samples stay where they are unless
they must go:

1. nodes: a node over R × (mean + half the way to C) gives up its smallest sample that covers the
   excess (else its largest until one does); only these leave the node, to nodes with room;
2. ranks: each rank keeps its largest samples while they fit under C; the rest, with what the
   node imported, are packed best-fit-decreasing into the node's ranks (own rank first); a sample
   no rank has room for displaces smaller ones, which re-pack;
3. what a node still cannot absorb goes to any rank with room, then the roomiest rank;
4. ranks the packing left just over C (many similar small samples, where the mean sets the bound:
   image-caption batches) get one move or swap each, inside their node first, all nodes at once,
   then with the batch's other ranks (settle_over: all or nothing); a local search
   (greedy.improve) then lowers the max rank if one is still over, preferring its own node.
If C is out of reach (coarse batches), the best global heuristic sets it: M = the better of what
was reached and LPT; the first pass stands if it is within M × (1 + SLACK), else a second pass
runs against M × (1 + SLACK), so nodes keep their samples up to that cap (R × the cap per node).
If a few ranks stay over, `repair` moves or swaps samples of the max rank with any rank that has
room, fewest inter-node bytes first, until every rank is under it.
If that falls short too, LPT's own buckets (placed topology-aware) are the fallback: the max is
never above LPT's × (1 + SLACK).

One sort per phase (largest first) feeds every later ordering: a bin-then-size order is that order
regrouped by a stable radix sort of the bins (or one argsort of unique int64 keys). Python loops run
over rounds, nodes or a few leftovers, never once per sample (except exact LPT, the reference when
the bound is out of reach).
"""

from __future__ import annotations

import heapq

import numpy as np

from orch.planner.balance.cost import FloatArray, IntArray, PhaseArrays, lower_bound
from orch.planner.balance.greedy import descending, improve, lpt, lpt_rounds, move_sample
from orch.planner.balance.padded import desc_order
from orch.planner.balance.topology import SLACK, match_runs_to_ranks, segment_first, segment_last
from orch.planner.errors import InfeasibleError

EXACT_LPT_SAMPLES = 1 << 20  # exact LPT as the fallback reference up to here (about 1 µs a sample)
_MAX_ROUNDS = 64
_REPAIR_ITERS = 4096
_INT16_MAX = int(np.iinfo(np.int16).max)  # keys up to here sort by numpy's stable radix sort


def _by_bin(pos: IntArray, home: IntArray, largest: IntArray | None = None) -> IntArray:
    """Indices of the samples with home >= 0, by bin, largest first inside a bin, ties by index.

    pos[i]: sample i's place in the phase's largest-first order (computed once per phase); with
    that order itself (largest), a stable radix sort of the bins (16-bit) regroups it: linear time.
    Else one argsort of unique int64 keys.
    """
    if largest is not None and home.size and int(home.max()) <= np.iinfo(np.int16).max:
        idx = largest[home[largest] >= 0]
        return idx[np.argsort(home[idx].astype(np.int16), kind="stable")]
    idx = np.flatnonzero(home >= 0)
    return idx[np.argsort(home[idx] * max(pos.size, 1) + pos[idx])]


def _largest_first(pos: IntArray, items: IntArray) -> IntArray:
    return items[np.argsort(pos[items])]


def _evict(
    costs: FloatArray,
    lengths: IntArray,
    home: IntArray,
    num_bins: int,
    cap: float,
    max_tokens: float,
    evictable: np.ndarray,
    pos: IntArray,
    largest: IntArray | None = None,
) -> np.ndarray:
    """Mask of samples that stay in their bin (rank or node) so that every bin is at most cap where it can be.

    A bin over cap gives up the smallest sample that alone brings it under cap; a bin no single
    sample covers gives up its largest samples while its excess stays positive, then repeats.
    Samples with home < 0 are not in any bin.
    """
    order = _by_bin(pos, home, largest)  # by bin, largest first
    s_bin, s_cost = home[order], costs[order]
    capped = bool(np.isfinite(max_tokens))  # else no bin is ever over its tokens: they are not counted
    s_len = lengths[order] if capped else None
    s_evictable = evictable[order]
    kept = np.ones(order.size, dtype=bool)
    loads = np.bincount(s_bin, weights=s_cost, minlength=num_bins)
    tokens = np.bincount(s_bin, weights=s_len, minlength=num_bins) if s_len is not None else None
    tol = 1e-9 * max(cap, 1.0)
    for _ in range(_MAX_ROUNDS):
        over = loads - cap
        bad = over > tol
        if tokens is not None:
            tover = tokens - max_tokens
            bad |= tover > 0
        cand = kept & s_evictable & bad[s_bin]
        if not cand.any():
            break
        at = np.flatnonzero(cand)
        r = s_bin[at]
        covers = s_cost[at] >= over[r] - tol
        if tokens is not None and s_len is not None:
            covers &= s_len[at] >= tover[r]
        # smallest covering sample per bin: the last covering one (segments are largest first)
        cpos = at[covers]
        last = cpos[segment_last(s_bin[cpos])]
        covered = np.zeros(num_bins, dtype=bool)
        covered[s_bin[last]] = True
        rest = at[~covered[r]]
        rr = s_bin[rest]
        first = segment_first(rr)
        seg_start = np.repeat(first, np.diff(np.append(first, rest.size)))
        csum = np.cumsum(s_cost[rest])
        in_seg = csum - (csum[seg_start] - s_cost[rest[seg_start]])
        take = rest[in_seg < over[rr] - tol]  # the first always qualifies: it does not cover
        out = np.concatenate([last, take])
        kept[out] = False
        loads -= np.bincount(s_bin[out], weights=s_cost[out], minlength=num_bins)
        if tokens is not None and s_len is not None:
            tokens -= np.bincount(s_bin[out], weights=s_len[out], minlength=num_bins)
    mask = home >= 0
    mask[order] = kept
    return mask


def _keep_prefix(
    costs: FloatArray, lengths: IntArray, home: IntArray, cap: float, max_tokens: float, pos: IntArray,
    largest: IntArray | None = None,
) -> np.ndarray:  # fmt: skip
    """Mask of samples kept in their bin: per bin, its largest samples while they fit under cap.

    The samples given up are a bin's smallest: they fit the rooms other ranks have left. The
    largest sample of a bin always stays (no rank could take more than it alone).
    """
    n = costs.size
    order = _by_bin(pos, home, largest)
    s_bin = home[order]
    first = segment_first(s_bin)
    seg_start = np.repeat(first, np.diff(np.append(first, order.size)))
    csum = np.cumsum(costs[order])
    in_seg = csum - (csum[seg_start] - costs[order[seg_start]])
    tol = 1e-9 * max(cap, 1.0)
    fits = in_seg <= cap + tol
    if np.isfinite(max_tokens):
        tsum = np.cumsum(lengths[order])
        fits &= tsum - (tsum[seg_start] - lengths[order[seg_start]]) <= max_tokens
    keep = fits | (np.arange(order.size) == seg_start)
    mask = np.zeros(n, dtype=bool)
    mask[order] = keep
    return mask


def _match(
    items: IntArray,
    pos: IntArray,
    costs: FloatArray,
    lengths: IntArray,
    room: FloatArray,
    token_room: FloatArray,
    dest: IntArray,
) -> IntArray:
    """Place items into bins with room: per round, the k-th largest item against the k-th roomiest bin,
    kept where it fits. Returns the items left unplaced (largest first)."""
    tol = 1e-9 * max(float(np.abs(room).max(initial=1.0)), 1.0)
    pending = _largest_first(pos, items)
    for _ in range(_MAX_ROUNDS):
        if pending.size == 0:
            break
        b = np.argsort(-room, kind="stable")[: pending.size]
        cand = pending[: b.size]
        fit = (costs[cand] <= room[b] + tol) & (lengths[cand] <= token_room[b])
        placed, to = cand[fit], b[fit]
        if placed.size == 0:
            break
        dest[placed] = to
        room[to] -= costs[placed]
        token_room[to] -= lengths[placed]
        keep = np.ones(pending.size, dtype=bool)
        keep[np.flatnonzero(fit)] = False
        pending = pending[keep]
    return pending


def _place_leftovers(
    items: IntArray, home_group: IntArray, group_size: int, costs: FloatArray, lengths: IntArray,
    room: FloatArray, token_room: FloatArray, dest: IntArray,
) -> None:  # fmt: skip
    """Largest first to the roomiest bin of its group if that is as roomy as needed, else the roomiest anywhere.

    Without a token limit (every token room infinite), Python floats and a heap of the rooms
    (stale entries dropped as they surface) give the same choices as the argmax over all bins,
    first index on ties, in O(log bins) per sample.
    """
    order = items[np.argsort(-costs[items], kind="stable")]
    if order.size == 0:
        return
    if np.isinf(token_room).all() and (token_room > 0).all():
        _place_leftovers_uncapped(order, home_group, group_size, costs, room, dest)
        return
    for i in order.tolist():
        ok = lengths[i] <= token_room
        if not ok.any():
            raise InfeasibleError(f"no rank has room for a sample of {lengths[i]} tokens under max_tokens")
        g = int(home_group[i])
        lo, hi = g * group_size, (g + 1) * group_size
        local = lo + int(np.argmax(np.where(ok[lo:hi], room[lo:hi], -np.inf)))
        best = int(np.argmax(np.where(ok, room, -np.inf)))
        t = local if ok[local] and room[local] >= min(costs[i], room[best]) else best
        dest[i] = t
        room[t] -= costs[i]
        token_room[t] -= lengths[i]


def _place_leftovers_uncapped(
    order: IntArray, home_group: IntArray, group_size: int, costs: FloatArray, room: FloatArray, dest: IntArray
) -> None:
    rooms = room.tolist()
    heap = [(-v, r) for r, v in enumerate(rooms)]  # the roomiest first, the lowest index on ties
    heapq.heapify(heap)
    cost_of, group_of = costs[order].tolist(), home_group[order].tolist()
    to = []
    for c, g in zip(cost_of, group_of, strict=True):
        lo = g * group_size
        seg = rooms[lo : lo + group_size]
        top = max(seg)
        local = lo + seg.index(top)
        while -heap[0][0] != rooms[heap[0][1]]:  # a room that has changed since it was pushed
            heapq.heappop(heap)
        best = heap[0][1]
        t = local if top >= min(c, rooms[best]) else best
        rooms[t] -= c
        heapq.heappush(heap, (-rooms[t], t))
        to.append(t)
    dest[order] = to
    room[:] = rooms


def _best_fit_in_nodes(
    items: IntArray, node_of: IntArray, origin: IntArray, dpn: int, costs: FloatArray, lengths: IntArray,
    room: FloatArray, token_room: FloatArray, dest: IntArray, pos: IntArray, largest: IntArray | None = None,
) -> IntArray:  # fmt: skip
    """Best fit decreasing inside each node, all nodes at once: per round every node places its largest
    pending sample on its rank with the least room that still fits it. Returns the samples that fit nowhere
    (by round, then node).

    Nodes never share a rank, so they run side by side: nodes with the most samples first, round j
    works on the prefix of nodes with more than j, on their rooms copied into one (nodes, R) block,
    and every per-round input is a slice of arrays laid out round by round once.
    """
    if items.size == 0:
        return items
    n_items = items.size
    small = int(node_of[items].max()) <= _INT16_MAX and int(node_of[items].min()) >= 0
    if largest is not None and small:  # the phase's largest-first order, regrouped by node (radix)
        mask = np.zeros(pos.size, dtype=bool)
        mask[items] = True
        p = largest[mask[largest]]
        p = p[np.argsort(node_of[p].astype(np.int16), kind="stable")]
    else:
        p = items[np.argsort(node_of[items] * max(pos.size, 1) + pos[items])]
    g = node_of[p]
    first = segment_first(g)
    count = np.diff(np.append(first, n_items))
    by_count = np.argsort(-count, kind="stable")  # nodes with the most samples first: active ones are a prefix
    nodes, count = g[first][by_count], count[by_count]
    rank_of_node = np.empty(by_count.size, dtype=np.int64)
    rank_of_node[by_count] = np.arange(by_count.size)
    sizes = np.diff(np.append(first, n_items))
    within = np.arange(n_items) - np.repeat(first, sizes)
    node_rank = np.repeat(rank_of_node, sizes)
    # round-major layout: round j holds the j-th largest item of each of its active nodes, in prefix order
    if int(count[0]) <= _INT16_MAX and by_count.size <= _INT16_MAX:  # two stable radix passes
        o = np.argsort(node_rank.astype(np.int16), kind="stable")
        seq = p[o[np.argsort(within[o].astype(np.int16), kind="stable")]]
    else:
        seq = p[np.argsort(within * by_count.size + node_rank)]
    active = np.searchsorted(-count, -np.arange(int(count[0])), side="left")  # per round j: nodes with > j items
    offsets = np.concatenate([[0], np.cumsum(active)])
    tol = 1e-9 * max(float(np.abs(room).max(initial=1.0)), 1.0)
    c_seq, l_seq = costs[seq], lengths[seq]
    c_tol = c_seq - tol
    gs = node_of[seq]
    # one-hot of each item's own rank inside the node it is packed in (none: a sample from another node)
    own = (origin[seq] // dpn == gs)[:, None] & ((origin[seq] % dpn)[:, None] == np.arange(dpn)[None, :])
    block = room.reshape(-1, dpn)[nodes]  # (nodes, R), prefix order
    tblock = token_room.reshape(-1, dpn)[nodes]
    capped = bool(np.isfinite(tblock).any())
    flat, tflat = block.reshape(-1), tblock.reshape(-1)
    rank_seq = np.full(n_items, -1, dtype=np.int64)  # the rank inside its node each item gets, -1: none
    base = np.arange(by_count.size) * dpn
    for rnd in range(active.size):
        lo, a = int(offsets[rnd]), int(active[rnd])
        hi = lo + a
        r2 = block[:a]
        c = c_seq[lo:hi]
        fits = r2 >= c_tol[lo:hi, None]
        if capped:
            fits &= tblock[:a] >= l_seq[lo:hi, None]
        # its own rank first (-1: below any fit): a sample that fits back where it was does not move
        score = np.where(fits, np.where(own[lo:hi], -1.0, r2 - c[:, None]), np.inf)
        j = np.argmin(score, axis=1)
        ok = fits.any(axis=1)
        at = base[:a][ok] + j[ok]
        flat[at] -= c[ok]
        if capped:
            tflat[at] -= l_seq[lo:hi][ok]
        rank_seq[lo:hi][ok] = j[ok]
    room.reshape(-1, dpn)[nodes] = block
    token_room.reshape(-1, dpn)[nodes] = tblock
    placed = rank_seq >= 0
    dest[seq[placed]] = gs[placed] * dpn + rank_seq[placed]
    left = np.flatnonzero(~placed)
    if left.size == 0:
        return np.zeros(0, dtype=np.int64)
    # by round, then node (the order the samples are handed on in)
    rnd_of = np.searchsorted(offsets, left, side="right") - 1
    return seq[left[np.lexsort((gs[left], rnd_of))]]


def _rank_members(
    dest: IntArray, pos: IntArray, nodes: IntArray, dpn: int, num_ranks: int
) -> tuple[IntArray, IntArray]:
    """Samples on the ranks of `nodes`, by rank, smallest first, and where each rank's segment starts."""
    wanted = np.zeros(num_ranks // dpn, dtype=bool)
    wanted[nodes] = True
    idx = np.flatnonzero((dest >= 0) & wanted[np.maximum(dest, 0) // dpn])
    by_rank = idx[np.argsort(dest[idx] * max(pos.size, 1) - pos[idx])]
    return by_rank, np.searchsorted(dest[by_rank], np.arange(num_ranks + 1))


def _displace(
    items: IntArray, node_of: IntArray, dpn: int, costs: FloatArray, lengths: IntArray,
    room: FloatArray, token_room: FloatArray, dest: IntArray, pos: IntArray,
    members_of: tuple[IntArray, IntArray],
) -> IntArray:  # fmt: skip
    """Put each item on the roomiest rank of its node, giving up that rank's smallest samples until it fits.

    Returns the samples given up (each smaller than the item that took its place), to re-pack.
    Items that cannot fit even on an emptied rank are returned unplaced. A rank's members come from
    one sort of dest (members_of, _rank_members) before the first call: samples placed since are
    left out (fewer choices, never a wrong one), and samples no longer on the rank are skipped by
    checking that dest still names it.
    """
    if items.size == 0:
        return items
    by_rank, bounds = members_of
    # nodes never share a rank: per round every node places its largest pending item, all nodes at once
    o = np.argsort(node_of[items] * max(pos.size, 1) + pos[items])
    p, g = items[o], node_of[items][o]
    first = segment_first(g)
    ptr = first.copy()
    end = np.append(first[1:], p.size)
    room2 = room.reshape(-1, dpn)
    active = np.arange(first.size)
    bumped: list[IntArray] = []
    while active.size:
        it = p[ptr[active]]
        t = g[first[active]] * dpn + np.argmax(room2[g[first[active]]], axis=1)
        c_it, l_it = costs[it], lengths[it]
        size = bounds[t + 1] - bounds[t]
        seg = np.repeat(np.arange(active.size), size)
        offset = np.arange(seg.size) - np.repeat(np.cumsum(size) - size, size)
        mem = by_rank[np.repeat(bounds[t], size) + offset]
        ok = (dest[mem] == t[seg]) & (costs[mem] < c_it[seg]) & (mem != it[seg])
        mem, seg = mem[ok], seg[ok]
        starts = np.repeat(segment_first(seg), np.diff(np.append(segment_first(seg), seg.size)))
        cs = np.cumsum(costs[mem])
        ts = np.cumsum(lengths[mem])
        free = cs - (cs[starts] - costs[mem[starts]]) + room[t][seg] if mem.size else cs
        tfree = ts - (ts[starts] - lengths[mem[starts]]) + token_room[t][seg] if mem.size else ts
        need = (free >= c_it[seg]) & (tfree >= l_it[seg])
        fits_now = (room[t] >= c_it) & (token_room[t] >= l_it)
        k = np.full(active.size, -1, dtype=np.int64)  # members to give up: those before index k
        hit = np.flatnonzero(need)
        if hit.size:
            firsts = hit[segment_first(seg[hit])]
            k[seg[firsts]] = firsts - starts[firsts] + 1
        k[fits_now] = 0
        placed = k >= 0
        give_up = ((np.arange(seg.size) - starts) < k[seg]) & placed[seg]
        out, out_rank = mem[give_up], t[seg[give_up]]
        if out.size:
            dest[out] = -1
            np.add.at(room, out_rank, costs[out])
            np.add.at(token_room, out_rank, lengths[out])
            bumped.append(out)
        ip, tp = it[placed], t[placed]
        dest[ip] = tp
        room[tp] -= costs[ip]
        token_room[tp] -= lengths[ip]
        bumped.append(it[~placed])
        ptr[active] += 1
        active = active[ptr[active] < end[active]]
    return np.concatenate(bumped) if bumped else np.zeros(0, dtype=np.int64)


class _Exchanges:
    """Moves and one-for-one swaps that bring ranks over a target under it (settle_over, the batch step
    before greedy.improve). Keeps the loads and token counts as dest changes."""

    def __init__(self, ph: PhaseArrays, dest: IntArray, target: float, pos: IntArray) -> None:
        self.ph, self.dest, self.target = ph, dest, target
        n, num_ranks = ph.n, ph.num_ranks
        self.loads = np.bincount(dest, weights=ph.costs, minlength=num_ranks)
        self.tol = 1e-9 * max(target, 1.0)
        self.max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
        self.tokens = (
            np.bincount(dest, weights=ph.lengths, minlength=num_ranks) if ph.spec.max_tokens is not None else None
        )
        self.nbytes = ph.bytes.astype(np.float64)
        self.onode = ph.origin // ph.dp_per_node
        self.asc = (n - 1) - pos  # place in the smallest-first order (cost is non-decreasing in length)
        self.smallest = np.empty(n, dtype=np.int64)
        self.smallest[self.asc] = np.arange(n)  # the samples, smallest first
        # search keys: rank r's costs lie in [r·span, r·span + max cost]
        self.span = 2.0 * float(ph.costs.max(initial=0.0)) + 4.0
        self.rank_dtype = np.int16 if num_ranks <= np.iinfo(np.int16).max else np.int64  # radix sorts by rank

    def over(self) -> FloatArray:
        return self.loads - self.target

    def _added(self, s: IntArray, src: IntArray, dst: IntArray) -> FloatArray:
        """4 × inter-node bytes + intra-node bytes that moving samples s from src to dst adds (negative: saves)."""
        dpn, origin = self.ph.dp_per_node, self.ph.origin
        on, ns, nd = self.onode[s], src // dpn, dst // dpn
        inter = (on != nd).astype(np.float64) - (on != ns)
        intra = ((on == nd) & (origin[s] != dst)).astype(np.float64) - ((on == ns) & (origin[s] != src))
        return self.nbytes[s] * (4.0 * inter + intra)

    def _apply_best(self, group: IntArray, a: IntArray, b: IntArray, src: IntArray, t: IntArray) -> IntArray:
        """Per group, the best valid exchange (a from src to t, b from t to src; b < 0: a move), applied.

        Valid: excess of src <= δ = cost(a) - cost(b) <= room of t, max_tokens held on both. Best:
        fewest bytes added (inter-node 4×), then the lowest max of the pair after it, then the first.
        Groups come in order (non-decreasing) and must not share a rank. Returns the groups that got one.
        """
        costs, lengths, loads, tol = self.ph.costs, self.ph.lengths, self.loads, self.tol
        swap = b >= 0
        bb = np.maximum(b, 0)
        delta = costs[a] - np.where(swap, costs[bb], 0.0)
        valid = (delta >= loads[src] - self.target - tol) & (delta <= self.target - loads[t] + tol) & (t != src)
        if self.tokens is not None:
            dtok = lengths[a] - np.where(swap, lengths[bb], 0)
            valid &= (self.tokens[t] + dtok <= self.max_tokens) & (self.tokens[src] - dtok <= self.max_tokens)
        q = np.flatnonzero(valid)
        if q.size == 0:
            return q
        a, b, src, t, delta = a[q], b[q], src[q], t[q], delta[q]
        added = self._added(a, src, t) + np.where(b >= 0, self._added(np.maximum(b, 0), t, src), 0.0)
        return self._select(group[q], a, b, src, t, delta, added)

    def _select(
        self, group: IntArray, a: IntArray, b: IntArray, src: IntArray, t: IntArray, delta: FloatArray,
        added: FloatArray,
    ) -> IntArray:  # fmt: skip
        """Of valid exchanges in group order, per group the fewest bytes added, then the lowest max of the
        pair after it, then the first; applied to dest, the loads and the token counts. Returns the groups."""
        loads, lengths = self.loads, self.ph.lengths
        pair = np.maximum(loads[src] - delta, loads[t] + delta)
        starts = segment_first(group)
        seg = np.repeat(np.arange(starts.size), np.diff(np.append(starts, group.size)))
        best = added <= np.minimum.reduceat(added, starts)[seg]
        pair = np.where(best, pair, np.inf)
        best &= pair <= np.minimum.reduceat(pair, starts)[seg]
        q = np.flatnonzero(best)
        q = q[segment_first(group[q])]
        a, b, src, t, d = a[q], b[q], src[q], t[q], delta[q]
        swap = b >= 0
        self.dest[a] = t
        self.dest[b[swap]] = src[swap]
        loads[src] -= d
        loads[t] += d
        if self.tokens is not None:
            dt = lengths[a] - np.where(swap, lengths[np.maximum(b, 0)], 0)
            self.tokens[src] -= dt
            self.tokens[t] += dt
        return group[q]

    def round(self, r: IntArray, partners: IntArray) -> np.ndarray:
        """One exchange for each rank r[i] over target with one of partners[i] (-1: none), all at once.

        partners[i] are ranks of r[i]'s node, and hold no r[j] nor any partner of another i (disjoint
        rows: no conflicts). For every sample a of r[i] and partner t with room for the excess: a
        move, the b of t that transfers least (the largest with cost(b) <= cost(a) - excess) and
        the two b around the transfer that evens the pair (searches in t's sorted costs); kept as
        _apply_best keeps and picks. Returns which r[i] got one.
        """
        ph, dest, loads, tol = self.ph, self.dest, self.loads, self.tol
        costs, lengths, origin = ph.costs, ph.lengths, ph.origin
        e = loads[r] - self.target
        room = self.target - loads
        # the samples of the ranks involved, by rank, smallest first
        involved = np.zeros(ph.num_ranks, dtype=bool)
        involved[r] = True
        involved[partners[partners >= 0]] = True
        idx = self.smallest[involved[dest[self.smallest]]]
        idx = idx[np.argsort(dest[idx].astype(self.rank_dtype), kind="stable")]
        s_rank, s_cost = dest[idx], costs[idx]
        keys = s_rank * self.span + s_cost
        # pairs (i, partner t with room for the excess)
        pi, pk = np.nonzero((partners >= 0) & (room[np.maximum(partners, 0)] >= e[:, None] - tol))
        pt = partners[pi, pk]
        lo = np.searchsorted(s_rank, r)
        size = (np.searchsorted(s_rank, r, side="right") - lo)[pi]
        # queries: every sample a of r[i], against every such t (in order of i)
        q_pair = np.repeat(np.arange(pi.size), size)
        qi, qt = pi[q_pair], pt[q_pair]
        qa = idx[lo[qi] + np.arange(q_pair.size) - np.repeat(np.cumsum(size) - size, size)]
        ca, ri, qe, qroom = costs[qa], r[qi], e[qi], room[qt]
        even = np.clip(0.5 * (loads[ri] - loads[qt]), qe, qroom)
        k_least = np.searchsorted(keys, qt * self.span + np.maximum(ca - qe + tol, -1.0), side="right") - 1
        k_even = np.searchsorted(keys, qt * self.span + np.maximum(ca - even, -1.0), side="right") - 1
        # per query: a move (column 0), then the three swaps
        ks = np.stack([k_least, k_least, k_even, k_even + 1], axis=1)
        kc = np.minimum(np.maximum(ks, 0), idx.size - 1)
        has = (ks >= 0) & (ks < idx.size) & (s_rank[kc] == qt[:, None])
        has[:, 0] = False
        delta = ca[:, None] - np.where(has, s_cost[kc], 0.0)
        valid = (delta >= (qe - tol)[:, None]) & (delta <= (qroom + tol)[:, None]) & (has | (np.arange(4) == 0))
        b = np.where(has, idx[kc], -1)
        if self.tokens is not None:
            dtok = lengths[qa][:, None] - np.where(has, lengths[idx[kc]], 0)
            valid &= (self.tokens[qt][:, None] + dtok <= self.max_tokens) & (
                self.tokens[ri][:, None] - dtok <= self.max_tokens
            )
        v = np.flatnonzero(valid.ravel())
        out = np.zeros(r.size, dtype=bool)
        if v.size == 0:
            return out
        row = v // 4
        vb = b.ravel()[v]
        # bytes added inside a node: a sample leaving its own rank adds, one coming back saves
        nb = self.nbytes
        move_a = nb[qa] * ((origin[qa] == ri).astype(np.float64) - (origin[qa] == qt))
        bc = np.maximum(vb, 0)
        back_b = np.where(vb >= 0, nb[bc] * ((origin[bc] == qt[row]).astype(np.float64) - (origin[bc] == ri[row])), 0.0)
        got = self._select(qi[row], qa[row], vb, ri[row], qt[row], delta.ravel()[v], move_a[row] + back_b)
        out[got] = True
        return out

    def far(self, top: int, asc: IntArray, asc_costs: FloatArray) -> bool:
        """One exchange for rank `top` with any rank: a move of one of its samples a (to its own rank,
        the roomiest of its own node, or the roomiest anywhere), or a swap with a sample b of another
        rank among the _FAR_WINDOW with the largest cost <= cost(a) - excess (asc: samples by cost,
        asc_costs their costs); _apply_best picks. Returns whether one was made."""
        ph, dest, loads, tol = self.ph, self.dest, self.loads, self.tol
        dpn = ph.dp_per_node
        e = float(loads[top]) - self.target
        room = np.where(np.arange(ph.num_ranks) == top, -np.inf, self.target - loads)
        mine = np.flatnonzero(dest == top)
        ca = ph.costs[mine]
        # moves: its own rank, the roomiest rank of its own node, the roomiest rank
        home_node = self.onode[mine]
        best_local = home_node * dpn + np.argmax(room.reshape(-1, dpn)[home_node], axis=1)
        mt = np.concatenate([ph.origin[mine], best_local, np.full(mine.size, int(np.argmax(room)))])
        # swaps: per sample a, the closest-in-cost samples b that still cover the excess
        hi = np.searchsorted(asc_costs, ca - e + tol, side="right")
        lo = np.maximum(hi - _FAR_WINDOW, np.searchsorted(asc_costs, ca - float(room.max()) - tol, side="left"))
        size = np.maximum(hi - lo, 0)
        sa = np.repeat(mine, size)
        sb = asc[np.repeat(lo, size) + np.arange(sa.size) - np.repeat(np.cumsum(size) - size, size)]
        a = np.concatenate([np.tile(mine, 3), sa])
        b = np.concatenate([np.full(3 * mine.size, -1), sb])
        t = np.concatenate([mt, dest[sb]])
        got = self._apply_best(np.zeros(a.size, dtype=np.int64), a, b, np.full(a.size, top), t)
        return bool(got.size)


_FAR_WINDOW = 256  # swap partners a rank left over tries per sample, across the batch: the closest in cost


def settle_over(ph: PhaseArrays, dest: IntArray, target: float, pos: IntArray) -> None:
    """Bring ranks over `target` under it, one move or swap each, in place on dest.

    The packing leaves some ranks just over the cap when the last samples fit no room exactly (many
    similar small samples: the mean sets the bound, as in an image-caption mix). First inside
    nodes, all at once: per round every node exchanges between its most loaded rank over target
    and one of its ranks with room (_Exchanges.round); samples stay on their node, so no byte more
    crosses nodes. Then each rank still over, one at a time, against the batch's roomiest ranks,
    the exchange adding the fewest bytes (a sample that goes back to its node saves), kept only if
    every such rank gets one (else the batch is coarse: the passes after the first handle it). An
    exchange fixes its rank and puts no other rank over target, so no round undoes another. A rank
    none fixes is left to greedy.improve. Once more ranks than the far step takes have failed a
    round (they stay over: a rank over target is nobody's partner), the outcome is known: nothing
    changes, and the rounds stop there (a tie-heavy coarse batch otherwise ran them all for
    nothing). Respects max_tokens. Numpy over nodes; Python loops over rounds (at most R inside
    nodes) and the few ranks left.
    """
    if ph.n == 0:
        return
    if float(np.bincount(dest, weights=ph.costs, minlength=ph.num_ranks).max()) - target <= 1e-9 * max(target, 1.0):
        return  # no rank over
    ex = _Exchanges(ph, dest, target, pos)
    tol, dpn, num_ranks = ex.tol, ph.dp_per_node, ph.num_ranks
    kept = dest.copy()
    failed = np.zeros(num_ranks, dtype=bool)
    local = np.arange(dpn)
    for _ in range(_MAX_ROUNDS):  # inside nodes
        over = ex.over()
        bad = np.where((over > tol) & ~failed, over, -np.inf).reshape(-1, dpn)
        j = np.argmax(bad, axis=1)
        nodes = np.flatnonzero(bad[np.arange(bad.shape[0]), j] > -np.inf)
        if nodes.size == 0:
            break
        r = nodes * dpn + j[nodes]  # one rank over target per node
        partners = nodes[:, None] * dpn + local[None, :]
        partners[partners == r[:, None]] = -1
        got = ex.round(r, partners)
        failed[r[~got]] = True
        # a rank no round fixed keeps its load (it is over, so never a partner): it is still over
        # after the last round; more of them than the far step takes, and the outcome is known
        if int(np.count_nonzero(failed)) > _MAX_ROUNDS:
            dest[:] = kept
            return
    left = np.flatnonzero(ex.over() > tol)
    if left.size == 0:
        return
    if left.size <= _MAX_ROUNDS:
        asc_costs = ph.costs[ex.smallest]
        for top in left[np.argsort(-ex.loads[left], kind="stable")].tolist():
            if not ex.far(top, ex.smallest, asc_costs):
                break
        else:
            return
    dest[:] = kept  # all or nothing: a coarse batch is left as it was, to the passes after the first


def _token_room(max_tokens: float, bins: IntArray, lengths: IntArray, num_bins: int) -> FloatArray:
    """max_tokens less the tokens each bin holds; all infinite (nothing counted) without a token limit."""
    if not np.isfinite(max_tokens):
        return np.full(num_bins, max_tokens)
    return max_tokens - np.bincount(bins, weights=lengths, minlength=num_bins)


def _to_nodes(
    ph: PhaseArrays, node_cap: float, evictable: np.ndarray, pos: IntArray, largest: IntArray | None = None
) -> tuple[np.ndarray, IntArray]:
    """Node-level balance: only a node's excess over node_cap leaves it, to nodes with room.

    Returns (the samples that stay on their node, every sample's node).
    """
    dpn, num_nodes = ph.dp_per_node, ph.num_nodes
    costs, lengths = ph.costs, ph.lengths
    max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
    node = ph.origin // dpn
    at_home = _evict(costs, lengths, node, num_nodes, node_cap, dpn * max_tokens, evictable, pos, largest)
    node_of = node.copy()
    room_n = node_cap - np.bincount(node[at_home], weights=costs[at_home], minlength=num_nodes)
    troom_n = _token_room(dpn * max_tokens, node[at_home], lengths[at_home], num_nodes)
    out = np.flatnonzero(~at_home)
    left = _match(out, pos, costs, lengths, room_n, troom_n, node_of)
    _place_leftovers(left, np.zeros(ph.n, dtype=np.int64), num_nodes, costs, lengths, room_n, troom_n, node_of)
    return at_home, node_of


def _orch_at_cap(
    ph: PhaseArrays, cap: float, node_cap: float, pos: IntArray, target: float | None = None,
    largest: IntArray | None = None,
) -> IntArray:  # fmt: skip
    num_ranks, dpn = ph.num_ranks, ph.dp_per_node
    costs, lengths, origin = ph.costs, ph.lengths, ph.origin
    dest = origin.copy()
    max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
    loads0 = np.bincount(origin, weights=costs, minlength=num_ranks)
    # a sample that would not fit even on the emptiest rank stays home (it sets the bound)
    evictable = costs <= cap - loads0.min() + 1e-9 * cap

    # 1. nodes: only a node's excess over node_cap leaves it, to nodes with room
    at_home, node_of = _to_nodes(ph, node_cap, evictable, pos, largest)

    # 2. ranks inside each node: samples stay on their rank unless it is over the cap
    home = np.where(at_home, origin, -1)
    kept = _keep_prefix(costs, lengths, home, cap, max_tokens, pos, largest)
    room = cap - np.bincount(origin[kept], weights=costs[kept], minlength=num_ranks)
    token_room = _token_room(max_tokens, origin[kept], lengths[kept], num_ranks)
    items = np.flatnonzero(~kept)
    dest[items] = -1  # not on any rank until placed (rank membership below reads dest)
    left = _best_fit_in_nodes(items, node_of, origin, dpn, costs, lengths, room, token_room, dest, pos, largest)
    members_of = _rank_members(dest, pos, np.unique(node_of[left]), dpn, num_ranks) if left.size else None
    for _ in range(4):  # a sample no rank of its node has room for displaces smaller ones, which then re-pack
        if left.size == 0 or members_of is None:
            break
        bumped = _displace(left, node_of, dpn, costs, lengths, room, token_room, dest, pos, members_of)
        left = _best_fit_in_nodes(bumped, node_of, origin, dpn, costs, lengths, room, token_room, dest, pos, largest)
    # 3. what the node could not absorb goes to any rank with room
    left = _match(left, pos, costs, lengths, room, token_room, dest)
    _place_leftovers(left, node_of, dpn, costs, lengths, room, token_room, dest)
    # 4. ranks left over: one exchange each inside their node, then a local search on the max rank
    goal = cap if target is None else target
    settle_over(ph, dest, goal, pos)
    tokens = None if ph.spec.max_tokens is None else ph.spec.max_tokens
    return improve(costs, dest, num_ranks, dpn, goal, lengths=lengths, cap=tokens)


def repair(ph: PhaseArrays, dest: IntArray, target: float, max_iters: int = _REPAIR_ITERS) -> tuple[IntArray, bool]:
    """Bring every rank to at most `target` by moves and swaps out of the max rank, fewest bytes across nodes first.

    Unlike greedy.improve (which lowers the max rank against the few least loaded ranks and stops
    when no single step lowers the max), every step here must bring the max rank under the target
    on its own: a move of one of its samples to any rank with room for it, or a swap of one of its
    samples with a smaller one of any rank with room for the difference. Among those, the step that
    adds the fewest bytes wins, inter-node bytes weighing 4× intra-node ones (a sample that goes
    back to its node counts negative). Coarse batches, where a few big samples per rank leave rooms
    smaller than most samples, need the swaps. Returns (dest, whether every rank is under target).
    Respects max_tokens. Each step costs O(samples) numpy work: a repair pass, not the main path.
    """
    dest = dest.copy()
    num_ranks, dpn = ph.num_ranks, ph.dp_per_node
    costs, lengths, bytes_, origin = ph.costs, ph.lengths, ph.bytes.astype(np.float64), ph.origin
    onode = origin // dpn
    loads = np.bincount(dest, weights=costs, minlength=num_ranks)
    max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
    tokens = np.bincount(dest, weights=lengths, minlength=num_ranks)
    tol = 1e-9 * max(target, 1.0)
    by_cost = np.argsort(costs, kind="stable")
    sorted_costs = costs[by_cost]
    for _ in range(max_iters):
        top = int(np.argmax(loads))
        excess = float(loads[top]) - target
        if excess <= tol:
            return dest, True
        room = target - loads
        troom = max_tokens - tokens
        ntop = top // dpn
        mine = np.flatnonzero(dest == top)
        ca, la, ba, oa, ra = costs[mine], lengths[mine], bytes_[mine], onode[mine], origin[mine]
        away_a = ba * (oa != ntop)  # inter-node bytes sample a costs where it is now
        # (score, sample, to rank, swapped sample or -1); score = 4 × added inter bytes + added intra bytes
        best: tuple[float, int, int, int] | None = None
        # moves: a sample that alone covers the excess, to a rank with room for it: its own rank,
        # else the first of its node's, else the first anywhere
        for k in np.flatnonzero(ca >= excess - tol).tolist():
            ok = (room >= ca[k] - tol) & (troom >= la[k])
            ok[top] = False
            home_lo = int(oa[k]) * dpn
            if ok[ra[k]]:
                t, score = int(ra[k]), -4.0 * away_a[k]
            elif ok[home_lo : home_lo + dpn].any():
                t, score = home_lo + int(np.argmax(ok[home_lo : home_lo + dpn])), -4.0 * away_a[k] + ba[k]
            elif ok.any():
                t, score = int(np.argmax(ok)), 4.0 * (ba[k] - away_a[k])
            else:
                continue
            if best is None or score < best[0]:
                best = (float(score), int(mine[k]), t, -1)
        # swaps: a sample of the max rank for a smaller one whose rank has room for the difference:
        # its cost lies in [cost - most room, cost - excess], a window of the samples sorted by cost
        most_room = float(room.max())
        for k in range(mine.size):
            lo = int(np.searchsorted(sorted_costs, ca[k] - most_room - tol, side="left"))
            hi = int(np.searchsorted(sorted_costs, ca[k] - excess + tol, side="right"))
            if hi <= lo:
                continue
            others = by_cost[lo:hi]
            tb = dest[others]
            diff = ca[k] - costs[others]
            dtok = la[k] - lengths[others]
            ok = (
                (tb != top)
                & (diff >= excess - tol)
                & (diff <= room[tb] + tol)
                & (dtok <= troom[tb])
                & (-dtok <= troom[top])
            )
            if not ok.any():
                continue
            others, tb = others[ok], tb[ok]
            bb, ob, nb = bytes_[others], onode[others], tb // dpn
            a_cross = nb != oa[k]
            inter = ba[k] * a_cross - away_a[k] + bb * (ob != ntop) - bb * (ob != nb)
            intra = ba[k] * (~a_cross & (tb != ra[k])) + bb * ((ob == ntop) & (origin[others] != top))
            score = 4.0 * inter + intra
            j = int(np.argmin(score))
            if best is None or score[j] < best[0]:
                best = (float(score[j]), int(mine[k]), int(tb[j]), int(others[j]))
        if best is None:
            return dest, False
        _, a, t, b = best
        move_sample(dest, loads, tokens, costs, lengths, a, top, t)
        if b >= 0:  # a swap: the partner comes back
            move_sample(dest, loads, tokens, costs, lengths, b, t, top)
    return dest, bool(loads.max() <= target + tol)


def _max_cost(ph: PhaseArrays, dest: IntArray) -> float:
    return float(np.bincount(dest, weights=ph.costs, minlength=ph.num_ranks).max())


def orch_unpadded(ph: PhaseArrays, slack: float = SLACK) -> IntArray:
    """Cap = bound × (1 + slack); a node keeps up to R × (mean + half the way to the cap), so its ranks
    have room to pack what it keeps.

    When the bound is out of reach (few coarse samples per rank), the best global heuristic sets the
    cap instead: M = the better of what was reached and LPT (exact up to EXACT_LPT_SAMPLES samples, by
    rounds above). If the first pass reached M × (1 + slack), it stands. Else a second pass runs against
    M × (1 + slack), nodes keeping up to R × that cap, and its local search then tries to bring the
    max down to M; it is kept when its max is at most M × (1 + slack). Else `repair` brings its
    over-cap ranks under M × (1 + slack) by moves and swaps, fewest inter-node bytes first. Else the
    best of the passes and LPT's own buckets (placed on ranks topology-aware) is kept. Either way
    the max is at most LPT's × (1 + slack).
    """
    if ph.n == 0:
        return ph.origin.copy()
    lb = lower_bound(ph)
    mean = float(ph.costs.sum()) / ph.num_ranks
    dpn = ph.dp_per_node
    # cost is non-decreasing in length: one sort per phase (units of several items: by cost)
    largest = desc_order(ph.lengths) if ph.monotone else descending(ph.costs)
    pos = np.empty(ph.n, dtype=np.int64)
    pos[largest] = np.arange(ph.n)
    # the same order by cost, ties by index, when cost strictly increases with length
    by_cost = largest if (ph.spec.linear > 0 or ph.spec.quadratic > 0) or not ph.monotone else None
    cap = lb * (1 + slack)
    dest = _orch_at_cap(ph, cap, dpn * (mean + 0.5 * (cap - mean)), pos, largest=largest)
    reached = _max_cost(ph, dest)
    if reached <= cap * (1 + 1e-9):
        return dest
    tokens = ph.spec.max_tokens
    try:
        ref = lpt(ph.costs, ph.num_ranks, ph.lengths, tokens, order=by_cost) if ph.n <= EXACT_LPT_SAMPLES else None
    except InfeasibleError:
        ref = None
    if ref is None and tokens is None:
        ref = lpt_rounds(ph.costs, ph.num_ranks)
    ref_max = _max_cost(ph, ref) if ref is not None else np.inf
    target = min(reached, ref_max)
    loose = target * (1 + slack)
    if reached <= ref_max * (1 + slack) * (1 + 1e-9):
        # the first pass is within the slack of the best heuristic: the cap the second pass would
        # aim at (M × (1 + slack)), reached already (many equal sizes: a coarse batch the bound is
        # out of reach for, whose second pass only loosened nodes and landed higher)
        return dest
    again = _orch_at_cap(ph, loose, dpn * loose, pos, target=target, largest=largest)
    again_max = _max_cost(ph, again)
    if again_max <= loose * (1 + 1e-9):
        return again
    # coarse batches: the packing left a few ranks over; moves and swaps across the whole batch fix them
    fixed, ok = repair(ph, again, loose)
    if ok:
        return fixed
    candidates = [(reached, 1, dest), (again_max, 0, again), (_max_cost(ph, fixed), 0, fixed)]
    if ref is not None and min(c[0] for c in candidates) > ref_max * (1 + 1e-9):
        from orch.planner.balance.paper import runs_to_nodes_greedy

        candidates.append((ref_max, 2, match_runs_to_ranks(ref, runs_to_nodes_greedy(ref, ph), ph)))
    return min(candidates, key=lambda c: (c[0], c[1]))[2]
