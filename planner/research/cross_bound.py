"""A certified lower bound on the inter-node bytes of any padded assignment under a cost cap C.

Used to judge `--mode orch` on padded phases (bench/bench_padded_bound.py): how many bytes must
cross nodes in ANY assignment whose every rank has samples × cost(longest) <= C? numpy only.

The relaxation. Classes split the lengths (class c: from lo[c] up to the next class's lo; by
default one class per distinct k, so k is exact). A rank whose longest sample has class c holds at
most k[c] = floor(C / cost(lo[c])) samples, all of class <= c (cost is non-decreasing in length, so
k[c] is at least what its real leader allows; the token cap is dropped). Take any assignment at C.
Node m keeps some of its own samples (on its own ranks) and exports the rest; its inter-node bytes
are exactly the bytes the nodes export. For every class t, an exported sample of class >= t lands
on a rank of class >= t, in a place that no sample kept by that rank's node takes, so

    (G_t)  Σ_m [ spare_m(>= t) + kept_m(>= t) ] >= need_t := samples of class >= t,

with spare_m(>= t) = Σ over node m's ranks of class >= t of (k[class] - own samples kept on it),
and kept_m(>= t) = node m's kept samples of class >= t. (Counting a rank's k places without taking
off the node's own samples on it, as a plain covering row would, is much weaker: a rank full of its
node's short samples would seem to offer its places to long samples from elsewhere.)

Dualising (G_t) with prices π_t >= 0 gives, for ANY π >= 0, the valid bound

    L(π) = total bytes + Σ_t π_t·need_t - Σ_m max over node m's R ranks (bytes kept + Σ_t π_t·cover_m,t)

(weak Lagrangian duality: the real assignment is one choice in every node's max). L(0) is the purely
local bound. Each node's max is exact over integer rank classes: with Π_c = Σ_{t<=c} π_t, a sample
kept on a rank of class c is worth bytes + Π_class - Π_c and a rank Π_c·k_c; values fall along the
node's samples longest first, so by exchange a rank keeps a contiguous segment [a, p) of them,
1 <= p - a <= k_c, with c >= class(a), segments in order, or nothing (worth max_c Π_c·k_c). A DP
over (ranks, position) × class, the best segment end by a sparse-table range maximum, all nodes of
a chunk at once in numpy. If bytes do not fall with length (here bytes ∝ tokens, so they do), each
sample's bytes become the most of any shorter-or-equal sample of its node: never less, so still valid.

Any classing gives a valid bound; the best π is searched outside (bench: column generation with
GLOP), every evaluated π being a certificate on its own. tests/unit/test_balance_bound.py checks
L(π) <= the brute-force optimum on small batches and <= what orch and paper send.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orch.planner.balance.cost import FloatArray, IntArray, PhaseArrays, sample_costs

_FUZZ = 1e-9  # k is rounded up at C = k·cost exactly: optimistic, so the bound stays valid


@dataclass(frozen=True)
class PaddedBoundModel:
    """The relaxation of one padded phase at cost cap C, ready for evaluate_bound."""

    lo: IntArray  # [T] shortest length of each class, increasing
    k: IntArray  # [T] places of a rank whose leader has class c
    need: IntArray  # [T] samples of class >= t
    total_bytes: float
    prefix: FloatArray  # [M, L + 1] per node, cumulative (monotone-ised) bytes of its samples longest first
    cls: IntArray  # [M, L] class of each of those samples (0 for padding)
    real: IntArray  # [M] samples of each node (the rest of its row is padding)
    dp_per_node: int


@dataclass(frozen=True)
class BoundEval:
    bound: float  # L(π): no assignment at the cap moves fewer inter-node bytes
    kept: FloatArray  # [M] bytes each node keeps in its best answer at π
    cover: IntArray  # [M, T] per node and class c: its spare places of rank class c + its kept samples of class c
    cover_above: FloatArray  # [T] Σ over nodes and classes >= t of cover: the covering row's left side


def _class_starts(distinct: IntArray, ph: PhaseArrays, cap: float, num_classes: int) -> IntArray:
    """Shortest length of each class, increasing: one class per distinct k = floor(C / cost(len)) (so k is exact
    for every leader), the shortest classes merged evenly if there are more than num_classes."""
    dcost = sample_costs(distinct, ph.spec)
    with np.errstate(divide="ignore", invalid="ignore"):
        kd = np.where(dcost > 0, np.floor(cap / dcost * (1 + _FUZZ)), -1.0)
    first = np.flatnonzero(np.concatenate([[True], kd[1:] != kd[:-1]]))  # k falls as length grows
    lo = distinct[first]
    if lo.size > num_classes:
        exact = num_classes // 2  # the longest classes stay exact: their k are small, an error there is large
        head = lo[: lo.size - exact]
        pick = np.unique(np.linspace(0, head.size - 1, num_classes - exact).round().astype(np.int64))
        lo = np.concatenate([head[pick], lo[lo.size - exact :]])
    return lo.astype(np.int64)


def build_padded_bound_model(ph: PhaseArrays, cap: float, num_classes: int = 256) -> PaddedBoundModel:
    """Classes by k (see _class_starts); any classing gives a valid bound, finer ones a tighter one."""
    dpn, num_nodes = ph.dp_per_node, ph.num_nodes
    lengths = ph.lengths
    lo = _class_starts(np.unique(lengths), ph, cap, num_classes)
    cls_of = np.searchsorted(lo, lengths, side="right") - 1
    lo_cost = sample_costs(lo, ph.spec)
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(lo_cost > 0, np.floor(cap / lo_cost * (1 + _FUZZ)), ph.n)
    k = np.minimum(k, max(ph.n, 1)).astype(np.int64)
    need = np.cumsum(np.bincount(cls_of, minlength=lo.size)[::-1])[::-1].astype(np.int64)
    node = ph.origin // dpn
    # per node: longest first, ties most bytes first
    order = np.lexsort((-ph.bytes, -lengths, node))
    s_node = node[order]
    per = np.bincount(s_node, minlength=num_nodes)
    width = int(per.max(initial=0))
    pos = np.arange(order.size) - np.searchsorted(s_node, s_node, side="left")
    b = np.zeros((num_nodes, width))
    c = np.zeros((num_nodes, width), dtype=np.int64)
    b[s_node, pos] = ph.bytes[order]
    c[s_node, pos] = cls_of[order]
    # bytes of a position: the most of any later (shorter or equal) sample of the node: non-increasing, never less
    b = np.maximum.accumulate(b[:, ::-1], axis=1)[:, ::-1] if width else b
    prefix = np.zeros((num_nodes, width + 1))
    np.cumsum(b, axis=1, out=prefix[:, 1:])
    return PaddedBoundModel(lo, k, need, float(ph.bytes.sum()), prefix, c, per.astype(np.int64), dpn)


def _node_best(
    v: FloatArray, real: IntArray, cls: IntArray, k: IntArray, pi_c: FloatArray, dpn: int
) -> tuple[FloatArray, IntArray, np.ndarray]:
    """Every node's best answer at prices π (see the module docstring), for a chunk of nodes.

    v[m, i]: worth of keeping sample i (its bytes + Π of its class), longest first, -inf past real[m].
    Returns (best worth per node, its cover per class [m, T], the samples it keeps [m, L]).
    """
    num_m, width = v.shape
    num_t = k.size
    value = k * pi_c  # a rank of class c kept for imports only
    best_c = int(np.argmax(value))
    v_star = float(value[best_c])
    vv = np.where(np.isfinite(v), v, 0.0)
    prefix = np.zeros((num_m, width + 1))
    np.cumsum(vv, axis=1, out=prefix[:, 1:])
    pos = np.arange(width + 1)
    # a rank of class c led at a holds samples a..p-1 (1 <= p - a <= k[c]); its value is
    # Π_c·k_c + Σ (v_i - Π_c) = Π_c·k_c - (V[a] - a·Π_c) + (V[p] - p·Π_c)
    base = prefix[:, None, :] - pos[None, None, :] * pi_c[None, :, None]  # [m, T, L + 1]
    ok_end = pos[None, :] <= real[:, None]  # [m, L + 1]
    a_idx = np.arange(width)
    hi_c = a_idx[:, None] + k[None, :]  # [L, T] last end allowed by k
    lead_ok = (np.arange(num_t)[None, None, :] >= cls[:, :, None]) & (k > 0)[None, None, :]
    lead_ok &= (a_idx[None, :] < real[:, None])[:, :, None]
    hi = np.minimum(hi_c[None, :, :], real[:, None, None])  # [m, L, T]
    lo = a_idx[None, :, None] + 1
    valid = lead_ok & (hi >= lo)
    length = np.where(valid, hi - lo + 1, 1)
    level = np.floor(np.log2(length)).astype(np.int64)
    lo_b = np.broadcast_to(lo, hi.shape)
    levels = int(np.log2(width + 1)) + 1 if width else 1
    m_i = np.arange(num_m)[:, None, None]
    t_i = np.arange(num_t)[None, None, :]
    f = np.zeros((num_m, width + 1))
    fs = [f]
    hs, args = [], []
    for _ in range(dpn):
        w = np.where(ok_end[:, None, :], base + f[:, None, :], -np.inf)  # [m, T, L + 1]
        st = np.empty((levels, *w.shape))  # st[j][..., p] = max of w[..., p : p + 2**j]
        st[0] = w
        for j in range(1, levels):
            span = 1 << (j - 1)
            st[j] = st[j - 1]
            np.maximum(st[j - 1][..., : width + 1 - span], st[j - 1][..., span:], out=st[j][..., : width + 1 - span])
        lo_s = np.where(valid, lo_b, 0)
        hi_s = np.where(valid, hi - (1 << level) + 1, 0)
        q = np.maximum(st[level, m_i, t_i, lo_s], st[level, m_i, t_i, hi_s])
        del st
        gain = value[None, None, :] - base[:, :, :width].transpose(0, 2, 1) + q  # [m, L, T]
        gain = np.where(valid, gain, -np.inf)
        a = np.argmax(gain, axis=2)
        h = np.take_along_axis(gain, a[:, :, None], axis=2)[:, :, 0]
        cand = np.empty((num_m, width + 1))
        cand[:, :width] = np.maximum(h, f[:, :width] + v_star)
        cand[:, width] = f[:, width] + v_star
        f = np.maximum.accumulate(cand[:, ::-1], axis=1)[:, ::-1]
        fs.append(f)
        hs.append(h)
        args.append(a)
    # back-track: ranks' classes, the samples each keeps, spare places
    cover = np.zeros((num_m, num_t), dtype=np.int64)
    kept_mask = np.zeros((num_m, width), dtype=bool)
    for m in range(num_m):
        i = 0
        for r in range(dpn, 0, -1):
            fr, fp, h, a = fs[r][m], fs[r - 1][m], hs[r - 1][m], args[r - 1][m]
            target = fr[i]
            tol = 1e-9 * max(abs(target), 1.0)
            cand = np.append(np.maximum(h, fp[:width] + v_star), fp[width] + v_star)
            j = i + int(np.argmax(cand[i:] >= target - tol))
            if j < width and h[j] >= fp[j] + v_star - tol:
                c = int(a[j])
                top = min(j + int(k[c]), int(real[m]))
                ends = np.arange(j + 1, top + 1)
                w = prefix[m, ends] - ends * pi_c[c] + fp[ends]
                p = int(ends[int(np.argmax(w))])
                kept_mask[m, j:p] = True
                cover[m, c] += int(k[c]) - (p - j)
                i = p
            else:
                cover[m, best_c] += int(k[best_c])
                i = j
    np.add.at(cover, (np.nonzero(kept_mask)[0], cls[kept_mask]), 1)
    return fs[dpn][:, 0], cover, kept_mask


def evaluate_bound(model: PaddedBoundModel, prices: FloatArray | None = None, chunk: int = 1 << 21) -> BoundEval:
    """L(π) for prices π >= 0 per class threshold, and every node's best answer at π."""
    num_t = model.lo.size
    if num_t == 0:  # no samples
        return BoundEval(0.0, np.zeros(model.cls.shape[0]), np.zeros((model.cls.shape[0], 0), np.int64), np.zeros(0))
    pi = np.zeros(num_t) if prices is None else np.maximum(np.asarray(prices, dtype=np.float64), 0.0)
    pi_c = np.cumsum(pi)  # Π_c = Σ_{t <= c} π_t: what one place (or sample) of class c counts for
    prefix, cls = model.prefix, model.cls
    num_nodes, width = cls.shape
    b = np.diff(prefix, axis=1)
    real = model.real
    v = np.where(np.arange(width)[None, :] < real[:, None], b + pi_c[cls], -np.inf)
    step = max(1, chunk // max(num_t * (width + 1), 1))
    top = np.zeros(num_nodes)
    cover = np.zeros((num_nodes, num_t), dtype=np.int64)
    kept = np.zeros(num_nodes)
    for s in range(0, num_nodes, step):
        sl = slice(s, min(s + step, num_nodes))
        f0, cov, mask = _node_best(v[sl], real[sl], cls[sl], model.k, pi_c, model.dp_per_node)
        top[sl], cover[sl] = f0, cov
        kept[sl] = np.where(mask, b[sl], 0.0).sum(axis=1)
    cover_above = np.cumsum(cover.sum(axis=0)[::-1])[::-1].astype(np.float64)
    bound = model.total_bytes + float(pi @ model.need) - float(top.sum())
    return BoundEval(bound=bound, kept=kept, cover=cover, cover_above=cover_above)


def padded_cross_bound(ph: PhaseArrays, cap: float, prices: FloatArray | None = None, num_classes: int = 256) -> float:
    """max(L(π), 0): bytes that must cross nodes at cost cap `cap`; π = 0 (default) is the local bound."""
    if ph.n == 0:
        return 0.0
    model = build_padded_bound_model(ph, cap, num_classes)
    return max(evaluate_bound(model, prices).bound, 0.0)
