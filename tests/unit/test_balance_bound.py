"""The certified lower bound on a padded phase's inter-node bytes (planner/research/cross_bound.py).

Its value must never exceed what any assignment under the cap sends: checked against brute force
on small batches and against orch and paper on larger ones, for π = 0 and for random prices.
"""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orch.planner.balance.batch import PhaseSpec
from orch.planner.balance.cost import build_phase_arrays, moved_bytes, rank_costs, sample_costs
from orch.planner.balance.orch_padded import orch_padded
from orch.planner.balance.padded import desc_order, optimal_cap
from orch.planner.balance.paper import paper
from orch.planner.balance.topology import SLACK
from orch.planner.research.cross_bound import build_padded_bound_model, evaluate_bound, padded_cross_bound

PADDED = PhaseSpec(linear=1.0, quadratic=0.0, padded=True)
PADDED_Q = PhaseSpec(linear=1.0, quadratic=1 / 64, padded=True, constant=2.0)


def _phase(lengths, origin, bytes_, num_ranks, dpn, spec=PADDED):
    return build_phase_arrays(
        "p", spec, np.array(lengths, np.int64), np.array(origin, np.int64), np.array(bytes_, np.int64), num_ranks, dpn
    )


def _optimum(ph) -> float:
    o = desc_order(ph.lengths)
    return optimal_cap(ph.costs[o], ph.lengths[o], ph.num_ranks, None)


def _brute_force(ph, cap: float) -> float:
    """Fewest inter-node bytes of any assignment with every padded rank cost <= cap (all N^n of them)."""
    dest = np.array(list(itertools.product(range(ph.num_ranks), repeat=ph.n)), dtype=np.int64)
    worst = np.zeros(dest.shape[0])
    for r in range(ph.num_ranks):
        on = dest == r
        longest = np.where(on, ph.lengths[None, :], 0).max(axis=1)
        worst = np.maximum(worst, on.sum(axis=1) * sample_costs(longest, ph.spec))
    cross = (dest // ph.dp_per_node) != (ph.origin // ph.dp_per_node)[None, :]
    inter = cross.astype(np.float64) @ ph.bytes.astype(np.float64)
    ok = worst <= cap * (1 + 1e-9)
    assert ok.any()
    return float(inter[ok].min())


def _prices(draw, num_t: int) -> np.ndarray:
    scale = draw(st.sampled_from([0.0, 0.1, 1.0, 10.0, 1000.0]))
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=num_t, max_size=num_t))
    return np.array(raw) * scale


@st.composite
def small_phases(draw):
    dpn = draw(st.integers(1, 2))
    num_ranks = dpn * draw(st.integers(2, 3))
    n = draw(st.integers(2, 6 if num_ranks <= 4 else 5))
    lengths = draw(st.lists(st.one_of(st.integers(1, 40), st.sampled_from([5, 10, 20])), min_size=n, max_size=n))
    origin = draw(st.lists(st.integers(0, num_ranks - 1), min_size=n, max_size=n))
    monotone = draw(st.booleans())
    bytes_ = [3 * x for x in lengths] if monotone else draw(st.lists(st.integers(1, 99), min_size=n, max_size=n))
    spec = draw(st.sampled_from([PADDED, PADDED_Q]))
    return _phase(lengths, origin, bytes_, num_ranks, dpn, spec)


@settings(max_examples=150, deadline=None)
@given(small_phases(), st.sampled_from([0.0, SLACK, 0.3]), st.sampled_from([2, 256]), st.data())
def test_bound_never_exceeds_the_brute_force_optimum(ph, slack, classes, data):
    cap = _optimum(ph) * (1 + slack)
    best = _brute_force(ph, cap)
    model = build_padded_bound_model(ph, cap, classes)
    assert evaluate_bound(model).bound <= best + 1e-6
    for _ in range(5):
        assert evaluate_bound(model, _prices(data.draw, model.lo.size)).bound <= best + 1e-6


def test_bound_is_tight_where_a_node_must_export():
    # node 0 (one rank) holds 10, 1, 1: at cap 20 a rank led by a 10 takes two samples, so one sample
    # (the cheapest: 1 byte) must leave; node 1's rank has room for it
    ph = _phase([10, 1, 1, 10], [0, 0, 0, 1], [10, 1, 1, 10], 2, 1)
    assert _optimum(ph) == 20.0
    assert padded_cross_bound(ph, 20.0) == 1.0
    assert _brute_force(ph, 20.0) == 1.0
    assert moved_bytes(ph.origin, orch_padded(ph), ph.bytes, ph.dp_per_node).inter >= 1


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([1, 2, 4]), st.data())
def test_bound_below_orch_and_paper(seed, dpn, data):
    rng = np.random.default_rng(seed)
    num_ranks = dpn * int(rng.integers(2, 6))
    n = int(rng.integers(num_ranks, 6 * num_ranks))
    lengths = np.clip(np.rint(300 * np.exp(rng.normal(-0.4, 0.9, n))), 1, 3000).astype(np.int64)
    origin = rng.integers(0, num_ranks, n)
    ph = _phase(lengths, origin, lengths * 7, num_ranks, dpn)
    cap = _optimum(ph) * (1 + SLACK)
    orch = orch_padded(ph)
    assert rank_costs(ph, orch).max() <= cap * (1 + 1e-9)  # orch stays under the cap the bound is taken at
    sent = min(moved_bytes(ph.origin, d, ph.bytes, ph.dp_per_node).inter for d in (orch, paper(ph)))
    model = build_padded_bound_model(ph, cap)
    assert evaluate_bound(model).bound <= sent + 1e-6
    for _ in range(4):
        assert evaluate_bound(model, _prices(data.draw, model.lo.size)).bound <= sent + 1e-6


@settings(max_examples=25, deadline=None)
@given(small_phases(), st.data())
def test_answer_attains_the_value_and_chunks_agree(ph, data):
    cap = _optimum(ph) * (1 + SLACK)
    model = build_padded_bound_model(ph, cap)
    prices = _prices(data.draw, model.lo.size)
    whole = evaluate_bound(model, prices)
    split = evaluate_bound(model, prices, chunk=1)  # one node per chunk
    assert split.bound == pytest.approx(whole.bound, rel=1e-9, abs=1e-6)
    # the back-tracked answer (bytes kept, cover) is worth exactly what the DP said
    pi = np.maximum(prices, 0.0)
    worth = whole.kept.sum() + float(pi @ whole.cover_above)
    assert model.total_bytes + float(pi @ model.need) - worth == pytest.approx(whole.bound, rel=1e-9, abs=1e-6)
    # a node's cover: at most its samples plus its R ranks' places
    assert (whole.cover.sum(axis=1) <= model.real + ph.dp_per_node * model.k.max()).all()


def test_empty_phase():
    ph = _phase([], [], [], 4, 2)
    assert padded_cross_bound(ph, 1.0) == 0.0
