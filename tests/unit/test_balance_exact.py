"""Tiny instances against brute force: the padded binary search is exact, LB <= optimum, orch near it."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orch.planner.balance.batch import PhaseSpec
from orch.planner.balance.cost import build_phase_arrays, lower_bound, rank_costs
from orch.planner.balance.greedy import lpt, lpt_rounds
from orch.planner.balance.orch_unpadded import orch_unpadded
from orch.planner.balance.padded import optimal_cap, padded_runs
from orch.planner.balance.topology import SLACK
from orch.planner.research.karmarkar_karp import karmarkar_karp


def _phase(lengths, origin, num_ranks, dpn, spec):
    lengths = np.array(lengths, dtype=np.int64)
    origin = np.array(origin, dtype=np.int64)
    return build_phase_arrays("p", spec, lengths, origin, lengths * 10, num_ranks, dpn)


def _brute(ph):
    best = np.inf
    for dest in itertools.product(range(ph.num_ranks), repeat=ph.n):
        best = min(best, float(rank_costs(ph, np.array(dest, dtype=np.int64)).max(initial=0.0)))
    return best


tiny = st.integers(1, 3).flatmap(
    lambda ranks: st.tuples(
        st.just(ranks),
        st.lists(st.integers(1, 500), min_size=1, max_size=6),
    )
)


@settings(max_examples=60, deadline=None)
@given(tiny, st.booleans(), st.sampled_from([0.0, 50.0]))
def test_padded_binary_search_is_optimal(case, quadratic, constant):
    ranks, lengths = case
    spec = PhaseSpec(linear=1.0, quadratic=0.01 if quadratic else 0.0, padded=True, constant=constant)
    ph = _phase(lengths, [0] * len(lengths), ranks, 1, spec)
    order = np.lexsort((np.arange(ph.n), -ph.lengths))
    best = optimal_cap(ph.costs[order], ph.lengths[order], ranks, None)
    assert best == pytest.approx(_brute(ph))
    runs = padded_runs(ph.costs, ph.lengths, ranks, None)
    assert float(rank_costs(ph, runs).max()) == pytest.approx(best)


@settings(max_examples=60, deadline=None)
@given(tiny, st.integers(1, 3), st.sampled_from([0.0, 50.0]))
def test_unpadded_bound_and_orch_against_brute_force(case, seed, constant):
    ranks, lengths = case
    rng = np.random.default_rng(seed)
    spec = PhaseSpec(linear=1.0, quadratic=0.001, constant=constant)
    ph = _phase(lengths, rng.integers(0, ranks, size=len(lengths)), ranks, 1, spec)
    opt = _brute(ph)
    assert lower_bound(ph) <= opt * (1 + 1e-12)
    got = float(rank_costs(ph, orch_unpadded(ph)).max())
    # orch stops at the bound + SLACK when it can, else runs against LPT's max + SLACK (LPT: within 4/3 of optimal)
    lpt_max = float(rank_costs(ph, lpt(ph.costs, ranks)).max())
    assert got <= max(lpt_max, lower_bound(ph)) * (1 + SLACK) * (1 + 1e-9)
    assert got <= opt * 4 / 3 * (1 + SLACK) + 1e-9


def test_karmarkar_karp_textbook():
    # {8, 7, 6, 5, 4} in two: KK differencing gives 16/14 (LPT gives 17/13)
    costs = np.array([8.0, 7, 6, 5, 4])
    kk = karmarkar_karp(costs, 2)
    assert sorted(np.bincount(kk, weights=costs, minlength=2).tolist()) == [14.0, 16.0]
    lp = lpt(costs, 2)
    assert sorted(np.bincount(lp, weights=costs, minlength=2).tolist()) == [13.0, 17.0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 100), max_size=40), st.integers(1, 7))
def test_reference_balancers_assign_every_sample(costs, ranks):
    c = np.array(costs, dtype=np.float64)
    for dest in (lpt(c, ranks), lpt_rounds(c, ranks), karmarkar_karp(c, ranks)):
        assert dest.shape == c.shape
        assert ((dest >= 0) & (dest < ranks)).all()
        assert np.bincount(dest, weights=c, minlength=ranks).sum() == pytest.approx(c.sum())
