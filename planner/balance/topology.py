"""Topology-first post-balancing (`--mode orch`): reach the balanced max cost, moving as few bytes as possible.

The paper balances first and then chooses which rank gets which balanced bucket; its buckets mix
samples from every node, so most bytes cross nodes whatever the assignment. Here the cost cap
comes first (C = lower bound × (1 + SLACK)) and samples stay where they are unless they must go:

1. nodes: a node over R × (mean + half the way to C) gives up its smallest sample that covers the
   excess (else its largest until one does); only these leave the node, to nodes with room;
2. ranks: each rank keeps its largest samples while they fit under C; the rest, with what the
   node imported, are packed best-fit-decreasing into the node's ranks (own rank first); a sample
   no rank has room for displaces smaller ones, which re-pack;
3. what a node still cannot absorb goes to any rank with room, then the roomiest rank;
4. a local search (greedy.improve) brings the max back to C, preferring ranks of the same node.
If C is out of reach (coarse batches), a second pass runs at the better of what was reached and
LPT, and LPT's own buckets (placed topology-aware) are the fallback: never worse than LPT.

Padded phases: the exact optimal runs of padded.py (the optimum is rigid: near-equal lengths
must share a run), each run on the node holding most of its bytes, then samples of equal or
shorter length trade places so that each takes a place on its own node when one is free. This
matches the paper's locality rather than beating it (bench/bench_balance.py). All steps are numpy
over samples; Python loops run over rounds, runs, a few leftovers, or (padded) once over samples.
"""

from __future__ import annotations

import numpy as np

from orch.planner.balance.cost import FloatArray, IntArray, PhaseArrays, lower_bound
from orch.planner.balance.greedy import improve, lpt, lpt_rounds
from orch.planner.balance.padded import optimal_cap, padded_runs, run_capacity
from orch.planner.errors import InfeasibleError

SLACK = 0.006  # target max cost = lower bound × (1 + SLACK): room that lets samples stay home
EXACT_LPT_SAMPLES = 1 << 20  # exact LPT as the fallback reference up to here (about 1 µs a sample)
_MAX_ROUNDS = 64


def _segment_first(keys: IntArray) -> IntArray:
    """Indices where a run of equal keys starts, for a sorted key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))


def _segment_last(keys: IntArray) -> IntArray:
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([keys[1:] != keys[:-1], [True]]))


def _evict(
    costs: FloatArray,
    lengths: IntArray,
    home: IntArray,
    num_bins: int,
    cap: float,
    max_tokens: float,
    evictable: np.ndarray,
) -> np.ndarray:
    """Mask of samples that stay in their bin (rank or node) so that every bin is at most cap where it can be.

    A bin over cap gives up the smallest sample that alone brings it under cap; a bin no single
    sample covers gives up its largest samples while its excess stays positive, then repeats.
    Samples with home < 0 are not in any bin.
    """
    n = costs.size
    order = np.lexsort((np.arange(n), -costs, home))  # by bin, largest first
    order = order[home[order] >= 0]
    s_bin, s_cost, s_len = home[order], costs[order], lengths[order]
    s_evictable = evictable[order]
    kept = np.ones(order.size, dtype=bool)
    loads = np.bincount(s_bin, weights=s_cost, minlength=num_bins)
    tokens = np.bincount(s_bin, weights=s_len, minlength=num_bins)
    tol = 1e-9 * max(cap, 1.0)
    for _ in range(_MAX_ROUNDS):
        over = loads - cap
        tover = tokens - max_tokens
        bad = (over > tol) | (tover > 0)
        cand = kept & s_evictable & bad[s_bin]
        if not cand.any():
            break
        pos = np.flatnonzero(cand)
        r = s_bin[pos]
        covers = (s_cost[pos] >= over[r] - tol) & (s_len[pos] >= tover[r])
        # smallest covering sample per bin: the last covering one (segments are largest first)
        cpos = pos[covers]
        last = cpos[_segment_last(s_bin[cpos])]
        covered = np.zeros(num_bins, dtype=bool)
        covered[s_bin[last]] = True
        rest = pos[~covered[r]]
        rr = s_bin[rest]
        first = _segment_first(rr)
        seg_start = np.repeat(first, np.diff(np.append(first, rest.size)))
        csum = np.cumsum(s_cost[rest])
        in_seg = csum - (csum[seg_start] - s_cost[rest[seg_start]])
        take = rest[in_seg < over[rr] - tol]  # the first always qualifies: it does not cover
        out = np.concatenate([last, take])
        kept[out] = False
        np.subtract.at(loads, s_bin[out], s_cost[out])
        np.subtract.at(tokens, s_bin[out], s_len[out])
    mask = home >= 0
    mask[order] = kept
    return mask


def _keep_prefix(
    costs: FloatArray, lengths: IntArray, home: IntArray, num_bins: int, cap: float, max_tokens: float
) -> np.ndarray:
    """Mask of samples kept in their bin: per bin, its largest samples while they fit under cap.

    The samples given up are a bin's smallest: they fit the rooms other ranks have left. The
    largest sample of a bin always stays (no rank could take more than it alone).
    """
    n = costs.size
    order = np.lexsort((np.arange(n), -costs, home))
    order = order[home[order] >= 0]
    s_bin = home[order]
    first = _segment_first(s_bin)
    seg_start = np.repeat(first, np.diff(np.append(first, order.size)))
    csum = np.cumsum(costs[order])
    in_seg = csum - (csum[seg_start] - costs[order[seg_start]])
    tsum = np.cumsum(lengths[order])
    t_in_seg = tsum - (tsum[seg_start] - lengths[order[seg_start]])
    tol = 1e-9 * max(cap, 1.0)
    keep = ((in_seg <= cap + tol) & (t_in_seg <= max_tokens)) | (np.arange(order.size) == seg_start)
    mask = np.zeros(n, dtype=bool)
    mask[order] = keep
    return mask


def _match(
    items: IntArray,
    item_group: IntArray,
    bin_group: IntArray,
    costs: FloatArray,
    lengths: IntArray,
    room: FloatArray,
    token_room: FloatArray,
    dest: IntArray,
) -> IntArray:
    """Place items into ranks of the same group with room: per round, the k-th largest item of a group
    against the group's k-th roomiest rank, kept where it fits. Returns the items left unplaced."""
    num_ranks = room.size
    rank_ids = np.arange(num_ranks)
    tol = 1e-9 * max(float(np.abs(room).max(initial=1.0)), 1.0)
    pending = items
    for _ in range(_MAX_ROUNDS):
        if pending.size == 0:
            break
        o = np.lexsort((pending, -costs[pending], item_group))
        p, pg = pending[o], item_group[o]
        pos = np.arange(p.size) - np.searchsorted(pg, pg, side="left")
        b = np.lexsort((rank_ids, -room, bin_group))
        bg = bin_group[b]
        slot = np.searchsorted(bg, pg, side="left") + pos
        valid = slot < np.searchsorted(bg, pg, side="right")
        ranks = b[slot[valid]]
        cand = p[valid]
        fit = (costs[cand] <= room[ranks] + tol) & (lengths[cand] <= token_room[ranks])
        placed, to = cand[fit], ranks[fit]
        if placed.size == 0:
            break
        dest[placed] = to
        room[to] -= costs[placed]
        token_room[to] -= lengths[placed]
        keep = np.ones(p.size, dtype=bool)
        keep[np.flatnonzero(valid)[fit]] = False
        pending, item_group = p[keep], pg[keep]
    return pending


def _place_leftovers(
    items: IntArray, home_group: IntArray, group_size: int, costs: FloatArray, lengths: IntArray,
    room: FloatArray, token_room: FloatArray, dest: IntArray,
) -> None:  # fmt: skip
    """Largest first to the roomiest bin of its group if that is as roomy as needed, else the roomiest anywhere."""
    for i in items[np.argsort(-costs[items], kind="stable")].tolist():
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


def _best_fit_in_nodes(
    items: IntArray, node_of: IntArray, origin: IntArray, rpn: int, costs: FloatArray, lengths: IntArray,
    room: FloatArray, token_room: FloatArray, dest: IntArray,
) -> IntArray:  # fmt: skip
    """Best fit decreasing inside each node, all nodes at once: per round every node places its largest
    pending sample on its rank with the least room that still fits it. Returns the samples that fit nowhere."""
    if items.size == 0:
        return items
    o = np.lexsort((items, -costs[items], node_of[items]))
    p, g = items[o], node_of[items][o]
    first = _segment_first(g)
    nodes = g[first]
    ptr = first.copy()
    end = np.append(first[1:], p.size)
    room2 = room.reshape(-1, rpn)
    troom2 = token_room.reshape(-1, rpn)
    tol = 1e-9 * max(float(np.abs(room).max(initial=1.0)), 1.0)
    unplaced = []
    active = np.arange(nodes.size)
    while active.size:
        it = p[ptr[active]]
        m = nodes[active]
        c, ln = costs[it], lengths[it]
        fits = (room2[m] >= c[:, None] - tol) & (troom2[m] >= ln[:, None])
        score = np.where(fits, room2[m] - c[:, None], np.inf)
        # its own rank first: a sample that fits back where it was does not move
        own = origin[it] // rpn == m
        mine = fits[np.flatnonzero(own), origin[it][own] % rpn]
        score[np.flatnonzero(own)[mine], origin[it][own][mine] % rpn] = -1.0
        j = np.argmin(score, axis=1)
        ok = fits.any(axis=1)
        to = m[ok] * rpn + j[ok]
        dest[it[ok]] = to
        room[to] -= c[ok]
        token_room[to] -= ln[ok]
        unplaced.append(it[~ok])
        ptr[active] += 1
        active = active[ptr[active] < end[active]]
    return np.concatenate(unplaced)


def _displace(
    items: IntArray, node_of: IntArray, rpn: int, costs: FloatArray, lengths: IntArray,
    room: FloatArray, token_room: FloatArray, dest: IntArray,
) -> IntArray:  # fmt: skip
    """Put each item on the roomiest rank of its node, giving up that rank's smallest samples until it fits.

    Returns the samples given up (each smaller than the item that took its place), to re-pack.
    Items that cannot fit even on an emptied rank are returned unplaced.
    """
    bumped: list[int] = []
    for i in items[np.argsort(-costs[items], kind="stable")].tolist():
        lo = int(node_of[i]) * rpn
        t = lo + int(np.argmax(room[lo : lo + rpn]))
        members = np.flatnonzero(dest == t)
        members = members[(costs[members] < costs[i]) & (members != i)]
        members = members[np.lexsort((members, costs[members]))]
        free = np.cumsum(costs[members]) + room[t]
        tfree = np.cumsum(lengths[members]) + token_room[t]
        if (room[t] < costs[i] or token_room[t] < lengths[i]) and (
            members.size == 0 or not (free[-1] >= costs[i] and tfree[-1] >= lengths[i])
        ):
            bumped.append(i)
            continue
        k = 0
        while room[t] < costs[i] or token_room[t] < lengths[i]:
            j = int(members[k])
            dest[j] = -1
            room[t] += costs[j]
            token_room[t] += lengths[j]
            bumped.append(j)
            k += 1
        dest[i] = t
        room[t] -= costs[i]
        token_room[t] -= lengths[i]
    return np.array(bumped, dtype=np.int64)


def _orch_at_cap(ph: PhaseArrays, cap: float, node_cap: float) -> IntArray:
    n, num_ranks, rpn, num_nodes = ph.n, ph.num_ranks, ph.ranks_per_node, ph.num_nodes
    costs, lengths, origin = ph.costs, ph.lengths, ph.origin
    dest = origin.copy()
    max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
    loads0 = np.bincount(origin, weights=costs, minlength=num_ranks)
    # a sample that would not fit even on the emptiest rank stays home (it sets the bound)
    evictable = costs <= cap - loads0.min() + 1e-9 * cap

    # 1. nodes: only a node's excess over node_cap leaves it, to nodes with room
    node = origin // rpn
    at_home = _evict(costs, lengths, node, num_nodes, node_cap, rpn * max_tokens, evictable)
    node_of = node.copy()
    room_n = node_cap - np.bincount(node[at_home], weights=costs[at_home], minlength=num_nodes)
    troom_n = rpn * max_tokens - np.bincount(node[at_home], weights=lengths[at_home], minlength=num_nodes)
    out = np.flatnonzero(~at_home)
    zeros_n = np.zeros(num_nodes, dtype=np.int64)
    left = _match(out, np.zeros(out.size, dtype=np.int64), zeros_n, costs, lengths, room_n, troom_n, node_of)
    _place_leftovers(left, np.zeros(n, dtype=np.int64), num_nodes, costs, lengths, room_n, troom_n, node_of)

    # 2. ranks inside each node: samples stay on their rank unless it is over the cap
    home = np.where(at_home, origin, -1)
    kept = _keep_prefix(costs, lengths, home, num_ranks, cap, max_tokens)
    room = cap - np.bincount(origin[kept], weights=costs[kept], minlength=num_ranks)
    token_room = max_tokens - np.bincount(origin[kept], weights=lengths[kept], minlength=num_ranks)
    items = np.flatnonzero(~kept)
    left = _best_fit_in_nodes(items, node_of, origin, rpn, costs, lengths, room, token_room, dest)
    for _ in range(4):  # a sample no rank of its node has room for displaces smaller ones, which then re-pack
        if left.size == 0:
            break
        bumped = _displace(left, node_of, rpn, costs, lengths, room, token_room, dest)
        left = _best_fit_in_nodes(bumped, node_of, origin, rpn, costs, lengths, room, token_room, dest)
    # 3. what the node could not absorb goes to any rank with room
    zeros_r = np.zeros(num_ranks, dtype=np.int64)
    left = _match(left, np.zeros(left.size, dtype=np.int64), zeros_r, costs, lengths, room, token_room, dest)
    _place_leftovers(left, node_of, rpn, costs, lengths, room, token_room, dest)
    # 4. local search on the max rank
    tokens = None if ph.spec.max_tokens is None else ph.spec.max_tokens
    return improve(costs, dest, num_ranks, rpn, cap, lengths=lengths, cap=tokens)


def _max_cost(ph: PhaseArrays, dest: IntArray) -> float:
    return float(np.bincount(dest, weights=ph.costs, minlength=ph.num_ranks).max())


def orch_unpadded(ph: PhaseArrays, slack: float = SLACK) -> IntArray:
    """Cap = bound × (1 + slack); a node keeps up to R × (mean + half the way to the cap), so its ranks
    have room to pack what it keeps.

    When the bound is out of reach (few coarse samples per rank), the max is checked against LPT
    (exact up to EXACT_LPT_SAMPLES samples, by rounds above): a second pass runs at the better of the
    two, and if it still falls short, LPT's own buckets are placed on ranks topology-aware instead.
    """
    if ph.n == 0:
        return ph.origin.copy()
    lb = lower_bound(ph)
    mean = float(ph.costs.sum()) / ph.num_ranks
    rpn = ph.ranks_per_node
    cap = lb * (1 + slack)
    dest = _orch_at_cap(ph, cap, rpn * (mean + 0.5 * (cap - mean)))
    reached = _max_cost(ph, dest)
    if reached <= cap * (1 + 1e-9):
        return dest
    tokens = ph.spec.max_tokens
    try:
        ref = lpt(ph.costs, ph.num_ranks, ph.lengths, tokens) if ph.n <= EXACT_LPT_SAMPLES else None
    except InfeasibleError:
        ref = None
    if ref is None and tokens is None:
        ref = lpt_rounds(ph.costs, ph.num_ranks)
    ref_max = _max_cost(ph, ref) if ref is not None else np.inf
    target = min(reached, ref_max)
    again = _orch_at_cap(ph, target, rpn * mean * (1 + (target / lb - 1) / 3))
    candidates = [(reached, 1, dest), (_max_cost(ph, again), 0, again)]
    if ref is not None and min(c[0] for c in candidates) > ref_max * (1 + 1e-9):
        from orch.planner.balance.paper import runs_to_nodes_greedy

        candidates.append((ref_max, 2, match_runs_to_ranks(ref, runs_to_nodes_greedy(ref, ph), ph)))
    return min(candidates, key=lambda c: (c[0], c[1]))[2]


def match_runs_to_ranks(run: IntArray, run_node: IntArray, ph: PhaseArrays) -> IntArray:
    """Rank of every sample, given its run and each run's node (at most R runs per node).

    Inside each node, greedy max-overlap matching of runs to ranks: the pair (run, rank) with the
    most bytes of the run already on the rank first, vectorised over nodes.
    """
    rpn, num_nodes = ph.ranks_per_node, ph.num_nodes
    num_runs = run_node.size
    # local index of each run inside its node
    order = np.lexsort((np.arange(num_runs), run_node))
    local = np.empty(num_runs, dtype=np.int64)
    first = np.searchsorted(run_node[order], run_node[order], side="left")
    local[order] = np.arange(num_runs) - first
    if num_runs and local.max() >= rpn:
        raise AssertionError("more runs than ranks on a node")
    s_node = run_node[run]
    same = ph.origin // rpn == s_node
    key = (s_node * rpn + local[run]) * rpn + ph.origin % rpn
    size = num_nodes * rpn * rpn
    # + 1: every pair is allowed; ties keep order
    w = (np.bincount(key[same], weights=ph.bytes[same], minlength=size) + 1.0).reshape(num_nodes, rpn, rpn)
    rank_of_local = np.full((num_nodes, rpn), -1, dtype=np.int64)
    nodes = np.arange(num_nodes)
    for _ in range(rpn):
        flat = np.argmax(w.reshape(num_nodes, -1), axis=1)
        a, b = np.divmod(flat, rpn)
        rank_of_local[nodes, a] = b
        w[nodes, a, :] = -1.0
        w[nodes, :, b] = -1.0
    return s_node * rpn + rank_of_local[s_node, local[run]]


def orch_padded(ph: PhaseArrays) -> IntArray:
    """Runs at the exact optimal cap, each with as many places as the cap allows, each on the node that
    holds most of its bytes; then every sample, longest first, takes a free place on its own node led by
    a sample at least as long, else any such place (samples of equal length trade places to stay home)."""
    n, rpn, num_nodes = ph.n, ph.ranks_per_node, ph.num_nodes
    if n == 0:
        return ph.origin.copy()
    costs, lengths = ph.costs, ph.lengths
    order = np.lexsort((np.arange(n), -lengths))
    best = optimal_cap(costs[order], lengths[order], ph.num_ranks, ph.spec.max_tokens)
    run_desc = padded_runs(costs[order], lengths[order], ph.num_ranks, ph.spec.max_tokens, cap=best)
    starts = np.flatnonzero(np.concatenate([[True], run_desc[1:] != run_desc[:-1]]))
    node_desc = ph.origin[order] // rpn
    runs = np.empty(n, dtype=np.int64)
    runs[order] = run_desc
    from orch.planner.balance.paper import runs_to_nodes_greedy

    run_node = runs_to_nodes_greedy(runs, ph)  # a run on the node that holds most of its bytes
    leader = lengths[order][starts]
    places = run_capacity(costs[order][starts], leader, best, ph.spec.max_tokens)
    # every place of every run, longest leader first; samples longest first, each to a free place of
    # its own node led by a sample at least as long, else to any such place. Longest first keeps
    # every choice feasible: a place one sample may take, every later (shorter) one may take too.
    slot_run = np.repeat(np.arange(starts.size), places).tolist()
    slot_node = run_node[np.repeat(np.arange(starts.size), places)].tolist()
    slot_len = np.repeat(leader, places).tolist()
    taken = [False] * len(slot_run)
    own: list[list[int]] = [[] for _ in range(num_nodes)]
    anywhere: list[int] = []
    run_of_desc = [0] * n
    nxt = 0
    for i, (li, m) in enumerate(zip(lengths[order].tolist(), node_desc.tolist(), strict=True)):
        while nxt < len(slot_len) and slot_len[nxt] >= li:
            own[slot_node[nxt]].append(nxt)
            anywhere.append(nxt)
            nxt += 1
        stack = own[m]
        while stack and taken[stack[-1]]:
            stack.pop()
        if not stack:
            stack = anywhere
            while stack and taken[stack[-1]]:
                stack.pop()
        if not stack:  # cannot happen: the consecutive runs are such an assignment
            break
        k = stack.pop()
        taken[k] = True
        run_of_desc[i] = slot_run[k]
    else:
        run_of = np.empty(n, dtype=np.int64)
        run_of[order] = run_of_desc
        used = np.unique(run_of)
        remap = np.full(starts.size, -1, dtype=np.int64)
        remap[used] = np.arange(used.size)
        return match_runs_to_ranks(remap[run_of], run_node[used], ph)
    return match_runs_to_ranks(runs, runs_to_nodes_greedy(runs, ph), ph)
