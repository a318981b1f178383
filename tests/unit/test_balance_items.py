"""Encoder phases balanced by item (planner/balance/items.py, dispatch.balance_items): samples that list
their items' lengths, each item a rank; a sample's items together unless cutting it lowers the maximum."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from orch.planner.balance.batch import Batch
from orch.planner.balance.dispatch import balance_batch
from orch.planner.balance.items import Items, chunk_groups
from orch.planner.balance.mode import Mode
from orch.planner.balance.topology import SLACK

VISION = {"linear": 1.0, "quadratic": 1 / 1024}
ITEM = 1024 + 1024**2 / 1024  # cost of one 1,024-token item


def _batch(samples, num_ranks=4, dpn=2, vision=VISION):
    return Batch.model_validate(
        {"num_ranks": num_ranks, "ranks_per_node": dpn, "phases": {"vision": vision, "llm": {}}, "samples": samples}
    )


def _video_batch():
    """One video of 8 frame-group runs on rank 0 (four times a rank's mean work), small images elsewhere."""
    samples = [{"origin": 0, "lengths": {"vision": [1024] * 8, "llm": 3000}}]
    samples += [{"origin": r, "lengths": {"vision": [256, 256], "llm": 400}} for r in range(4) for _ in range(2)]
    return _batch(samples)


def _cost(n):
    return n + n * n / 1024


def test_a_long_video_is_cut_into_runs_and_reaches_the_item_bound():
    batch = _video_batch()
    by_item = balance_batch(batch).phases["vision"]
    whole = balance_batch(batch, by_item=False).phases["vision"]
    total = 8 * ITEM + 16 * _cost(256)
    assert by_item.lower_bound == pytest.approx(max(total / 4, ITEM))
    assert whole.lower_bound == pytest.approx(8 * ITEM)  # the whole video is one unit
    assert whole.max_cost == pytest.approx(8 * ITEM)
    assert by_item.max_cost < 0.5 * whole.max_cost
    assert by_item.max_cost <= by_item.lower_bound * (1 + SLACK)
    video = by_item.dest[0]
    assert isinstance(video, list) and len(video) == 8 and len(set(video)) > 1
    # the runs are contiguous: a rank's items of the video are consecutive frame groups
    for r in set(video):
        at = [k for k, d in enumerate(video) if d == r]
        assert at == list(range(at[0], at[-1] + 1))
    # every rank's cost is the sum of its items' costs
    loads = [0.0] * 4
    for s, dest in zip(batch.samples, by_item.dest, strict=True):
        for n, r in zip(s.items("vision"), dest if isinstance(dest, list) else [dest], strict=True):
            loads[r] += _cost(n)
    assert max(loads) == pytest.approx(by_item.max_cost)


def test_items_stay_together_when_cutting_would_not_lower_the_maximum():
    # 16 two-image samples over 4 ranks, 4 per rank but unevenly drawn: whole samples reach the bound
    samples = [{"origin": i % 2, "lengths": {"vision": [512, 512], "llm": 500}} for i in range(16)]
    batch = _batch(samples)
    by_item = balance_batch(batch)
    whole = balance_batch(batch, by_item=False)
    assert by_item.phases["vision"].max_cost == pytest.approx(whole.phases["vision"].max_cost)
    assert all(len(set(d)) == 1 for d in by_item.phases["vision"].dest)
    assert by_item.phases["vision"].dest == whole.phases["vision"].dest
    v_item, v_whole = by_item.phases["vision"], whole.phases["vision"]
    assert (v_item.inter_node_bytes, v_item.intra_node_bytes) == (v_whole.inter_node_bytes, v_whole.intra_node_bytes)


def test_a_number_is_one_item_and_gives_what_it_gave_before():
    samples = [{"origin": i % 4, "lengths": {"vision": 300 * (i + 1), "llm": 200}} for i in range(10)]
    listed = [{"origin": s["origin"], "lengths": {"vision": [s["lengths"]["vision"]], "llm": 200}} for s in samples]
    plain = balance_batch(_batch(samples)).phases["vision"]
    as_lists = balance_batch(_batch(listed)).phases["vision"]
    assert as_lists.dest == [[d] for d in plain.dest]
    assert (as_lists.max_cost, as_lists.lower_bound) == (plain.max_cost, plain.lower_bound)


def test_runs_of_a_video_stay_on_its_node_when_the_node_has_room():
    # node 0 (ranks 0, 1) holds one video of 4 runs and nothing else; node 1 (ranks 2, 3) is as loaded
    samples = [{"origin": 0, "lengths": {"vision": [1024] * 4, "llm": 100}}]
    samples += [{"origin": r, "lengths": {"vision": [1024, 1024], "llm": 100}} for r in (2, 3)]
    out = balance_batch(_batch(samples)).phases["vision"]
    assert out.max_cost == pytest.approx(2 * ITEM)
    assert out.inter_node_bytes == 0
    assert sorted(out.dest[0]) == [0, 0, 1, 1]


def test_routes_name_each_items_encoder_rank_and_the_samples_llm_rank():
    result = balance_batch(_video_batch())
    llm = result.phases["llm"].dest
    assert [list(r) for r in result.routes["vision"]] == [
        [d, b] for d, b in zip(result.phases["vision"].dest, llm, strict=True)
    ]


def test_chunk_groups_cut_only_the_marked_samples_into_contiguous_runs():
    items = Items(np.array([0, 0, 0, 1, 1, 1, 1]), np.array([1, 1, 1, 1, 1, 1, 1]), np.zeros(7, dtype=np.int64))
    costs = np.ones(7)
    cut = np.array([False] * 3 + [True] * 4)
    assert chunk_groups(items, costs, cut, run=2.0).tolist() == [0, 0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(
    ("sample", "field"),
    [
        ({"origin": 0, "lengths": {"vision": 10, "llm": [10, 20]}}, "samples.0.lengths.llm"),
        ({"origin": 0, "lengths": {"vision": [10, 20], "llm": 5}, "bytes": {"vision": [1]}}, "samples.0.bytes.vision"),
        ({"origin": 0, "lengths": {"vision": [10, 0], "llm": 5}}, "samples.0.lengths.vision"),
    ],
)
def test_bad_item_lists_are_named(sample, field):
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        _batch([sample])


@st.composite
def item_batches(draw):
    dpn = draw(st.integers(1, 3))
    num_ranks = dpn * draw(st.integers(1, 3))
    samples = []
    for _ in range(draw(st.integers(1, 20))):
        k = draw(st.integers(0, 6))
        vision = [draw(st.integers(1, 2000)) for _ in range(k)]
        samples.append(
            {
                "origin": draw(st.integers(0, num_ranks - 1)),
                "lengths": {"vision": vision if draw(st.booleans()) or k != 1 else vision[0], "llm": 100},
            }
        )
    return _batch(samples, num_ranks, dpn)


@settings(max_examples=40, deadline=None)
@given(item_batches(), st.sampled_from([Mode.ORCH, Mode.LPT, Mode.PAPER]))
def test_by_item_places_every_item_once_and_is_never_worse_than_whole_samples(batch, mode):
    by_item = balance_batch(batch, mode).phases["vision"]
    whole = balance_batch(batch, mode, by_item=False).phases["vision"]
    assert by_item.max_cost <= whole.max_cost * (1 + 1e-9)
    assert by_item.max_cost >= by_item.lower_bound * (1 - 1e-9)
    assert by_item.lower_bound <= whole.lower_bound * (1 + 1e-9)
    for s, d_item, d_whole in zip(batch.samples, by_item.dest, whole.dest, strict=True):
        if isinstance(s.lengths["vision"], list):
            assert isinstance(d_item, list) and len(d_item) == len(s.items("vision"))
            assert len(set(d_whole)) <= 1  # by sample: every item of a sample on one rank
            assert all(0 <= r < batch.num_ranks for r in d_item)
        else:
            assert isinstance(d_item, int) and 0 <= d_item < batch.num_ranks


def test_a_padded_phase_places_every_item_as_its_own_unit():
    # four 30 s windows of one sample (Whisper-style, each padded to the rank's longest), a text-only sample
    samples = [{"origin": 0, "lengths": {"audio": [1500] * 4, "llm": 100}}, {"origin": 1, "lengths": {"llm": 300}}]
    batch = Batch.model_validate(
        {"num_ranks": 4, "ranks_per_node": 4, "phases": {"audio": {"padded": True}, "llm": {}}, "samples": samples}
    )
    by_item = balance_batch(batch).phases["audio"]
    whole = balance_batch(batch, by_item=False).phases["audio"]
    assert sorted(by_item.dest[0]) == [0, 1, 2, 3]
    assert by_item.max_cost == pytest.approx(1500) and by_item.lower_bound == pytest.approx(1500)
    assert whole.max_cost == pytest.approx(6000)  # whole: the sample's 4 windows on one rank
