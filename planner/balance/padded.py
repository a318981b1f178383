"""Padded phases: binary search on the cost cap with a greedy feasibility check over sorted lengths.

A padded rank costs (samples on it) × cost(longest on it). With lengths sorted longest first,
some optimal answer puts consecutive runs on each rank (swap a long sample into the run of its
leader and nothing gets worse), and for a cap C the greedy that makes each run as long as
C / cost(leader) allows (and the token cap: samples × leader length <= max_tokens) uses the
fewest runs. So feasibility is exact, and the optimum is one of the values k·cost(L): bisect on C,
then finish exactly over the candidates left in the last interval.

`--mode orch` needs less: a cap within (1 + slack) of the optimum (near_optimal_cap, a bracket
search that walks only the runs' leaders, greedy_starts; on arrays, greedy_starts_sorted and
run_count_sorted walk a block of equal run lengths per step), and each node's own greedy runs
(node_runs) to keep samples at home (orch_padded.py).
"""

from __future__ import annotations

import math
from bisect import bisect_right

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


def run_capacity(
    costs: FloatArray, lengths: IntArray, cap: float, max_tokens: int | None, limit: int | None = None
) -> IntArray:
    """Samples a run led by each sample may hold under the cost cap and the token cap, at most `limit`
    (default: the number of samples given; pass the phase's sample count when giving only leaders)."""
    n = costs.size if limit is None else limit
    with np.errstate(divide="ignore", invalid="ignore"):
        k = np.where(costs > 0, np.floor(cap / costs * (1 + _FUZZ)), max(n, 1))
    k = np.minimum(k, max(n, 1))
    if max_tokens is not None:
        k = np.minimum(k, max_tokens // np.maximum(lengths, 1))
    return k.astype(np.int64)


def desc_order(lengths: IntArray, group: IntArray | None = None) -> IntArray:
    """Indices by (group,) length longest first, ties by index: stable radix sorts when lengths fit 16
    bits (and groups 15), else one int64 argsort instead of a lexsort."""
    n = lengths.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    top = int(lengths.max())
    if _radix_ok(lengths, top) and (group is None or _radix_ok(group, int(group.max()), 15)):
        order = np.argsort((top - lengths).astype(np.uint16), kind="stable")
        if group is not None:
            order = order[np.argsort(group[order].astype(np.int16), kind="stable")]
        return order.astype(np.int64)
    groups = int(group.max()) + 1 if group is not None and n else 1
    if (top + 1) * n * groups >= 1 << 62:  # the packed key would overflow: the slow exact path
        keys = (np.arange(n), -lengths) if group is None else (np.arange(n), -lengths, group)
        return np.lexsort(keys).astype(np.int64)
    key = (top - lengths.astype(np.int64)) * n + np.arange(n, dtype=np.int64)
    if group is not None:
        key = key + group.astype(np.int64) * ((top + 1) * n)
    return np.argsort(key).astype(np.int64)  # keys are unique: any sort is stable


def desc_order_then(lengths: IntArray, minor: IntArray, span: int) -> IntArray:
    """Indices by length longest first, then minor (0..span-1) ascending, then index: what
    desc_order(lengths · span + (span - 1 - minor)) gives, by two stable radix sorts when they fit."""
    n = lengths.size
    if n and _radix_ok(lengths, int(lengths.max())) and _radix_ok(minor, span - 1, 15):
        order = np.argsort(minor.astype(np.int16), kind="stable")
        return order[np.argsort((int(lengths.max()) - lengths[order]).astype(np.uint16), kind="stable")].astype(
            np.int64
        )
    return desc_order(lengths * span + (span - 1 - minor))


def _radix_ok(values: IntArray, top: int, bits: int = 16) -> bool:
    """Whether non-negative values up to top sort as 16-bit keys (numpy's stable sort is a radix sort there)."""
    return top < (1 << bits) and bool(values.min() >= 0)


def node_runs(
    costs: FloatArray, lengths: IntArray, node: IntArray, num_nodes: int, cap: float, max_tokens: int | None
) -> tuple[IntArray, IntArray, FloatArray]:
    """The greedy runs each node makes of its own samples at cost cap C (longest first, each run as long
    as the cap allows): (run per sample, node per run, fill per run = its samples' own costs / C).

    All nodes walk their runs side by side: a numpy step per run of the node with the most runs.
    """
    n = lengths.size
    order = desc_order(lengths, node)
    c_s, l_s, g_s = costs[order], lengths[order], node[order]
    k = np.maximum(run_capacity(c_s, l_s, cap, max_tokens), 1)
    group_end = np.searchsorted(g_s, g_s, side="right")
    nxt = np.minimum(np.arange(n) + k, group_end)
    # every node walks its runs at once: a round per run of the node with the most
    ptr = np.flatnonzero(np.concatenate([[True], g_s[1:] != g_s[:-1]])) if n else np.zeros(0, dtype=np.int64)
    end = group_end[ptr]
    leaders = []
    while ptr.size:
        leaders.append(ptr)
        ptr = nxt[ptr]
        alive = ptr < end
        ptr, end = ptr[alive], end[alive]
    st = np.sort(np.concatenate(leaders)) if leaders else np.zeros(0, dtype=np.int64)
    marks = np.zeros(n, dtype=np.int64)
    marks[st] = 1
    run_s = np.cumsum(marks) - 1
    runs = np.empty(n, dtype=np.int64)
    runs[order] = run_s
    fill = np.bincount(run_s, weights=c_s, minlength=st.size) / cap if cap > 0 else np.ones(st.size)
    return runs, g_s[st].astype(np.int64), fill


def step_limits(lengths: IntArray, max_tokens: int | None, limit: int) -> IntArray:
    """Samples a run led by each sample may hold under the token cap alone (at most `limit`)."""
    if max_tokens is None:
        return np.full(lengths.size, max(limit, 1), dtype=np.int64)
    return np.minimum(max_tokens // np.maximum(lengths, 1), max(limit, 1)).astype(np.int64)


def greedy_starts(costs_desc: list[float], steps: list[int], cap: float, limit: int) -> list[int] | None:
    """Starts of the greedy runs at cost cap C over samples given longest first (each run as long as C and
    `steps` allow), or None if more than `limit` runs are needed or a sample alone costs more than C.

    A Python step per run and nothing per sample: a run led by sample i ends at
    i + min(floor(C / cost_i), steps_i), computed only for the leaders. Lists, not arrays: item access
    on a list is several times faster, and the caller converts once.
    """
    n = len(costs_desc)
    top = cap * (1 + _FUZZ)
    starts: list[int] = []
    append = starts.append
    runs = 0
    i = 0
    while i < n:
        if runs == limit:
            return None
        ci, k = costs_desc[i], steps[i]
        if ci > 0 and top < ci * k:
            k = int(top / ci)
        if k < 1:  # over the cost cap, or over max_tokens, alone
            return None
        append(i)
        runs += 1
        i += k
    return starts


def _run_count(costs_desc: list[float], steps: list[int], cap: float, limit: int, same_until: list[int]) -> int:
    """Greedy runs at cost cap C (as greedy_starts), counted up to limit + 1; n + 1 if a sample alone is over C.

    same_until[i]: where the block of samples with sample i's cost and step ends (_blocks). Inside such
    a block every leader allows the same k samples, so m whole runs are one step: clipped lengths
    (a cap at 576 or 1500 tokens) make blocks of thousands of samples.
    """
    n = len(costs_desc)
    top = cap * (1 + _FUZZ)
    runs = 0
    i = 0
    while i < n:
        if runs > limit:
            return limit + 1
        ci, k = costs_desc[i], steps[i]
        if ci > 0 and top < ci * k:
            k = int(top / ci)
        if k < 1:
            return n + 1
        m = (same_until[i] - i) // k
        if m > 1:
            runs += m
            i += m * k
        else:
            runs += 1
            i += k
    return min(runs, limit + 1)


def _blocks(costs_desc: FloatArray, steps: IntArray) -> list[int]:
    """same_until[i]: the end (exclusive) of the run of equal (cost, step) that holds sample i."""
    n = costs_desc.size
    change = np.flatnonzero((costs_desc[1:] != costs_desc[:-1]) | (steps[1:] != steps[:-1])) + 1
    ends = np.append(change, n)
    out: list[int] = ends[np.searchsorted(ends, np.arange(n), side="right")].tolist()
    return out


def _leader_steps(costs_desc: FloatArray, steps: IntArray, cap: float) -> IntArray:
    """Samples the run led by each sample holds at cost cap C, as greedy_starts computes it for a leader."""
    top = cap * (1 + _FUZZ)
    st = steps.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        shrink = (costs_desc > 0) & (top < costs_desc * st)
        k = np.where(shrink, np.floor(np.where(shrink, top / np.where(costs_desc > 0, costs_desc, 1.0), 0.0)), st)
    return k.astype(np.int64)


def _segments(k: IntArray) -> tuple[list[int], list[int], list[int]] | None:
    """(start, end, k) of the runs of equal k, or None when k is not non-decreasing."""
    n = k.size
    change = np.flatnonzero(k[1:] != k[:-1]) + 1
    if change.size and bool((k[change] < k[change - 1]).any()):
        return None
    bounds = np.concatenate([[0], change, [n]])
    return bounds[:-1].tolist(), bounds[1:].tolist(), k[bounds[:-1]].tolist()


def greedy_starts_sorted(costs_desc: FloatArray, steps: IntArray, cap: float, limit: int) -> list[int] | None:
    """greedy_starts on arrays, a Python step per block of equal run length instead of per run.

    Samples longest first have non-increasing costs and non-decreasing token steps, so the run length
    k of a leader never decreases along the order: inside a block of samples that all allow the same
    k, the leaders are i, i + k, i + 2k, ... up to the block's end, one range per block. The same
    answer as greedy_starts (checked by tests); it falls back to it if k ever decreases.
    """
    n = costs_desc.size
    if n == 0:
        return []
    segs = _segments(_leader_steps(costs_desc, steps, cap))
    if segs is None:
        return greedy_starts(costs_desc.tolist(), steps.tolist(), cap, limit)
    seg_start, seg_end, seg_k = segs
    starts: list[int] = []
    runs = i = s = 0
    while i < n:
        if i >= seg_end[s]:
            s = bisect_right(seg_start, i) - 1
        k = seg_k[s]
        if k < 1:  # over the cost cap, or over max_tokens, alone
            return None
        m = -(-(seg_end[s] - i) // k)  # leaders in this block
        if runs + m > limit:
            return None
        starts.extend(range(i, i + m * k, k))
        runs += m
        i += m * k
    return starts


def run_count_sorted(costs_desc: FloatArray, steps: IntArray, cap: float, limit: int) -> int:
    """_run_count on arrays by blocks of equal run length (as greedy_starts_sorted): runs counted up to
    limit + 1; n + 1 if a sample alone is over C."""
    n = costs_desc.size
    segs = _segments(_leader_steps(costs_desc, steps, cap))
    if segs is None:
        return _run_count(costs_desc.tolist(), steps.tolist(), cap, limit, _blocks(costs_desc, steps))
    seg_start, seg_end, seg_k = segs
    runs = i = s = 0
    while i < n:
        if runs > limit:
            return limit + 1
        if i >= seg_end[s]:
            s = bisect_right(seg_start, i) - 1
        k = seg_k[s]
        if k < 1:
            return n + 1
        m = -(-(seg_end[s] - i) // k)
        runs += m
        i += m * k
    return min(runs, limit + 1)


def near_optimal_cap(
    costs_desc: FloatArray, lengths_desc: IntArray, num_ranks: int, max_tokens: int | None, slack: float
) -> float:
    """A cost cap C the greedy runs meet on num_ranks ranks with C <= optimum × (1 + slack).

    A bracket search on the run count: the next cap is interpolated between a cap needing too many
    runs and one needing few enough (every other step a plain bisection, so the bracket at least
    halves every two steps), stopping once it is a quarter of the slack wide: a handful of Python
    walks over the runs, no exact search.
    """
    n = costs_desc.size
    if n == 0:
        return 0.0
    steps = step_limits(lengths_desc, max_tokens, n)
    if greedy_starts_sorted(costs_desc, steps, math.inf, num_ranks) is None:
        raise InfeasibleError(f"no assignment of {n} samples to {num_ranks} ranks meets max_tokens {max_tokens}")
    lo = max(float(costs_desc.sum()) / num_ranks, float(costs_desc[0]))  # no cap below is feasible
    if lo <= 0:
        return 0.0
    count_limit = 2 * num_ranks
    q_lo = run_count_sorted(costs_desc, steps, lo, count_limit)
    if q_lo <= num_ranks:
        return lo * (1 + slack)
    # grow hi by the runs' excess until feasible: the run count falls roughly as 1 / C
    hi = lo
    while True:
        hi = hi * max(min(q_lo, count_limit) / num_ranks, 1 + slack) * (1 + slack)
        q_hi = run_count_sorted(costs_desc, steps, hi, count_limit)
        if q_hi <= num_ranks:
            break
        lo, q_lo = hi, q_hi
    # invariant: lo infeasible (the optimum is above it), hi feasible; stop at a quarter of the slack
    # and return lo × (1 + slack): at least hi (feasible), at most the optimum × (1 + slack)
    interpolate = True
    while hi > lo * (1 + slack / 4):
        if interpolate and q_lo > q_hi:
            frac = (min(q_lo, count_limit) - num_ranks) / (min(q_lo, count_limit) - q_hi)
            mid = lo + (hi - lo) * min(max(frac, 0.1), 0.9)
        else:
            mid = math.sqrt(lo * hi)
        interpolate = not interpolate
        q_mid = run_count_sorted(costs_desc, steps, mid, count_limit)
        if q_mid > num_ranks:
            lo, q_lo = mid, q_mid
        else:
            hi, q_hi = mid, q_mid
    return max(hi, lo * (1 + slack))
