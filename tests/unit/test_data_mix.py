"""A mix's draws (runtime/data/mix.py): weights are the sources' probabilities over every row of every source,
with or without replacement; LLaMA-Factory's strategies; a function of (seed, step) alone, so a run resumed at
step k draws what the uninterrupted run drew."""

from collections import Counter

import pytest

from orch.planner.errors import SpecError
from orch.runtime.data.mix import CHUNK, Mix, read_mix_spec, step_rows

SIZES, WEIGHTS = (6, 1, 200), (1.0, 1.0, 2.0)


def _sources(mix: Mix, rows: list[int]) -> list[int]:
    source_of = [s for s, n in enumerate(mix.sizes) for _ in range(n)]
    return [source_of[r] for r in rows]


def _draws(mix: Mix, seed: int, steps: int, batch: int) -> list[int]:
    return [r for k in range(steps) for r in mix.rows(seed, k, batch)]


@pytest.mark.parametrize("replacement", [False, True])
def test_10000_draws_follow_the_weights(replacement):
    mix = Mix(SIZES, WEIGHTS, "interleave_over", replacement)
    counts = Counter(_sources(mix, _draws(mix, 7, 40, 250)))
    expected = [p * 10_000 for p in mix.shares()]
    assert expected == [2500.0, 2500.0, 5000.0]
    chi2 = sum((counts[s] - e) ** 2 / e for s, e in enumerate(expected))
    assert chi2 < 13.8  # 2 degrees of freedom: p = 0.001
    if not replacement:  # each whole chunk holds its quotas: floor(CHUNK * p) or one more
        whole = Counter(_sources(mix, _draws(mix, 7, 40, 250)[: 2 * CHUNK]))
        assert all(abs(whole[s] - 2 * CHUNK * p) <= 2 for s, p in enumerate(mix.shares()))


def test_without_replacement_each_source_gives_every_row_once_a_pass():
    mix = Mix(SIZES, WEIGHTS, "interleave_under")
    rows = _draws(mix, 3, 20, 100)
    offset = 0
    for s, n in enumerate(SIZES):
        mine = [r - offset for r in rows if offset <= r < offset + n]
        for p in range(len(mine) // n):
            assert sorted(mine[p * n : (p + 1) * n]) == list(range(n)), (s, p)
        offset += n
    first_six = [r for r in rows if r < 6][:6]
    assert sorted(first_six) == [0, 1, 2, 3, 4, 5]  # a 1:1 mix of 6 rows and 1 row reaches rows 5 and 6


def test_with_replacement_rows_repeat_before_a_pass_ends():
    mix = Mix(SIZES, WEIGHTS, "interleave_over", replacement=True)
    big = [r for r in _draws(mix, 3, 4, 100) if r >= 7][:200]
    assert len(set(big)) < 200  # 200 draws of 200 rows with replacement: some repeat
    assert set(Counter(_sources(mix, _draws(mix, 3, 4, 100)))) == {0, 1, 2}


def test_a_step_is_a_function_of_seed_and_step_across_chunks():
    batch = 1000  # 10 steps cross two chunk boundaries (CHUNK draws each)
    assert 10 * batch > 2 * CHUNK
    for replacement in (False, True):
        run = Mix(SIZES, WEIGHTS, "interleave_over", replacement)
        uninterrupted = [run.rows(5, k, batch) for k in range(10)]
        resumed = Mix(SIZES, WEIGHTS, "interleave_over", replacement)  # a fresh process, started at step 6
        assert [resumed.rows(5, k, batch) for k in range(6, 10)] == uninterrupted[6:]
        assert Mix(SIZES, WEIGHTS, "interleave_over", replacement).rows(5, 9, batch) == uninterrupted[9]
        assert run.rows(6, 0, batch) != uninterrupted[0]  # another seed, other draws
        assert run.rows(5, 3, batch) == uninterrupted[3]  # the same object asked again, after other seeds


def test_concat_is_one_pool_and_a_single_file_reads_as_before():
    mix = Mix(SIZES, (5.0, 1.0, 1.0), "concat")  # weights not used
    assert mix.shares() == [n / 207 for n in SIZES] and mix.epoch_draws() == 207
    assert [mix.rows(2, k, 50) for k in range(9)] == [step_rows(207, 50, 2, k) for k in range(9)]
    single = Mix((11,), (1.0,))
    assert single.rows(0, 3, 4) == step_rows(11, 4, 0, 3)


def test_epochs_and_a_source_with_no_rows():
    under, over = Mix(SIZES, WEIGHTS, "interleave_under"), Mix(SIZES, WEIGHTS, "interleave_over")
    assert under.epoch_draws() == 4  # until the 1-row source (share 1/4) is done
    assert over.epoch_draws() == 400  # until the 200-row source (share 1/2) is done
    empty = Mix((6, 0, 200), WEIGHTS)
    assert empty.shares() == [pytest.approx(1 / 3), 0.0, pytest.approx(2 / 3)]
    assert 1 not in set(_sources(empty, _draws(empty, 0, 10, 100)))


def test_the_mix_file_names_its_strategy(tmp_path):
    mix = tmp_path / "mix.yaml"
    mix.write_text("strategy: interleave_under\nreplacement: true\nsources: [{path: a.jsonl}]\n")
    spec = read_mix_spec(str(mix))
    assert (spec.strategy, spec.replacement) == ("interleave_under", True)
    mix.write_text("mix_strategy: concat\nsources: [{path: a.jsonl}]\n")  # LLaMA-Factory's name for it
    assert read_mix_spec(str(mix)).strategy == "concat"
    mix.write_text("strategy: shuffle\nsources: [{path: a.jsonl}]\n")
    with pytest.raises(SpecError, match="strategy: expected one of concat, interleave_under, interleave_over"):
        read_mix_spec(str(mix))
    mix.write_text("replacement: sometimes\nsources: [{path: a.jsonl}]\n")
    with pytest.raises(SpecError, match="replacement: expected true or false"):
        read_mix_spec(str(mix))
