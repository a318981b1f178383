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
If C is out of reach (coarse batches), the best global heuristic sets it: M = the better of what
was reached and LPT, and a second pass runs against M × (1 + SLACK), so nodes keep their samples up
to that cap (R × the cap per node). If a few ranks stay over, `repair` moves or swaps samples of the
max rank with any rank that has room, fewest inter-node bytes first, until every rank is under it.
If that falls short too, LPT's own buckets (placed topology-aware) are the fallback: the max is
never above LPT's × (1 + SLACK).

Padded phases: any assignment whose every rank has samples × cost(longest) <= C is as balanced
as the optimal runs, with C = the optimum × (1 + SLACK). Node first: each node packs its own
samples into greedy runs at C and keeps its fullest runs (at most R, at least θ full); the rest
form a pool packed by the global greedy runs on the ranks left free, placed on nodes by bytes. θ
is the smallest fill for which the pool still fits (a bisection). Then only the ranks' padded
classes are kept (k = C / cost(longest) samples of cost <= C / k: interchangeable) and the samples
are re-dealt node first (refill_padded). Near-equal lengths must still share a rank at the
optimum, so dense padded batches still move many bytes (bench/bench_balance.py), and that is
intrinsic: bench/bench_padded_bound.py certifies (cross_bound.py, a Lagrangian bound over every
assignment under the cap) that on its six audio cases any assignment at C = optimum × 1.006 sends
at least 0.28-0.40 × the paper mode's inter-node bytes, so no padded dispatcher reaches paper / 4.

One sort per phase (largest first) feeds every later ordering: a bin-then-size order is one
argsort of unique int64 keys. Python loops run over rounds, runs, nodes or a few leftovers,
never once per sample (except exact LPT, the reference when the bound is out of reach).
"""

from __future__ import annotations

import numpy as np

from orch.planner.balance.cost import (
    FloatArray,
    IntArray,
    PhaseArrays,
    lower_bound,
    moved_bytes,
    rank_costs,
    rank_tokens,
)
from orch.planner.balance.greedy import improve, lpt, lpt_rounds, move_sample
from orch.planner.balance.padded import (
    desc_order,
    greedy_starts,
    near_optimal_cap,
    node_runs,
    run_capacity,
    step_limits,
)
from orch.planner.errors import InfeasibleError

SLACK = 0.006  # target max cost = lower bound × (1 + SLACK): room that lets samples stay home
EXACT_LPT_SAMPLES = 1 << 20  # exact LPT as the fallback reference up to here (about 1 µs a sample)
_MAX_ROUNDS = 64
_THETA_LEVELS = 65  # fill quantiles tried for a padded node's kept runs (a bisection: about 6 tries)


def _by_bin(pos: IntArray, home: IntArray) -> IntArray:
    """Indices of the samples with home >= 0, by bin, largest first inside a bin, ties by index.

    pos[i]: sample i's place in the phase's largest-first order (computed once per phase), so one
    argsort of unique int64 keys replaces a three-key lexsort.
    """
    idx = np.flatnonzero(home >= 0)
    return idx[np.argsort(home[idx] * max(pos.size, 1) + pos[idx])]


def _largest_first(pos: IntArray, items: IntArray) -> IntArray:
    return items[np.argsort(pos[items])]


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
    pos: IntArray,
) -> np.ndarray:
    """Mask of samples that stay in their bin (rank or node) so that every bin is at most cap where it can be.

    A bin over cap gives up the smallest sample that alone brings it under cap; a bin no single
    sample covers gives up its largest samples while its excess stays positive, then repeats.
    Samples with home < 0 are not in any bin.
    """
    order = _by_bin(pos, home)  # by bin, largest first
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
        at = np.flatnonzero(cand)
        r = s_bin[at]
        covers = (s_cost[at] >= over[r] - tol) & (s_len[at] >= tover[r])
        # smallest covering sample per bin: the last covering one (segments are largest first)
        cpos = at[covers]
        last = cpos[_segment_last(s_bin[cpos])]
        covered = np.zeros(num_bins, dtype=bool)
        covered[s_bin[last]] = True
        rest = at[~covered[r]]
        rr = s_bin[rest]
        first = _segment_first(rr)
        seg_start = np.repeat(first, np.diff(np.append(first, rest.size)))
        csum = np.cumsum(s_cost[rest])
        in_seg = csum - (csum[seg_start] - s_cost[rest[seg_start]])
        take = rest[in_seg < over[rr] - tol]  # the first always qualifies: it does not cover
        out = np.concatenate([last, take])
        kept[out] = False
        loads -= np.bincount(s_bin[out], weights=s_cost[out], minlength=num_bins)
        tokens -= np.bincount(s_bin[out], weights=s_len[out], minlength=num_bins)
    mask = home >= 0
    mask[order] = kept
    return mask


def _keep_prefix(
    costs: FloatArray, lengths: IntArray, home: IntArray, cap: float, max_tokens: float, pos: IntArray
) -> np.ndarray:
    """Mask of samples kept in their bin: per bin, its largest samples while they fit under cap.

    The samples given up are a bin's smallest: they fit the rooms other ranks have left. The
    largest sample of a bin always stays (no rank could take more than it alone).
    """
    n = costs.size
    order = _by_bin(pos, home)
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
    room: FloatArray, token_room: FloatArray, dest: IntArray, pos: IntArray,
) -> IntArray:  # fmt: skip
    """Best fit decreasing inside each node, all nodes at once: per round every node places its largest
    pending sample on its rank with the least room that still fits it. Returns the samples that fit nowhere."""
    if items.size == 0:
        return items
    o = np.argsort(node_of[items] * max(pos.size, 1) + pos[items])
    p, g = items[o], node_of[items][o]
    first = _segment_first(g)
    nodes = g[first]
    ptr = first.copy()
    end = np.append(first[1:], p.size)
    room2 = room.reshape(-1, rpn)
    troom2 = token_room.reshape(-1, rpn)
    tol = 1e-9 * max(float(np.abs(room).max(initial=1.0)), 1.0)
    # per item, gathered once: cost, tokens, and its own rank inside the node (-1: another node)
    c_all, l_all = costs[p], lengths[p]
    own_all = np.where(origin[p] // rpn == g, origin[p] % rpn, -1)
    unplaced = []
    active = np.arange(nodes.size)
    while active.size:
        k = ptr[active]
        m = nodes[active]
        c, ln, ow = c_all[k], l_all[k], own_all[k]
        r2 = room2[m]
        fits = (r2 >= (c - tol)[:, None]) & (troom2[m] >= ln[:, None])
        score = np.where(fits, r2 - c[:, None], np.inf)
        # its own rank first: a sample that fits back where it was does not move
        rows = np.flatnonzero(ow >= 0)
        back = rows[fits[rows, ow[rows]]]
        score[back, ow[back]] = -1.0
        j = np.argmin(score, axis=1)
        ok = score[np.arange(j.size), j] < np.inf
        it = p[k]
        to = m[ok] * rpn + j[ok]
        dest[it[ok]] = to
        room[to] -= c[ok]
        token_room[to] -= ln[ok]
        if not ok.all():
            unplaced.append(it[~ok])
        ptr[active] += 1
        active = active[ptr[active] < end[active]]
    return np.concatenate(unplaced) if unplaced else np.zeros(0, dtype=np.int64)


def _rank_members(
    dest: IntArray, pos: IntArray, nodes: IntArray, rpn: int, num_ranks: int
) -> tuple[IntArray, IntArray]:
    """Samples on the ranks of `nodes`, by rank, smallest first, and where each rank's segment starts."""
    wanted = np.zeros(num_ranks // rpn, dtype=bool)
    wanted[nodes] = True
    idx = np.flatnonzero((dest >= 0) & wanted[np.maximum(dest, 0) // rpn])
    by_rank = idx[np.argsort(dest[idx] * max(pos.size, 1) - pos[idx])]
    return by_rank, np.searchsorted(dest[by_rank], np.arange(num_ranks + 1))


def _displace(
    items: IntArray, node_of: IntArray, rpn: int, costs: FloatArray, lengths: IntArray,
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
    first = _segment_first(g)
    ptr = first.copy()
    end = np.append(first[1:], p.size)
    room2 = room.reshape(-1, rpn)
    active = np.arange(first.size)
    bumped: list[IntArray] = []
    while active.size:
        it = p[ptr[active]]
        t = g[first[active]] * rpn + np.argmax(room2[g[first[active]]], axis=1)
        c_it, l_it = costs[it], lengths[it]
        size = bounds[t + 1] - bounds[t]
        seg = np.repeat(np.arange(active.size), size)
        offset = np.arange(seg.size) - np.repeat(np.cumsum(size) - size, size)
        mem = by_rank[np.repeat(bounds[t], size) + offset]
        ok = (dest[mem] == t[seg]) & (costs[mem] < c_it[seg]) & (mem != it[seg])
        mem, seg = mem[ok], seg[ok]
        starts = np.repeat(_segment_first(seg), np.diff(np.append(_segment_first(seg), seg.size)))
        cs = np.cumsum(costs[mem])
        ts = np.cumsum(lengths[mem])
        free = cs - (cs[starts] - costs[mem[starts]]) + room[t][seg] if mem.size else cs
        tfree = ts - (ts[starts] - lengths[mem[starts]]) + token_room[t][seg] if mem.size else ts
        need = (free >= c_it[seg]) & (tfree >= l_it[seg])
        fits_now = (room[t] >= c_it) & (token_room[t] >= l_it)
        k = np.full(active.size, -1, dtype=np.int64)  # members to give up: those before index k
        hit = np.flatnonzero(need)
        if hit.size:
            firsts = hit[_segment_first(seg[hit])]
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


def _to_nodes(ph: PhaseArrays, node_cap: float, evictable: np.ndarray, pos: IntArray) -> tuple[np.ndarray, IntArray]:
    """Node-level balance: only a node's excess over node_cap leaves it, to nodes with room.

    Returns (the samples that stay on their node, every sample's node).
    """
    rpn, num_nodes = ph.ranks_per_node, ph.num_nodes
    costs, lengths = ph.costs, ph.lengths
    max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
    node = ph.origin // rpn
    at_home = _evict(costs, lengths, node, num_nodes, node_cap, rpn * max_tokens, evictable, pos)
    node_of = node.copy()
    room_n = node_cap - np.bincount(node[at_home], weights=costs[at_home], minlength=num_nodes)
    troom_n = rpn * max_tokens - np.bincount(node[at_home], weights=lengths[at_home], minlength=num_nodes)
    out = np.flatnonzero(~at_home)
    left = _match(out, pos, costs, lengths, room_n, troom_n, node_of)
    _place_leftovers(left, np.zeros(ph.n, dtype=np.int64), num_nodes, costs, lengths, room_n, troom_n, node_of)
    return at_home, node_of


def _orch_at_cap(ph: PhaseArrays, cap: float, node_cap: float, pos: IntArray, target: float | None = None) -> IntArray:
    num_ranks, rpn = ph.num_ranks, ph.ranks_per_node
    costs, lengths, origin = ph.costs, ph.lengths, ph.origin
    dest = origin.copy()
    max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
    loads0 = np.bincount(origin, weights=costs, minlength=num_ranks)
    # a sample that would not fit even on the emptiest rank stays home (it sets the bound)
    evictable = costs <= cap - loads0.min() + 1e-9 * cap

    # 1. nodes: only a node's excess over node_cap leaves it, to nodes with room
    at_home, node_of = _to_nodes(ph, node_cap, evictable, pos)

    # 2. ranks inside each node: samples stay on their rank unless it is over the cap
    home = np.where(at_home, origin, -1)
    kept = _keep_prefix(costs, lengths, home, cap, max_tokens, pos)
    room = cap - np.bincount(origin[kept], weights=costs[kept], minlength=num_ranks)
    token_room = max_tokens - np.bincount(origin[kept], weights=lengths[kept], minlength=num_ranks)
    items = np.flatnonzero(~kept)
    dest[items] = -1  # not on any rank until placed (rank membership below reads dest)
    left = _best_fit_in_nodes(items, node_of, origin, rpn, costs, lengths, room, token_room, dest, pos)
    members_of = _rank_members(dest, pos, np.unique(node_of[left]), rpn, num_ranks) if left.size else None
    for _ in range(4):  # a sample no rank of its node has room for displaces smaller ones, which then re-pack
        if left.size == 0 or members_of is None:
            break
        bumped = _displace(left, node_of, rpn, costs, lengths, room, token_room, dest, pos, members_of)
        left = _best_fit_in_nodes(bumped, node_of, origin, rpn, costs, lengths, room, token_room, dest, pos)
    # 3. what the node could not absorb goes to any rank with room
    left = _match(left, pos, costs, lengths, room, token_room, dest)
    _place_leftovers(left, node_of, rpn, costs, lengths, room, token_room, dest)
    # 4. local search on the max rank
    tokens = None if ph.spec.max_tokens is None else ph.spec.max_tokens
    return improve(costs, dest, num_ranks, rpn, cap if target is None else target, lengths=lengths, cap=tokens)


_REPAIR_ITERS = 4096
REFILL_MIN_CROSS = 0.06  # refill_padded leaves alone runs that cross at most this share of the bytes


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
    num_ranks, rpn = ph.num_ranks, ph.ranks_per_node
    costs, lengths, bytes_, origin = ph.costs, ph.lengths, ph.bytes.astype(np.float64), ph.origin
    onode = origin // rpn
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
        ntop = top // rpn
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
            home_lo = int(oa[k]) * rpn
            if ok[ra[k]]:
                t, score = int(ra[k]), -4.0 * away_a[k]
            elif ok[home_lo : home_lo + rpn].any():
                t, score = home_lo + int(np.argmax(ok[home_lo : home_lo + rpn])), -4.0 * away_a[k] + ba[k]
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
            bb, ob, nb = bytes_[others], onode[others], tb // rpn
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
    rounds above). If the first pass reached M, it stands. Else a second pass runs against
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
    rpn = ph.ranks_per_node
    largest = desc_order(ph.lengths)  # cost is non-decreasing in length: one sort per phase
    pos = np.empty(ph.n, dtype=np.int64)
    pos[largest] = np.arange(ph.n)
    # the same order by cost, ties by index, when cost strictly increases with length
    by_cost = largest if ph.spec.linear > 0 or ph.spec.quadratic > 0 else None
    cap = lb * (1 + slack)
    dest = _orch_at_cap(ph, cap, rpn * (mean + 0.5 * (cap - mean)), pos)
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
    if reached <= ref_max * (1 + 1e-9):  # the first pass already matches the best heuristic
        return dest
    target = min(reached, ref_max)
    loose = target * (1 + slack)
    again = _orch_at_cap(ph, loose, rpn * loose, pos, target=target)
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


def orch_padded(ph: PhaseArrays, slack: float = SLACK) -> IntArray:
    """Padded phase: any assignment whose every rank has samples × cost(longest) <= C is balanced at C.

    C <= the optimal padded cost × (1 + slack) (padded.near_optimal_cap). Node first: each node packs
    its own samples into greedy runs at C (padded.node_runs) and keeps its fullest runs, at most R,
    whose fill (own costs / C) is at least θ; everything else forms a pool, packed by the global greedy
    runs onto the ranks left free. θ is the smallest of a few fill quantiles for which the pool fits
    (θ above every fill keeps nothing: the global runs, always feasible). Pool runs go to the nodes
    with free ranks by bytes; each node's runs are then matched to its ranks.
    """
    n, num_ranks, rpn, num_nodes = ph.n, ph.num_ranks, ph.ranks_per_node, ph.num_nodes
    if n == 0:
        return ph.origin.copy()
    costs, lengths, tokens = ph.costs, ph.lengths, ph.spec.max_tokens
    node = ph.origin // rpn
    # longest first; equal lengths grouped by node, so that consecutive pool runs gather one node's samples
    gd = desc_order(lengths * num_nodes + (num_nodes - 1 - node))
    c_d, l_d = costs[gd], lengths[gd]
    cap = near_optimal_cap(c_d, l_d, num_ranks, tokens, slack)
    local, local_node, fill = node_runs(costs, lengths, node, num_nodes, cap, tokens)
    by_fill = np.lexsort((np.arange(fill.size), -fill, local_node))  # per node, fullest first
    rank_in_node = np.empty(fill.size, dtype=np.int64)
    first = np.searchsorted(local_node[by_fill], local_node[by_fill], side="left")
    rank_in_node[by_fill] = np.arange(fill.size) - first
    local_d = local[gd]
    steps = step_limits(l_d, tokens, n)

    def attempt(theta: float) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
        # among a node's R fullest runs, those at least θ full stay
        kept = (fill >= theta) & (rank_in_node < rpn)
        pool = ~kept[local_d]
        starts = greedy_starts(c_d[pool].tolist(), steps[pool].tolist(), cap, num_ranks - int(kept.sum()))
        return None if starts is None else (kept, pool, starts)

    thetas = np.unique(np.quantile(fill, np.linspace(0.0, 1.0, _THETA_LEVELS)))
    lo, hi = 0, thetas.size
    found = None
    while lo < hi:
        mid = (lo + hi) // 2
        got = attempt(float(thetas[mid]))
        if got is None:
            lo = mid + 1
        else:
            hi, found = mid, got
    if found is None:
        found = attempt(np.inf)  # keep nothing: the global greedy runs, feasible at C
        assert found is not None
    kept, pool, starts = found
    kept_ids = np.flatnonzero(kept)
    run_of = np.full(n, -1, dtype=np.int64)
    remap = np.full(fill.size, -1, dtype=np.int64)
    remap[kept_ids] = np.arange(kept_ids.size)
    in_kept = kept[local]
    run_of[in_kept] = remap[local[in_kept]]
    run_node = local_node[kept_ids]
    pool_idx = gd[pool]  # pool samples, longest first, in consecutive greedy runs
    if pool_idx.size:
        marks = np.zeros(pool_idx.size, dtype=np.int64)
        marks[np.array(starts, dtype=np.int64)] = 1
        pool_run = np.cumsum(marks) - 1
        free_ranks = rpn - np.bincount(run_node, minlength=num_nodes)
        pool_node = _runs_to_free_nodes(pool_run, node[pool_idx], ph.bytes[pool_idx], free_ranks, len(starts))
        run_of[pool_idx] = kept_ids.size + pool_run
        run_node = np.concatenate([run_node, pool_node])
    dest = match_runs_to_ranks(run_of, run_node, ph)
    # re-deal under the max the runs reached (<= cap): balance stays exactly as good
    return refill_padded(ph, dest, float(rank_costs(ph, dest).max(initial=0.0)), largest=gd)


def _stay_counts(own: IntArray, places: IntArray) -> IntArray:
    """How many of each bin's own samples of each class stay in the bin (kept[b, j]).

    own[b, j]: samples at home in bin b whose class is j; places[b, j]: places bin b offers of
    class j. Class j samples may take places of class <= j (nested: a lower class admits longer
    samples), so a bin keeps, class by class upward, as many as its places allow, carrying unused
    places upward. At every class boundary places are set aside for the samples that did not stay,
    so that they still fit elsewhere (Hall's condition on the remainder): first places that no
    later class of their bin needs, then those needed least. A loop over classes, numpy over bins.
    """
    num_bins, num_classes = own.shape
    walk = np.cumsum(own - places, axis=1)  # later classes' own need beyond their places
    later = np.maximum.accumulate(walk[:, ::-1], axis=1)[:, ::-1]
    future = np.zeros_like(walk)
    future[:, :-1] = np.maximum(later[:, 1:] - walk[:, :-1], 0)
    own_t, places_t, future_t = own.T.copy(), places.T.copy(), future.T.copy()  # class-major rows
    free = np.zeros(num_bins, dtype=np.int64)
    kept = np.zeros_like(own_t)
    unmatched = 0
    reserved = 0
    own_sum = own_t.sum(axis=1).tolist()
    for j in range(num_classes):
        free += places_t[j]
        take = np.minimum(own_t[j], free, out=kept[j])
        free -= take
        unmatched += own_sum[j] - int(take.sum())
        need = unmatched - reserved
        if need <= 0:
            continue
        reserved += need
        spare = np.maximum(free - future_t[j], 0)
        reach = np.cumsum(spare)  # places set aside: the first bins' spare places up to need
        r = np.minimum(spare, np.maximum(need - (reach - spare), 0))
        free -= r
        need -= int(r.sum())
        if need > 0:
            order = np.argsort(future_t[j] - free, kind="stable")
            f = free[order]
            before = np.cumsum(f) - f
            free[order] -= np.minimum(f, np.maximum(need - before, 0))
    return np.ascontiguousarray(kept.T)


def _allocate(room: IntArray, demand: IntArray) -> IntArray:
    """x[b, j]: samples of class j placed in bin b, class by class upward, bins in order.

    room[b, J]: how many samples of classes <= J bin b may still take (Hall's slack of its places);
    demand[j]: samples of class j to place. Falls short (sum(x) < sum(demand)) only if no placement exists.
    """
    num_b, num_c = room.shape
    # samples of classes <= J taken can never exceed any later room: suffix minimum
    limit = np.minimum.accumulate(room[:, ::-1], axis=1)[:, ::-1]
    x = np.zeros_like(room)
    taken = np.zeros(num_b, dtype=np.int64)
    for j in range(num_c):
        avail = np.maximum(limit[:, j] - taken, 0)
        before = np.cumsum(avail) - avail
        t = np.clip(demand[j] - before, 0, avail)
        x[:, j] = t
        taken += t
    return x


def _sort_by(major: IntArray, span: int, minor: IntArray, n: int) -> IntArray:
    """Order by (major, minor), minor unique in 0..n-1 within a major: one argsort of unique int64 keys."""
    if (span + 1) * max(n, 1) >= 1 << 62:
        return np.lexsort((minor, major))
    return np.argsort(major * n + minor)


def _classes_to_nodes(
    ph: PhaseArrays, k_rank: IntArray, classes: IntArray, cls: IntArray, by_bytes: IntArray
) -> IntArray:
    """The same multiset of rank classes, dealt to the nodes whose own samples would fill them most.

    A rank of class j (k places) at node m would keep its node's k samples of class j with the
    most bytes (then the next k for a second such rank...): per (node, class, t-th rank) that is a
    gain in bytes. Greedy by gain, a node hosting at most R ranks and class j at most as many as
    dest had; classes left go to the nodes' places left. Inside a node, each hosted class goes to
    the rank with the most bytes of its own samples of that class (greedy, all nodes at once).
    Returns the new k per rank (0: an empty rank).
    """
    n, num_ranks, rpn, num_nodes = ph.n, ph.num_ranks, ph.ranks_per_node, ph.num_nodes
    num_c = classes.size
    used = k_rank > 0
    per_class = np.bincount(np.searchsorted(classes, k_rank[used]), minlength=num_c)
    onode = ph.origin // rpn
    o = _sort_by(onode * num_c + cls, num_nodes * num_c, by_bytes, n)
    key = onode[o] * num_c + cls[o]
    chunk = (np.arange(n) - np.searchsorted(key, key, side="left")) // classes[cls[o]]
    near = chunk < rpn  # a node hosts at most R ranks of a class
    ekey = key[near] * rpn + chunk[near]
    uniq, inv = np.unique(ekey, return_inverse=True)
    gain = np.bincount(inv, weights=ph.bytes[o][near])
    e_node = (uniq // rpn // num_c).tolist()
    e_cls = ((uniq // rpn) % num_c).tolist()
    node_left = [rpn] * num_nodes
    cls_left = per_class.tolist()
    took: list[int] = []  # entries hosted, in the order taken
    wanted = int(per_class.sum())
    # most bytes first, ties by (node, class, t): uniq is sorted, so a stable sort on -gain
    for e in np.argsort(-gain, kind="stable").tolist():
        m = e_node[e]
        if node_left[m]:
            j = e_cls[e]
            if cls_left[j]:
                node_left[m] -= 1
                cls_left[j] -= 1
                took.append(e)
                if len(took) == wanted:
                    break
    hosted = np.full((num_nodes, rpn), -1, dtype=np.int64)
    t_node = np.array([e_node[e] for e in took], dtype=np.int64)
    order_t = np.argsort(t_node, kind="stable")
    sn = t_node[order_t]
    hosted[sn, np.arange(sn.size) - np.searchsorted(sn, sn, side="left")] = np.array(
        [e_cls[took[i]] for i in order_t.tolist()], dtype=np.int64
    )
    rest = np.repeat(np.arange(num_c), cls_left)
    free = np.flatnonzero(hosted.reshape(-1) < 0)
    hosted.reshape(-1)[free[: rest.size]] = rest
    # inside each node: hosted class a to rank b by the bytes of rank b's own samples of class a
    own = np.bincount(ph.origin * num_c + cls, weights=ph.bytes, minlength=num_ranks * num_c).reshape(
        num_nodes, rpn, num_c
    )
    w = np.take_along_axis(own, np.maximum(hosted, 0)[:, None, :].repeat(rpn, axis=1), axis=2)  # [m, rank, slot]
    w = np.where(hosted[:, None, :] >= 0, w + 1.0, 0.0).transpose(0, 2, 1).copy()  # [m, slot, rank]
    rank_of = np.full((num_nodes, rpn), -1, dtype=np.int64)
    nodes = np.arange(num_nodes)
    for _ in range(rpn):
        flat = np.argmax(w.reshape(num_nodes, -1), axis=1)
        a, b = np.divmod(flat, rpn)
        ok = w[nodes, a, b] >= 0
        rank_of[nodes[ok], a[ok]] = b[ok]
        w[nodes, a, :] = -1.0
        w[nodes, :, b] = -1.0
    out = np.zeros(num_ranks, dtype=np.int64)
    m_idx, slot = np.nonzero(hosted >= 0)
    out[m_idx * rpn + rank_of[m_idx, slot]] = classes[hosted[m_idx, slot]]
    return out


def refill_padded(
    ph: PhaseArrays,
    dest: IntArray,
    cap: float,
    min_cross: float = REFILL_MIN_CROSS,
    largest: IntArray | None = None,
) -> IntArray:
    """Keep the ranks' padded shapes, and deal the samples to them so that fewer bytes cross nodes.

    A rank whose longest sample costs c and whose cap allows k = floor(cap / c) samples (and
    k × longest <= max_tokens) stays under the cap with any k samples that each allow k too: within
    such a class, samples are interchangeable. So only the multiset of the ranks' classes is kept
    from dest; it is dealt to the nodes whose own samples would fill each class most
    (_classes_to_nodes), and the samples are re-dealt (_redeal): first each node keeps as many of
    its own samples as its ranks' places allow (most bytes first in a class, places of a lower class
    admitting a higher class), keeping places aside so that the rest still fit (_stay_counts); the
    rest go to nodes with places left; then inside each node, rank by rank. If that does not move
    fewer bytes (inter-node, then intra-node) than dest, the same with the ranks' classes where dest
    has them; else dest. Every rank stays at most cap (checked). Runs that cross at most min_cross
    of the bytes are left alone: a re-deal costs ~5-10 ms at 2,560 ranks and gains little there.
    """
    n, num_ranks, num_nodes = ph.n, ph.num_ranks, ph.num_nodes
    if n == 0 or num_nodes == 0:
        return dest
    before = moved_bytes(ph, dest)
    if before[0] <= min_cross * float(ph.bytes.sum()):
        return dest  # the runs keep nearly every byte on its node already: not worth the re-deal's time
    tokens = ph.spec.max_tokens
    count = np.bincount(dest, minlength=num_ranks)
    longest = np.zeros(num_ranks, dtype=np.int64)
    np.maximum.at(longest, dest, ph.lengths)
    used = np.flatnonzero(count > 0)
    lead_cost = np.zeros(num_ranks)
    np.maximum.at(lead_cost, dest, ph.costs)
    k_rank = np.zeros(num_ranks, dtype=np.int64)
    k_rank[used] = run_capacity(lead_cost[used], longest[used], cap, tokens, limit=n)
    if (k_rank[used] < count[used]).any():
        return dest  # not an assignment at this cap: nothing to re-deal
    k_sample = run_capacity(ph.costs, ph.lengths, cap, tokens, limit=n)
    classes = np.unique(k_rank[used])
    cls = np.searchsorted(classes, k_sample, side="right") - 1
    if (cls < 0).any():
        return dest
    # every sample's place in a most-bytes-first order: `largest` (longest first) when bytes follow it
    by_bytes = np.empty(n, dtype=np.int64)
    top = int(ph.bytes.max())
    if largest is not None and largest.size == n and bool((np.diff(ph.bytes[largest]) <= 0).all()):
        by_bytes[largest] = np.arange(n)
    elif (top + 1) * n < 1 << 62:  # unique keys: any sort is stable
        by_bytes[np.argsort((top - ph.bytes) * n + np.arange(n))] = np.arange(n)
    else:
        by_bytes[np.argsort(-ph.bytes, kind="stable")] = np.arange(n)
    # the classes dealt to the nodes whose samples fill them most, else the ranks' own classes
    for profile in (_classes_to_nodes(ph, k_rank, classes, cls, by_bytes), k_rank):
        out = _redeal(ph, profile, classes, cls, by_bytes, cap)
        if out is not None and moved_bytes(ph, out) < before:
            return out
    return dest


def _redeal(
    ph: PhaseArrays, k_rank: IntArray, classes: IntArray, cls: IntArray, by_bytes: IntArray, cap: float
) -> IntArray | None:
    """Deal the samples (class cls) to ranks with k_rank places each (of class k), node first; None if it fails."""
    n, num_ranks, rpn, num_nodes = ph.n, ph.num_ranks, ph.ranks_per_node, ph.num_nodes
    num_c = classes.size
    onode = ph.origin // rpn
    used = np.flatnonzero(k_rank > 0)
    rank_cls = np.searchsorted(classes, k_rank)
    place = np.zeros((num_ranks, num_c), dtype=np.int64)
    place[used, rank_cls[used]] = k_rank[used]
    # nodes
    node_places = place.reshape(num_nodes, rpn, num_c).sum(axis=1)
    own = np.bincount(onode * num_c + cls, minlength=num_nodes * num_c).reshape(num_nodes, num_c)
    kept = _stay_counts(own, node_places)
    # the samples that stay: per (node, class) the most bytes first
    o = _sort_by(onode * num_c + cls, num_nodes * num_c, by_bytes, n)
    key = onode[o] * num_c + cls[o]
    seg = np.searchsorted(key, key, side="left")
    stays = np.zeros(n, dtype=bool)
    stays[o] = (np.arange(n) - seg) < kept.reshape(-1)[key]
    node_of = onode.copy()
    go = np.flatnonzero(~stays)
    if go.size:
        x = _allocate(np.cumsum(node_places - kept, axis=1), np.bincount(cls[go], minlength=num_c))
        if int(x.sum()) != go.size:
            return None  # cannot happen when the reservations hold; never risk an invalid answer
        # places in (class, node) order against the samples by class: the i-th with the i-th
        go = go[np.argsort(cls[go], kind="stable")]
        node_of[go] = np.repeat(np.tile(np.arange(num_nodes), num_c), x.T.reshape(-1))
    # ranks: a rank has places of one class. Of the samples its node keeps, its own of exactly that
    # class stay first (most bytes first): a place of a sample's own class leaves Hall's condition
    # for the node's other samples as it was. Then its own of higher classes, as places are left;
    # a node where these would leave its other samples without places keeps only the first.
    rank_node = np.arange(num_ranks) // rpn
    home = node_of == onode
    rcls = rank_cls[ph.origin]
    on_rank = np.zeros(n, dtype=bool)
    left = k_rank.copy()
    for pick in (home & (cls == rcls), home & (cls > rcls)):
        cand = np.flatnonzero(pick)
        o = cand[_sort_by(ph.origin[cand], num_ranks, by_bytes[cand], n)]
        rseg = np.searchsorted(ph.origin[o], ph.origin[o], side="left")
        stay = o[(np.arange(o.size) - rseg) < left[ph.origin[o]]]
        on_rank[stay] = True
        left -= np.bincount(ph.origin[stay], minlength=num_ranks)
    exact = on_rank & (cls == rcls)
    room = k_rank - np.bincount(ph.origin[on_rank], minlength=num_ranks)
    by_class = np.bincount(rank_node * num_c + rank_cls, weights=room, minlength=num_nodes * num_c)
    rest = np.flatnonzero(~on_rank)
    need = np.bincount(node_of[rest] * num_c + cls[rest], minlength=num_nodes * num_c)
    short = np.cumsum(by_class.reshape(num_nodes, num_c), axis=1) < np.cumsum(need.reshape(num_nodes, num_c), axis=1)
    bad = np.asarray(short.any(axis=1), dtype=bool)
    if bad.any():
        on_rank &= exact | ~bad[node_of]
        room = k_rank - np.bincount(ph.origin[on_rank], minlength=num_ranks)
        rest = np.flatnonzero(~on_rank)
    out = np.where(on_rank, ph.origin, -1)
    if rest.size:
        # per node, its places by class (then rank) against its samples by class: the i-th with the i-th
        by_rank = np.argsort(rank_node * num_c + rank_cls, kind="stable")
        places = np.repeat(by_rank, room[by_rank])
        place_start = np.searchsorted(rank_node[places], np.arange(num_nodes))
        r_sorted = rest[_sort_by(node_of[rest] * num_c + cls[rest], num_nodes * num_c, rest, n)]
        g = node_of[r_sorted]
        within = np.arange(r_sorted.size) - np.searchsorted(g, g, side="left")
        if (np.bincount(g, minlength=num_nodes) > np.diff(np.append(place_start, places.size))).any():
            return None  # cannot happen when the node-level counts are right; never risk an invalid answer
        out[r_sorted] = places[place_start[g] + within]
    return out if _valid_at_cap(ph, out, cap) else None


def _valid_at_cap(ph: PhaseArrays, dest: IntArray, cap: float) -> bool:
    """Every sample on a rank, every rank at most cap (and max_tokens): the re-deal's own check."""
    if dest.size and (dest.min() < 0 or dest.max() >= ph.num_ranks):
        return False
    if float(rank_costs(ph, dest).max(initial=0.0)) > cap * (1 + 1e-9):
        return False
    return ph.spec.max_tokens is None or int(rank_tokens(ph, dest).max(initial=0)) <= ph.spec.max_tokens


def _runs_to_free_nodes(
    run: IntArray, node: IntArray, bytes_: IntArray, free_ranks: IntArray, num_runs: int
) -> IntArray:
    """Node of every run, at most free_ranks[m] on node m: each run to the node holding most of its bytes
    while that node has ranks free (runs with more bytes there first), the rest to the free ranks left."""
    num_nodes = free_ranks.size
    key = run * num_nodes + node
    uniq, inv = np.unique(key, return_inverse=True)
    w = np.bincount(inv, weights=bytes_)
    b, m = uniq // num_nodes, uniq % num_nodes  # by run, then node: each run's candidates are a segment
    seg = _segment_first(b)
    top = np.maximum.reduceat(w, seg) if seg.size else w
    is_top = w == np.repeat(top, np.diff(np.append(seg, b.size)))
    best = np.flatnonzero(is_top)[_segment_first(b[is_top])]  # per run its best node, ties the lowest
    rb, rm, rw = b[best], m[best], w[best]
    o = np.lexsort((rb, -rw, rm))  # per node, the runs that want it, most bytes first
    rb, rm = rb[o], rm[o]
    pos = np.arange(rb.size) - np.searchsorted(rm, rm, side="left")
    ok = pos < free_ranks[rm]
    out = np.full(num_runs, -1, dtype=np.int64)
    out[rb[ok]] = rm[ok]
    left = free_ranks - np.bincount(rm[ok], minlength=num_nodes)
    rest = np.repeat(np.arange(num_nodes), np.maximum(left, 0))
    out[out < 0] = rest[: int((out < 0).sum())]
    return out
