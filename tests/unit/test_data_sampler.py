"""The data file's sampler: a function of (seed, step); every epoch visits each sample exactly once."""

from hypothesis import given, settings
from hypothesis import strategies as st

from orch.runtime.data.mix import step_rows


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), batch=st.integers(1, 17), seed=st.integers(0, 5), epochs=st.integers(1, 3))
def test_every_epoch_visits_each_sample_once(n, batch, seed, epochs):
    steps = -(-epochs * n // batch)
    cache: dict = {}
    drawn = [r for k in range(steps) for r in step_rows(n, batch, seed, k, cache)]
    for e in range(epochs):
        assert sorted(drawn[e * n : (e + 1) * n]) == list(range(n))
    assert [step_rows(n, batch, seed, k) for k in range(steps)] == [
        drawn[k * batch : (k + 1) * batch] for k in range(steps)
    ]


def test_epochs_and_seeds_reorder():
    assert step_rows(50, 50, 0, 0) != step_rows(50, 50, 0, 1)  # epoch 1 is another permutation
    assert step_rows(50, 50, 0, 0) != step_rows(50, 50, 1, 0)
