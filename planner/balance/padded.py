"""Padded phases: binary search on the cost cap with a greedy feasibility check over sorted lengths.

A padded rank costs (samples on it) × cost(longest on it). With lengths sorted longest first,
some optimal answer puts consecutive runs on each rank (swap a long sample into the run of its
leader and nothing gets worse), and for a cap C the greedy that makes each run as long as
C / cost(leader) allows (and the token cap: samples × leader length <= max_tokens) uses the
fewest runs. So feasibility is exact, and the optimum is one of the values k·cost(L): bisect on C,
then finish exactly over the candidates left in the last interval.
"""

from __future__ import annotations

import math

import numpy as np

from orch.planner.balance.cost import FloatArray, IntArray
from orch.planner.errors import InfeasibleError

_FUZZ = 1e-12  # so that C = k·c exactly still allows k samples despite rounding


def _jumps(costs_desc: FloatArray, lengths_desc: IntArray, cap: float, max_tokens: int | None) -> list[int]:
    """nxt[j]: where the run led by sample j ends when the cost cap is `cap` (j itself if it cannot lead)."""
    n = costs_desc.size
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(costs_desc > 0, np.floor(cap / costs_desc * (1 + _FUZZ)), n)
    k = np.minimum(k, n)
    if max_tokens is not None:
        k = np.minimum(k, max_tokens // np.maximum(lengths_desc, 1))
    nxt = np.minimum(np.arange(n) + k.astype(np.int64), n)
    out: list[int] = nxt.tolist()
    return out


def _runs(nxt: list[int], limit: int) -> list[int] | None:
    """Run starts of the greedy, or None if it needs more than `limit` runs or a sample cannot lead one."""
    n = len(nxt)
    starts: list[int] = []
    i = 0
    while i < n:
        if len(starts) == limit:
            return None
        j = nxt[i]
        if j == i:
            return None
        starts.append(i)
        i = j
    return starts


def _feasible(costs_desc: FloatArray, lengths_desc: IntArray, cap: float, n_ranks: int, max_tokens: int | None) -> bool:
    nxt = _jumps(costs_desc, lengths_desc, cap, max_tokens)
    n = len(nxt)
    i = 0
    for _ in range(n_ranks):
        j = nxt[i]
        if j == i:
            return False
        if j >= n:
            return True
        i = j
    return n == 0


def _achieved(costs_desc: FloatArray, starts: list[int], n: int) -> float:
    s = np.array([*starts, n])
    return float((np.diff(s) * costs_desc[s[:-1]]).max(initial=0.0))


def optimal_cap(costs_desc: FloatArray, lengths_desc: IntArray, num_ranks: int, max_tokens: int | None) -> float:
    """The smallest max padded rank cost; samples given longest first."""
    n = costs_desc.size
    if n == 0:
        return 0.0
    if not _feasible(costs_desc, lengths_desc, math.inf, num_ranks, max_tokens):
        raise InfeasibleError(f"no assignment of {n} samples to {num_ranks} ranks meets max_tokens {max_tokens}")
    lo = max(float(costs_desc.sum()) / num_ranks, float(costs_desc[0]))
    if _feasible(costs_desc, lengths_desc, lo, num_ranks, max_tokens):
        return _achieved(costs_desc, _runs(_jumps(costs_desc, lengths_desc, lo, max_tokens), num_ranks) or [], n)
    hi = lo * 2 if lo > 0 else 1.0
    while not _feasible(costs_desc, lengths_desc, hi, num_ranks, max_tokens):
        lo, hi = hi, hi * 2
    while hi > lo * (1 + 1e-3):
        mid = (lo + hi) / 2
        if _feasible(costs_desc, lengths_desc, mid, num_ranks, max_tokens):
            hi = mid
        else:
            lo = mid
    starts = _runs(_jumps(costs_desc, lengths_desc, hi, max_tokens), num_ranks)
    assert starts is not None
    hi = _achieved(costs_desc, starts, n)
    # every run costs k·cost(leader): the optimum is such a value in (lo, hi]
    ks = np.floor(hi / costs_desc * (1 + _FUZZ))
    cand = ks * costs_desc
    cand = np.unique(cand[(ks >= 1) & (cand > lo) & (cand <= hi)])
    left, right = 0, cand.size - 1  # cand[right] == hi is feasible
    while left < right:
        mid_i = (left + right) // 2
        if _feasible(costs_desc, lengths_desc, float(cand[mid_i]), num_ranks, max_tokens):
            right = mid_i
        else:
            left = mid_i + 1
    return float(cand[right]) if cand.size else hi


def padded_runs(
    costs: FloatArray, lengths: IntArray, num_ranks: int, max_tokens: int | None, cap: float | None = None
) -> IntArray:
    """Run (bucket) index per sample at the optimal cap (or `cap`): at most num_ranks runs."""
    order = np.lexsort((np.arange(lengths.size), -lengths))
    costs_desc, lengths_desc = costs[order], lengths[order]
    if cap is None:
        cap = optimal_cap(costs_desc, lengths_desc, num_ranks, max_tokens)
    starts = _runs(_jumps(costs_desc, lengths_desc, cap, max_tokens), num_ranks)
    if starts is None:
        raise InfeasibleError(f"no assignment of {lengths.size} samples to {num_ranks} ranks meets cost cap {cap:g}")
    run_desc = np.zeros(lengths.size, dtype=np.int64)
    if starts:
        marks = np.zeros(lengths.size, dtype=np.int64)
        marks[np.array(starts[1:], dtype=np.int64)] = 1
        run_desc = np.cumsum(marks)
    runs = np.empty(lengths.size, dtype=np.int64)
    runs[order] = run_desc
    return runs


def run_capacity(costs: FloatArray, lengths: IntArray, cap: float, max_tokens: int | None) -> IntArray:
    """Samples a run led by each sample may hold under the cost cap and the token cap."""
    n = costs.size
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(costs > 0, np.floor(cap / costs * (1 + _FUZZ)), max(n, 1))
    k = np.minimum(k, max(n, 1))
    if max_tokens is not None:
        k = np.minimum(k, max_tokens // np.maximum(lengths, 1))
    return k.astype(np.int64)


def group_runs(
    costs: FloatArray, lengths: IntArray, group: IntArray, num_groups: int, cap: float, max_tokens: int | None
) -> tuple[IntArray, IntArray]:
    """Greedy runs at cap C inside each group (e.g. each node) separately.

    Returns (run index per sample, numbered consecutively across groups; runs per group).
    """
    order = np.lexsort((np.arange(lengths.size), -lengths, group))
    costs_desc, lengths_desc, g_sorted = costs[order], lengths[order], group[order]
    n = lengths.size
    k = run_capacity(costs_desc, lengths_desc, cap, max_tokens)
    if n and k.min() < 1:
        raise InfeasibleError(f"a sample costs more than the cap {cap:g}")
    # a run may not cross into the next group
    group_end = np.searchsorted(g_sorted, g_sorted, side="right")
    nxt = np.minimum(np.arange(n) + k.astype(np.int64), group_end).tolist()
    run_desc = np.empty(n, dtype=np.int64)
    per_group = np.zeros(num_groups, dtype=np.int64)
    gs = g_sorted.tolist()
    i = 0
    run = -1
    while i < n:
        run += 1
        j = nxt[i]
        run_desc[i:j] = run
        per_group[gs[i]] += 1
        i = j
    runs = np.empty(n, dtype=np.int64)
    runs[order] = run_desc
    return runs, per_group
