"""`--mode orch` on a padded phase (rank cost = samples × cost(longest on the rank)): balanced at a
near-optimal cap, each node keeping its own samples where it can.

Any assignment whose every rank has samples × cost(longest) <= C is as balanced as the optimal
runs, with C = the optimum × (1 + SLACK). Node first: each node packs its own samples into greedy
runs at C and keeps its fullest runs (at most R, at least θ full); the rest form a pool packed by
the global greedy runs on the ranks left free, placed on nodes by bytes. θ is the smallest fill for
which the pool still fits (a bisection). Then only the ranks' padded classes are kept and the
samples are re-dealt node first (refill.py). Near-equal lengths must still share a rank at the
optimum, so dense padded batches still move many bytes (bench/bench_balance.py), and that is
intrinsic: bench/bench_padded_bound.py certifies (planner/research/cross_bound.py, a Lagrangian
bound over every assignment under the cap) that on its six audio cases any assignment at
C = optimum × 1.006 sends at least 0.28-0.40 × the paper mode's inter-node bytes, so no padded
dispatcher reaches paper / 4. Python loops run over runs and nodes, never once per sample.
"""

from __future__ import annotations

import numpy as np

from orch.planner.balance.cost import IntArray, PhaseArrays, rank_costs
from orch.planner.balance.padded import desc_order_then, greedy_starts_sorted, near_optimal_cap, node_runs, step_limits
from orch.planner.balance.refill import refill_padded
from orch.planner.balance.topology import SLACK, match_runs_to_ranks, segment_first

_THETA_LEVELS = 65  # fill quantiles tried for a padded node's kept runs (a bisection: about 6 tries)


def orch_padded(ph: PhaseArrays, slack: float = SLACK) -> IntArray:
    """Padded phase: any assignment whose every rank has samples × cost(longest) <= C is balanced at C.

    C <= the optimal padded cost × (1 + slack) (padded.near_optimal_cap). Node first: each node packs
    its own samples into greedy runs at C (padded.node_runs) and keeps its fullest runs, at most R,
    whose fill (own costs / C) is at least θ; everything else forms a pool, packed by the global greedy
    runs onto the ranks left free. θ is the smallest of a few fill quantiles for which the pool fits
    (θ above every fill keeps nothing: the global runs, always feasible). Pool runs go to the nodes
    with free ranks by bytes; each node's runs are then matched to its ranks.
    """
    n, num_ranks, dpn, num_nodes = ph.n, ph.num_ranks, ph.dp_per_node, ph.num_nodes
    if n == 0:
        return ph.origin.copy()
    costs, lengths, tokens = ph.costs, ph.lengths, ph.spec.max_tokens
    node = ph.origin // dpn
    # longest first; equal lengths grouped by node, so that consecutive pool runs gather one node's samples
    gd = desc_order_then(lengths, node, num_nodes)
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
        kept = (fill >= theta) & (rank_in_node < dpn)
        pool = ~kept[local_d]
        starts = greedy_starts_sorted(c_d[pool], steps[pool], cap, num_ranks - int(kept.sum()))
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
        free_ranks = dpn - np.bincount(run_node, minlength=num_nodes)
        pool_node = _runs_to_free_nodes(pool_run, node[pool_idx], ph.bytes[pool_idx], free_ranks, len(starts))
        run_of[pool_idx] = kept_ids.size + pool_run
        run_node = np.concatenate([run_node, pool_node])
    dest = match_runs_to_ranks(run_of, run_node, ph)
    # re-deal under the max the runs reached (<= cap): balance stays exactly as good
    return refill_padded(ph, dest, float(rank_costs(ph, dest).max(initial=0.0)), largest=gd)


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
    seg = segment_first(b)
    top = np.maximum.reduceat(w, seg) if seg.size else w
    is_top = w == np.repeat(top, np.diff(np.append(seg, b.size)))
    best = np.flatnonzero(is_top)[segment_first(b[is_top])]  # per run its best node, ties the lowest
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
