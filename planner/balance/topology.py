"""What the topology-first dispatchers (`--mode orch`) share: the slack, sorted-segment helpers, and
runs matched to ranks inside nodes.

The paper balances first and then chooses which rank gets which balanced bucket; its buckets mix
samples from every node, so most bytes cross nodes whatever the assignment. `--mode orch` puts the
cost cap first (C = a bound × (1 + SLACK)) and keeps samples where they are unless they must go:
orch_unpadded.py for phases whose rank cost is a sum of sample costs, orch_padded.py (with
refill.py) for padded phases, where a rank costs samples × cost(longest).
"""

from __future__ import annotations

import numpy as np

from orch.planner.balance.cost import IntArray, PhaseArrays

SLACK = 0.006  # target max cost = lower bound × (1 + SLACK): room that lets samples stay home


def segment_first(keys: IntArray) -> IntArray:
    """Indices where a run of equal keys starts, for a sorted key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]]))


def segment_last(keys: IntArray) -> IntArray:
    """Indices where a run of equal keys ends, for a sorted key array."""
    if keys.size == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate([keys[1:] != keys[:-1], [True]]))


def run_starts(keys: IntArray) -> IntArray:
    """For a sorted key array, where the run of equal keys holding each element starts: what
    np.searchsorted(keys, keys, side="left") gives, in linear time."""
    first = segment_first(keys)
    return np.repeat(first, np.diff(np.append(first, keys.size)))


def match_runs_to_ranks(run: IntArray, run_node: IntArray, ph: PhaseArrays) -> IntArray:
    """Rank of every sample, given its run and each run's node (at most R runs per node).

    Inside each node, greedy max-overlap matching of runs to ranks: the pair (run, rank) with the
    most bytes of the run already on the rank first, vectorised over nodes.
    """
    dpn, num_nodes = ph.dp_per_node, ph.num_nodes
    num_runs = run_node.size
    # local index of each run inside its node
    order = np.lexsort((np.arange(num_runs), run_node))
    local = np.empty(num_runs, dtype=np.int64)
    first = np.searchsorted(run_node[order], run_node[order], side="left")
    local[order] = np.arange(num_runs) - first
    if num_runs and local.max() >= dpn:
        raise AssertionError("more runs than ranks on a node")
    s_node = run_node[run]
    same = ph.origin // dpn == s_node
    key = (s_node * dpn + local[run]) * dpn + ph.origin % dpn
    size = num_nodes * dpn * dpn
    # + 1: every pair is allowed; ties keep order
    w = (np.bincount(key[same], weights=ph.bytes[same], minlength=size) + 1.0).reshape(num_nodes, dpn, dpn)
    rank_of_local = np.full((num_nodes, dpn), -1, dtype=np.int64)
    nodes = np.arange(num_nodes)
    for _ in range(dpn):
        flat = np.argmax(w.reshape(num_nodes, -1), axis=1)
        a, b = np.divmod(flat, dpn)
        rank_of_local[nodes, a] = b
        w[nodes, a, :] = -1.0
        w[nodes, :, b] = -1.0
    return s_node * dpn + rank_of_local[s_node, local[run]]
