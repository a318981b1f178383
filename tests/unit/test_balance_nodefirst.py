"""The node-first pieces of `--mode orch`: padded caps and runs, the sort helpers, and the M × (1 + SLACK) rule."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orch.planner.balance.batch import PhaseSpec
from orch.planner.balance.cost import build_phase_arrays, lower_bound, moved_bytes, rank_costs, rank_tokens
from orch.planner.balance.greedy import lpt
from orch.planner.balance.orch_padded import orch_padded
from orch.planner.balance.orch_unpadded import orch_unpadded, repair
from orch.planner.balance.padded import (
    _blocks,
    _jumps,
    _run_count,
    _runs,
    desc_order,
    greedy_starts,
    near_optimal_cap,
    node_runs,
    optimal_cap,
    padded_runs,
    run_capacity,
    step_limits,
)
from orch.planner.balance.refill import refill_padded
from orch.planner.balance.topology import SLACK

PADDED = PhaseSpec(linear=1.0, quadratic=1 / 8192, padded=True)
QUAD = PhaseSpec(linear=1.0, quadratic=1 / 4096)
# the same with a per-sample constant (fixed per-sample work: many short samples are not free)
PADDED_C = PADDED.model_copy(update={"constant": 300.0})
QUAD_C = QUAD.model_copy(update={"constant": 300.0})


def _phase(lengths, origin, num_ranks, dpn, spec):
    lengths = np.array(lengths, dtype=np.int64)
    origin = np.array(origin, dtype=np.int64)
    return build_phase_arrays("p", spec, lengths, origin, lengths * 10, num_ranks, dpn)


def _moved(ph, dest):
    return moved_bytes(ph.origin, dest, ph.bytes, ph.dp_per_node)


@st.composite
def phases(draw, spec, max_tokens=False):
    dpn = draw(st.integers(1, 4))
    num_ranks = dpn * draw(st.integers(1, 4))
    n = draw(st.integers(1, 60))
    # a long tail and many exact repeats (clipped lengths), as real batches have
    lengths = draw(st.lists(st.one_of(st.integers(1, 3000), st.sampled_from([576, 2304])), min_size=n, max_size=n))
    origin = draw(st.lists(st.integers(0, num_ranks - 1), min_size=n, max_size=n))
    if max_tokens:
        padded = max(lengths) * -(-n // num_ranks)  # consecutive runs of ceil(n / N) samples always fit
        spec = spec.model_copy(
            update={"max_tokens": padded if spec.padded else max(lengths) + -(-sum(lengths) // num_ranks)}
        )
    return _phase(lengths, origin, num_ranks, dpn, spec)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5000), max_size=80), st.booleans())
def test_desc_order_is_the_lexsort(lengths, grouped):
    lens = np.array(lengths, dtype=np.int64)
    group = (np.arange(lens.size) * 7) % 3 if grouped else None
    keys = (np.arange(lens.size), -lens) if group is None else (np.arange(lens.size), -lens, group)
    assert desc_order(lens, group).tolist() == np.lexsort(keys).tolist()


@settings(max_examples=60, deadline=None)
@given(phases(PADDED, max_tokens=True), st.floats(0.5, 3.0))
def test_greedy_starts_walks_the_same_runs(ph, scale):
    o = desc_order(ph.lengths)
    c, lens = ph.costs[o], ph.lengths[o]
    cap = float(c[0]) * scale
    steps = step_limits(lens, ph.spec.max_tokens, ph.n)
    want = _runs(_jumps(c, lens, cap, ph.spec.max_tokens), ph.num_ranks)
    assert greedy_starts(c.tolist(), steps.tolist(), cap, ph.num_ranks) == want


@settings(max_examples=60, deadline=None)
@given(phases(PADDED, max_tokens=True))
def test_near_optimal_cap_is_feasible_and_within_slack(ph):
    o = desc_order(ph.lengths)
    c, lens = ph.costs[o], ph.lengths[o]
    best = optimal_cap(c, lens, ph.num_ranks, ph.spec.max_tokens)
    cap = near_optimal_cap(c, lens, ph.num_ranks, ph.spec.max_tokens, SLACK)
    assert best * (1 - 1e-9) <= cap <= best * (1 + SLACK) * (1 + 1e-9)
    steps = step_limits(lens, ph.spec.max_tokens, ph.n).tolist()
    assert greedy_starts(c.tolist(), steps, cap, ph.num_ranks) is not None


@settings(max_examples=60, deadline=None)
@given(phases(PADDED))
def test_node_runs_stay_in_their_node_and_under_the_cap(ph):
    node = ph.origin // ph.dp_per_node
    cap = float(ph.costs.max()) * 1.7
    runs, run_node, fill = node_runs(ph.costs, ph.lengths, node, ph.num_nodes, cap, None)
    assert (run_node[runs] == node).all()
    count = np.bincount(runs, minlength=run_node.size)
    assert (count > 0).all()
    longest = np.zeros(run_node.size)
    np.maximum.at(longest, runs, ph.costs)
    assert (count * longest <= cap * (1 + 1e-9)).all()
    assert fill == pytest.approx(np.bincount(runs, weights=ph.costs, minlength=run_node.size) / cap)
    assert (run_capacity(ph.costs, ph.lengths, cap, None) >= 1).all()


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([PADDED, PADDED_C]).flatmap(lambda spec: phases(spec, max_tokens=True)))
def test_orch_padded_within_slack_of_the_optimum_and_under_the_token_cap(ph):
    o = desc_order(ph.lengths)
    best = optimal_cap(ph.costs[o], ph.lengths[o], ph.num_ranks, ph.spec.max_tokens)
    dest = orch_padded(ph)
    assert ((dest >= 0) & (dest < ph.num_ranks)).all()
    assert float(rank_costs(ph, dest).max()) <= best * (1 + SLACK) * (1 + 1e-9)
    assert int(rank_tokens(ph, dest).max()) <= ph.spec.max_tokens
    assert orch_padded(ph).tolist() == dest.tolist()  # deterministic


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([QUAD, QUAD_C]).flatmap(lambda spec: phases(spec, max_tokens=True)))
def test_orch_unpadded_never_above_lpt_or_the_bound_by_more_than_slack(ph):
    dest = orch_unpadded(ph)
    got = float(rank_costs(ph, dest).max())
    ref = float(rank_costs(ph, lpt(ph.costs, ph.num_ranks, ph.lengths, ph.spec.max_tokens)).max())
    assert got <= max(ref, lower_bound(ph)) * (1 + SLACK) * (1 + 1e-9)
    assert int(rank_tokens(ph, dest).max()) <= ph.spec.max_tokens
    assert orch_unpadded(ph).tolist() == dest.tolist()


def test_padded_node_keeps_its_samples_when_they_fit():
    # two nodes of two ranks; each node's samples fit its own ranks at the optimum: nothing crosses
    lengths = [1000, 1000, 500, 500, 1000, 1000, 500, 500]
    origin = [0, 0, 1, 1, 2, 2, 3, 3]
    ph = _phase(lengths, origin, 4, 2, PhaseSpec(linear=1.0, padded=True))
    dest = orch_padded(ph)
    assert (dest // 2 == ph.origin // 2).all()
    assert float(rank_costs(ph, dest).max()) == 2000.0


def test_capped_unpadded_keeps_bytes_on_node_when_lpt_sets_the_cap():
    # equal coarse samples: the bound (the mean) is out of reach, LPT's max sets the cap
    rng = np.random.default_rng(3)
    num_ranks, dpn = 64, 8
    lengths = np.where(rng.random(num_ranks * 4) < 0.7, 576, 2304)
    origin = np.repeat(np.arange(num_ranks), 4)
    ph = _phase(lengths, origin, num_ranks, dpn, QUAD)
    dest = orch_unpadded(ph)
    ref = lpt(ph.costs, num_ranks)
    assert float(rank_costs(ph, dest).max()) <= float(rank_costs(ph, ref).max()) * (1 + SLACK) * (1 + 1e-9)
    cross = dest // dpn != ph.origin // dpn
    assert ph.bytes[cross].sum() < 0.5 * ph.bytes.sum()


def _heap_lpt(costs, num_ranks):
    import heapq

    from orch.planner.balance.greedy import descending

    dest = np.zeros(costs.size, dtype=np.int64)
    heap = [(0.0, r) for r in range(num_ranks)]
    for i in descending(costs).tolist():
        load, r = heapq.heappop(heap)
        heapq.heappush(heap, (load + costs[i], r))
        dest[i] = r
    return dest


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1.0, 3.0, 576.0, 657.0, 3600.0]), max_size=400),
    st.lists(st.floats(0, 5000), max_size=40),
    st.integers(1, 9),
)
def test_lpt_with_equal_cost_blocks_is_the_heap_lpt(repeated, scattered, num_ranks):
    costs = np.array(repeated + scattered, dtype=np.float64)
    rng = np.random.default_rng(len(repeated))
    costs = costs[rng.permutation(costs.size)]
    assert lpt(costs, num_ranks).tolist() == _heap_lpt(costs, num_ranks).tolist()


def _runs_on_ranks(ph):
    """The exact padded runs, run k on rank k (`--mode lpt`), and their cap: a feasible start for refill."""
    o = desc_order(ph.lengths)
    cap = optimal_cap(ph.costs[o], ph.lengths[o], ph.num_ranks, ph.spec.max_tokens)
    return padded_runs(ph.costs, ph.lengths, ph.num_ranks, ph.spec.max_tokens, cap), cap


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([PADDED, PADDED_C]).flatmap(lambda spec: phases(spec, max_tokens=True)))
def test_refill_keeps_the_cap_and_never_moves_more_bytes_across_nodes(ph):
    dest, cap = _runs_on_ranks(ph)
    out = refill_padded(ph, dest, cap, min_cross=0.0)
    assert ((out >= 0) & (out < ph.num_ranks)).all()
    assert float(rank_costs(ph, out).max()) <= cap * (1 + 1e-9)
    assert int(rank_tokens(ph, out).max()) <= ph.spec.max_tokens
    assert _moved(ph, out) <= _moved(ph, dest)  # fewer across nodes, then inside: MovedBytes compares inter first
    assert refill_padded(ph, dest, cap, min_cross=0.0).tolist() == out.tolist()  # deterministic


def test_refill_brings_interchangeable_samples_home():
    # two nodes of one rank; the runs swapped the nodes' samples: same class, so they can all go home
    lengths = [100, 90, 100, 80]
    origin = [0, 0, 1, 1]
    ph = _phase(lengths, origin, 2, 1, PhaseSpec(linear=1.0, padded=True))
    dest = np.array([1, 1, 0, 0])
    out = refill_padded(ph, dest, 200.0)
    assert out.tolist() == origin
    # a sample its node's places do not admit (too long for k = 2 there) still crosses
    ph = _phase([150, 90, 100, 80], origin, 2, 1, PhaseSpec(linear=1.0, padded=True))
    dest = np.array([1, 0, 0, 0])  # rank 1 holds the 150 alone (k = 1); rank 0 the rest (k = 3 at 300)
    out = refill_padded(ph, dest, 300.0)
    assert float(rank_costs(ph, out).max()) <= 300.0
    assert _moved(ph, out).inter < _moved(ph, dest).inter


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([QUAD, QUAD_C]).flatmap(lambda spec: phases(spec, max_tokens=True)), st.floats(1.0, 1.2))
def test_repair_reaches_the_target_or_says_so_and_keeps_the_token_cap(ph, scale):
    start = lpt(ph.costs, ph.num_ranks, ph.lengths, ph.spec.max_tokens)
    target = float(rank_costs(ph, start).max()) * scale
    messy = ph.origin.copy()  # every sample where it was: far over the target, nothing balanced
    if int(rank_tokens(ph, messy).max()) > ph.spec.max_tokens:
        messy = start
    out, ok = repair(ph, messy, target)
    assert ((out >= 0) & (out < ph.num_ranks)).all()
    assert int(rank_tokens(ph, out).max()) <= ph.spec.max_tokens
    assert ok == (float(rank_costs(ph, out).max()) <= target * (1 + 1e-9))
    assert repair(ph, messy, target)[0].tolist() == out.tolist()


def test_repair_swaps_where_no_single_move_fits():
    # one node of two ranks: rank 0 holds 100 + 30 (130), rank 1 holds 90 + 10 (100); target 120.
    # No move fits (moving the 30 makes rank 1 130); the swap 30 <-> 10 makes them 110 and 120.
    ph = _phase([100, 30, 90, 10], [0, 0, 1, 1], 2, 2, PhaseSpec(linear=1.0))
    out, ok = repair(ph, ph.origin.copy(), 120.0)
    assert ok
    assert float(rank_costs(ph, out).max()) <= 120.0
    assert out.tolist() == [0, 1, 1, 0]  # the 30 and the 10 change places


def _run_count_walk(costs_desc, steps, cap, limit):
    """The run count one leader at a time (what _run_count computes with block jumps)."""
    n = len(costs_desc)
    top = cap * (1 + 1e-12)
    runs = i = 0
    while i < n:
        if runs > limit:
            break
        ci, k = costs_desc[i], steps[i]
        if ci > 0 and top < ci * k:
            k = int(top / ci)
        if k < 1:
            return n + 1
        runs += 1
        i += k
    return runs


@settings(max_examples=100, deadline=None)
@given(phases(PADDED, max_tokens=True), st.floats(0.5, 3.0), st.integers(0, 12))
def test_run_count_block_jumps_count_the_same_runs(ph, scale, limit):
    o = desc_order(ph.lengths)
    c, lens = ph.costs[o], ph.lengths[o]
    steps = step_limits(lens, ph.spec.max_tokens, ph.n)
    cap = float(c[0]) * scale
    got = _run_count(c.tolist(), steps.tolist(), cap, limit, _blocks(c, steps))
    assert got == _run_count_walk(c.tolist(), steps.tolist(), cap, limit)
