"""Re-deal a padded assignment's samples so that fewer bytes cross nodes, at the same cost cap.

A padded rank whose longest sample costs c holds at most k = floor(cap / c) samples (and
k × longest <= max_tokens), and any k samples that each allow k too keep it under the cap: within
such a class, samples are interchangeable. So `refill_padded` keeps only the multiset of the ranks'
classes, deals them to the nodes whose own samples fill them most, and re-deals the samples node
first, keeping enough places aside (Hall's condition) that the rest still fit. orch_padded.py runs
it on its runs; it is checked against the cap before it replaces them.
"""

from __future__ import annotations

import numpy as np

from orch.planner.balance.cost import IntArray, PhaseArrays, moved_bytes, rank_costs, rank_tokens
from orch.planner.balance.padded import run_capacity
from orch.planner.balance.topology import run_starts, segment_first

REFILL_MIN_CROSS = 0.06  # refill_padded leaves alone runs that cross at most this share of the bytes
_DEAL_BLOCK = 512  # entries _classes_to_nodes screens at once before walking them


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
    before = moved_bytes(ph.origin, dest, ph.bytes, ph.dp_per_node)
    if before.inter <= min_cross * float(ph.bytes.sum()):
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
    # a most-bytes-first order of the samples: `largest` (longest first) when bytes follow it
    top = int(ph.bytes.max())
    if largest is not None and largest.size == n and bool((np.diff(ph.bytes[largest]) <= 0).all()):
        by_bytes = largest
    elif (top + 1) * n < 1 << 62:  # unique keys: any sort is stable
        by_bytes = np.argsort((top - ph.bytes) * n + np.arange(n))
    else:
        by_bytes = np.argsort(-ph.bytes, kind="stable")
    # per (node, class), most bytes first: what both the deal of classes and the re-deal read
    by_node_class = _by_major(ph.origin // ph.dp_per_node * classes.size + cls, by_bytes)
    # the classes dealt to the nodes whose samples fill them most, else the ranks' own classes
    for profile in (_classes_to_nodes(ph, k_rank, classes, cls, by_node_class), k_rank):
        out = _redeal(ph, profile, classes, cls, by_bytes, by_node_class, cap)
        # fewer bytes across nodes, then inside them (MovedBytes compares inter first)
        if out is not None and moved_bytes(ph.origin, out, ph.bytes, ph.dp_per_node) < before:
            return out
    return dest


def _classes_to_nodes(
    ph: PhaseArrays, k_rank: IntArray, classes: IntArray, cls: IntArray, by_node_class: IntArray
) -> IntArray:
    """The same multiset of rank classes, dealt to the nodes whose own samples would fill them most.

    A rank of class j (k places) at node m would keep its node's k samples of class j with the
    most bytes (then the next k for a second such rank...): per (node, class, t-th rank) that is a
    gain in bytes. Greedy by gain, a node hosting at most R ranks and class j at most as many as
    dest had; classes left go to the nodes' places left. Inside a node, each hosted class goes to
    the rank with the most bytes of its own samples of that class (greedy, all nodes at once).
    Returns the new k per rank (0: an empty rank).
    """
    n, num_ranks, dpn, num_nodes = ph.n, ph.num_ranks, ph.dp_per_node, ph.num_nodes
    num_c = classes.size
    used = k_rank > 0
    per_class = np.bincount(np.searchsorted(classes, k_rank[used]), minlength=num_c)
    onode = ph.origin // dpn
    o = by_node_class
    key = onode[o] * num_c + cls[o]
    chunk = (np.arange(n) - run_starts(key)) // classes[cls[o]]
    near = chunk < dpn  # a node hosts at most R ranks of a class
    ekey = key[near] * dpn + chunk[near]  # sorted: key is, and chunk grows inside a key
    first = segment_first(ekey)
    uniq = ekey[first]
    gain = np.add.reduceat(ph.bytes[o][near], first).astype(np.float64) if first.size else np.zeros(0)
    e_node_a, e_cls_a = uniq // dpn // num_c, (uniq // dpn) % num_c
    e_node, e_cls = e_node_a.tolist(), e_cls_a.tolist()
    cls_left = per_class.tolist()
    # most bytes first, ties by (node, class, t): uniq is sorted, so a stable sort on -gain
    took = _deal(np.argsort(-gain, kind="stable"), e_node_a, e_cls_a, [dpn] * num_nodes, cls_left)
    hosted = np.full((num_nodes, dpn), -1, dtype=np.int64)
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
        num_nodes, dpn, num_c
    )
    w = np.take_along_axis(own, np.maximum(hosted, 0)[:, None, :].repeat(dpn, axis=1), axis=2)  # [m, rank, slot]
    w = np.where(hosted[:, None, :] >= 0, w + 1.0, 0.0).transpose(0, 2, 1).copy()  # [m, slot, rank]
    rank_of = np.full((num_nodes, dpn), -1, dtype=np.int64)
    nodes = np.arange(num_nodes)
    for _ in range(dpn):
        flat = np.argmax(w.reshape(num_nodes, -1), axis=1)
        a, b = np.divmod(flat, dpn)
        ok = w[nodes, a, b] >= 0
        rank_of[nodes[ok], a[ok]] = b[ok]
        w[nodes, a, :] = -1.0
        w[nodes, :, b] = -1.0
    out = np.zeros(num_ranks, dtype=np.int64)
    m_idx, slot = np.nonzero(hosted >= 0)
    out[m_idx * dpn + rank_of[m_idx, slot]] = classes[hosted[m_idx, slot]]
    return out


def _deal(order: IntArray, e_node: IntArray, e_cls: IntArray, node_left: list[int], cls_left: list[int]) -> list[int]:
    """Entries taken greedily in `order`, each using one of its node's and one of its class's places
    (node_left, cls_left: updated in place), until every class place is used.

    In blocks: entries whose node is full or whose class is used up when the block starts are
    dropped at once (places only shrink: the walk would skip them too), the rest walked one by one.
    """
    wanted = sum(cls_left)
    took: list[int] = []
    nodes, kinds = e_node.tolist(), e_cls.tolist()
    for lo in range(0, order.size, _DEAL_BLOCK):
        if len(took) == wanted:
            break
        blk = order[lo : lo + _DEAL_BLOCK]
        alive = (np.array(node_left)[e_node[blk]] > 0) & (np.array(cls_left)[e_cls[blk]] > 0)
        for e in blk[alive].tolist():
            m = nodes[e]
            if node_left[m]:
                j = kinds[e]
                if cls_left[j]:
                    node_left[m] -= 1
                    cls_left[j] -= 1
                    took.append(e)
                    if len(took) == wanted:
                        break
    return took


def _redeal(
    ph: PhaseArrays, k_rank: IntArray, classes: IntArray, cls: IntArray, by_bytes: IntArray,
    by_node_class: IntArray, cap: float,
) -> IntArray | None:  # fmt: skip
    """Deal the samples (class cls) to ranks with k_rank places each (of class k), node first; None if it fails.

    by_bytes: the samples most bytes first; by_node_class: the same, grouped by (node, class)."""
    n, num_ranks, dpn, num_nodes = ph.n, ph.num_ranks, ph.dp_per_node, ph.num_nodes
    num_c = classes.size
    onode = ph.origin // dpn
    used = np.flatnonzero(k_rank > 0)
    rank_cls = np.searchsorted(classes, k_rank)
    place = np.zeros((num_ranks, num_c), dtype=np.int64)
    place[used, rank_cls[used]] = k_rank[used]
    # nodes
    node_places = place.reshape(num_nodes, dpn, num_c).sum(axis=1)
    own = np.bincount(onode * num_c + cls, minlength=num_nodes * num_c).reshape(num_nodes, num_c)
    kept = _stay_counts(own, node_places)
    # the samples that stay: per (node, class) the most bytes first
    o = by_node_class
    key = onode[o] * num_c + cls[o]
    seg = run_starts(key)
    stays = np.zeros(n, dtype=bool)
    stays[o] = (np.arange(n) - seg) < kept.reshape(-1)[key]
    node_of = onode.copy()
    go = np.flatnonzero(~stays)
    if go.size:
        x = _allocate(np.cumsum(node_places - kept, axis=1), np.bincount(cls[go], minlength=num_c))
        if int(x.sum()) != go.size:
            return None  # cannot happen when the reservations hold; never risk an invalid answer
        # places in (class, node) order against the samples by class: the i-th with the i-th
        go = _by_major(cls, go)
        node_of[go] = np.repeat(np.tile(np.arange(num_nodes), num_c), x.T.reshape(-1))
    # ranks: a rank has places of one class. Of the samples its node keeps, its own of exactly that
    # class stay first (most bytes first): a place of a sample's own class leaves Hall's condition
    # for the node's other samples as it was. Then its own of higher classes, as places are left;
    # a node where these would leave its other samples without places keeps only the first.
    rank_node = np.arange(num_ranks) // dpn
    home = node_of == onode
    rcls = rank_cls[ph.origin]
    on_rank = np.zeros(n, dtype=bool)
    left = k_rank.copy()
    for pick in (home & (cls == rcls), home & (cls > rcls)):
        o = _by_major(ph.origin, by_bytes[pick[by_bytes]])  # by rank, most bytes first
        rseg = run_starts(ph.origin[o])
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
        r_sorted = _by_major(node_of * num_c + cls, rest)
        g = node_of[r_sorted]
        within = np.arange(r_sorted.size) - run_starts(g)
        if (np.bincount(g, minlength=num_nodes) > np.diff(np.append(place_start, places.size))).any():
            return None  # cannot happen when the node-level counts are right; never risk an invalid answer
        out[r_sorted] = places[place_start[g] + within]
    return out if _valid_at_cap(ph, out, cap) else None


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
        k = int(np.searchsorted(reach, need))  # bins before k give all their spare places, bin k the rest
        free[:k] -= spare[:k]
        if k < num_bins:
            free[k] -= need - (int(reach[k - 1]) if k else 0)
            need = 0
        elif num_bins:
            need -= int(reach[-1])
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
    # samples of classes <= J taken can never exceed any later room: suffix minimum (class-major rows)
    limit = np.ascontiguousarray(np.minimum.accumulate(room[:, ::-1], axis=1)[:, ::-1].T)
    xt = np.zeros((num_c, num_b), dtype=room.dtype)
    taken = np.zeros(num_b, dtype=np.int64)
    for j in np.flatnonzero(demand > 0).tolist():  # a class nobody asks for takes nothing
        avail = np.maximum(limit[j] - taken, 0)
        reach = np.cumsum(avail)
        # the bins in order, each as much as it has: bins before k give all they have, bin k the rest
        k = int(np.searchsorted(reach, demand[j]))
        t = xt[j]
        t[:k] = avail[:k]
        if k < num_b:
            t[k] = demand[j] - (reach[k - 1] if k else 0)
        taken += t
    return np.ascontiguousarray(xt.T)


def _by_major(major: IntArray, order: IntArray) -> IntArray:
    """`order` (sample indices) stably regrouped by major[sample] ascending: a linear radix sort when
    the keys fit 16 bits, else numpy's stable sort."""
    keys = major[order]
    if keys.size and int(keys.min()) >= 0 and int(keys.max()) < 1 << 16:
        keys = keys.astype(np.uint16)
    return order[np.argsort(keys, kind="stable")]


def _valid_at_cap(ph: PhaseArrays, dest: IntArray, cap: float) -> bool:
    """Every sample on a rank, every rank at most cap (and max_tokens): the re-deal's own check."""
    if dest.size and (dest.min() < 0 or dest.max() >= ph.num_ranks):
        return False
    if float(rank_costs(ph, dest).max(initial=0.0)) > cap * (1 + 1e-9):
        return False
    return ph.spec.max_tokens is None or int(rank_tokens(ph, dest).max(initial=0)) <= ph.spec.max_tokens
