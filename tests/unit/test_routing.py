import pytest
from hypothesis import given
from hypothesis import strategies as st

from orch.planner.routing import RouteTable, RoutingError


@st.composite
def tables(draw, num_src=None, src=None):
    n = draw(st.integers(0, 40)) if src is None else len(src)
    ns = num_src or draw(st.integers(1, 6))
    nd = draw(st.integers(1, 6))
    s = src if src is not None else draw(st.lists(st.integers(0, ns - 1), min_size=n, max_size=n))
    d = draw(st.lists(st.integers(0, nd - 1), min_size=n, max_size=n))
    return RouteTable.build(s, d, ns, nd)


@given(tables())
def test_inverse_of_inverse_is_identity(t):
    assert t.inverse().inverse() == t


@given(tables())
def test_every_sample_sent_and_received_exactly_once(t):
    sent = [i for r in range(t.num_src) for i in t.send_plan(r).ids]
    recv = [i for r in range(t.num_dst) for i in t.recv_plan(r).ids]
    assert sorted(sent) == list(range(t.num_samples))
    assert sorted(recv) == list(range(t.num_samples))


@given(tables())
def test_splits_match_between_senders_and_receivers(t):
    # what rank s sends to d equals what d expects from s: all_to_all_single's contract
    for s in range(t.num_src):
        for d in range(t.num_dst):
            assert t.send_plan(s).splits[d] == t.recv_plan(d).splits[s]


@given(tables())
def test_recv_order_restores_ascending_ids(t):
    for r in range(t.num_dst):
        plan = t.recv_plan(r)
        assert [plan.ids[k] for k in plan.order] == t.held(r)


@given(st.data())
def test_composition_equals_two_moves(data):
    first = data.draw(tables())
    second = data.draw(tables(num_src=first.num_dst, src=list(first.dst)))
    composed = first.then(second)
    # moving per the composed table lands every sample where the two moves land it
    for r in range(composed.num_dst):
        assert composed.held(r) == second.held(r)
    assert composed.src == first.src


def test_compose_rejects_mismatched_tables():
    a = RouteTable.build([0, 1], [1, 0], 2, 2)
    b = RouteTable.build([0, 0], [1, 1], 2, 2)
    with pytest.raises(RoutingError):
        a.then(b)


def test_rank_out_of_range_is_an_error():
    with pytest.raises(RoutingError, match="dst rank 3"):
        RouteTable.build([0], [3], 1, 2)
