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
4. a local search (greedy.improve) brings the max back to C, preferring ranks of the same node.
If C is out of reach (coarse batches), the best global heuristic sets it: M = the better of what
was reached and LPT, and a second pass runs against M × (1 + SLACK), so nodes keep their samples up
to that cap (R × the cap per node). If a few ranks stay over, `repair` moves or swaps samples of the
max rank with any rank that has room, fewest inter-node bytes first, until every rank is under it.
If that falls short too, LPT's own buckets (placed topology-aware) are the fallback: the max is
never above LPT's × (1 + SLACK).

One sort per phase (largest first) feeds every later ordering: a bin-then-size order is one
argsort of unique int64 keys. Python loops run over rounds, nodes or a few leftovers, never once
per sample (except exact LPT, the reference when the bound is out of reach).
"""

from __future__ import annotations

import numpy as np

from orch.planner.balance.cost import FloatArray, IntArray, PhaseArrays, lower_bound
from orch.planner.balance.greedy import improve, lpt, lpt_rounds, move_sample
from orch.planner.balance.padded import desc_order
from orch.planner.balance.topology import SLACK, match_runs_to_ranks, segment_first, segment_last
from orch.planner.errors import InfeasibleError

EXACT_LPT_SAMPLES = 1 << 20  # exact LPT as the fallback reference up to here (about 1 µs a sample)
_MAX_ROUNDS = 64
_REPAIR_ITERS = 4096


def _by_bin(pos: IntArray, home: IntArray) -> IntArray:
    """Indices of the samples with home >= 0, by bin, largest first inside a bin, ties by index.

    pos[i]: sample i's place in the phase's largest-first order (computed once per phase), so one
    argsort of unique int64 keys replaces a three-key lexsort.
    """
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
    first = segment_first(s_bin)
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
    items: IntArray, node_of: IntArray, origin: IntArray, dpn: int, costs: FloatArray, lengths: IntArray,
    room: FloatArray, token_room: FloatArray, dest: IntArray, pos: IntArray,
) -> IntArray:  # fmt: skip
    """Best fit decreasing inside each node, all nodes at once: per round every node places its largest
    pending sample on its rank with the least room that still fits it. Returns the samples that fit nowhere."""
    if items.size == 0:
        return items
    o = np.argsort(node_of[items] * max(pos.size, 1) + pos[items])
    p, g = items[o], node_of[items][o]
    first = segment_first(g)
    nodes = g[first]
    ptr = first.copy()
    end = np.append(first[1:], p.size)
    room2 = room.reshape(-1, dpn)
    troom2 = token_room.reshape(-1, dpn)
    tol = 1e-9 * max(float(np.abs(room).max(initial=1.0)), 1.0)
    # per item, gathered once: cost, tokens, and its own rank inside the node (-1: another node)
    c_all, l_all = costs[p], lengths[p]
    own_all = np.where(origin[p] // dpn == g, origin[p] % dpn, -1)
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
        to = m[ok] * dpn + j[ok]
        dest[it[ok]] = to
        room[to] -= c[ok]
        token_room[to] -= ln[ok]
        if not ok.all():
            unplaced.append(it[~ok])
        ptr[active] += 1
        active = active[ptr[active] < end[active]]
    return np.concatenate(unplaced) if unplaced else np.zeros(0, dtype=np.int64)


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


def _to_nodes(ph: PhaseArrays, node_cap: float, evictable: np.ndarray, pos: IntArray) -> tuple[np.ndarray, IntArray]:
    """Node-level balance: only a node's excess over node_cap leaves it, to nodes with room.

    Returns (the samples that stay on their node, every sample's node).
    """
    dpn, num_nodes = ph.dp_per_node, ph.num_nodes
    costs, lengths = ph.costs, ph.lengths
    max_tokens = float(ph.spec.max_tokens) if ph.spec.max_tokens is not None else np.inf
    node = ph.origin // dpn
    at_home = _evict(costs, lengths, node, num_nodes, node_cap, dpn * max_tokens, evictable, pos)
    node_of = node.copy()
    room_n = node_cap - np.bincount(node[at_home], weights=costs[at_home], minlength=num_nodes)
    troom_n = dpn * max_tokens - np.bincount(node[at_home], weights=lengths[at_home], minlength=num_nodes)
    out = np.flatnonzero(~at_home)
    left = _match(out, pos, costs, lengths, room_n, troom_n, node_of)
    _place_leftovers(left, np.zeros(ph.n, dtype=np.int64), num_nodes, costs, lengths, room_n, troom_n, node_of)
    return at_home, node_of


def _orch_at_cap(ph: PhaseArrays, cap: float, node_cap: float, pos: IntArray, target: float | None = None) -> IntArray:
    num_ranks, dpn = ph.num_ranks, ph.dp_per_node
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
    left = _best_fit_in_nodes(items, node_of, origin, dpn, costs, lengths, room, token_room, dest, pos)
    members_of = _rank_members(dest, pos, np.unique(node_of[left]), dpn, num_ranks) if left.size else None
    for _ in range(4):  # a sample no rank of its node has room for displaces smaller ones, which then re-pack
        if left.size == 0 or members_of is None:
            break
        bumped = _displace(left, node_of, dpn, costs, lengths, room, token_room, dest, pos, members_of)
        left = _best_fit_in_nodes(bumped, node_of, origin, dpn, costs, lengths, room, token_room, dest, pos)
    # 3. what the node could not absorb goes to any rank with room
    left = _match(left, pos, costs, lengths, room, token_room, dest)
    _place_leftovers(left, node_of, dpn, costs, lengths, room, token_room, dest)
    # 4. local search on the max rank
    tokens = None if ph.spec.max_tokens is None else ph.spec.max_tokens
    return improve(costs, dest, num_ranks, dpn, cap if target is None else target, lengths=lengths, cap=tokens)


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
    dpn = ph.dp_per_node
    largest = desc_order(ph.lengths)  # cost is non-decreasing in length: one sort per phase
    pos = np.empty(ph.n, dtype=np.int64)
    pos[largest] = np.arange(ph.n)
    # the same order by cost, ties by index, when cost strictly increases with length
    by_cost = largest if ph.spec.linear > 0 or ph.spec.quadratic > 0 else None
    cap = lb * (1 + slack)
    dest = _orch_at_cap(ph, cap, dpn * (mean + 0.5 * (cap - mean)), pos)
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
    again = _orch_at_cap(ph, loose, dpn * loose, pos, target=target)
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
