"""Residual imbalance after post-balancing (planner/imbalance.py): the slowest rank over the mean rank."""

import pytest

from orch.planner.imbalance import residual_imbalance
from orch.planner.loading import load_data
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import DataSpec

LINEAR = SampleCost(linear=1.0)


def _skewed(global_batch: int) -> DataSpec:
    return DataSpec.model_validate(
        {
            "global_batch": global_batch,
            "seq_len": 4096,
            "tasks": [
                {"weight": 0.8, "tokens": {"llm": 64}},
                {"weight": 0.2, "tokens": {"llm": 1024}, "spread": 0.8},
            ],
        }
    )


def test_equal_samples_balance_exactly():
    data = DataSpec.model_validate(
        {"global_batch": 16, "seq_len": 512, "tasks": [{"weight": 1, "tokens": {"llm": 100}}]}
    )
    assert residual_imbalance(data, "llm", "llm", 4, 2, LINEAR) == pytest.approx(1.0)


def test_one_rank_has_no_imbalance():
    assert residual_imbalance(_skewed(8), "llm", "llm", 1, 1, LINEAR) == 1.0


def test_few_long_samples_per_rank_leave_a_gap_that_more_samples_close():
    few = residual_imbalance(_skewed(16), "llm", "llm", 4, 2, LINEAR)
    many = residual_imbalance(_skewed(512), "llm", "llm", 4, 2, LINEAR)
    assert few > 1.1
    assert 1.0 <= many < 1.02
    assert few > many


def test_a_per_sample_constant_makes_counts_matter():
    """With the cost all per-sample constant, 16 samples on 4 ranks balance exactly (4 each)."""
    data = load_data("tiny-mix")
    assert residual_imbalance(data, "llm", "llm", 4, 2, SampleCost(constant=1.0)) == pytest.approx(1.0)
    assert residual_imbalance(data, "llm", "llm", 4, 2, SampleCost(constant=1.0, linear=0.01)) > 1.0


def test_deterministic():
    a = residual_imbalance(_skewed(16), "llm", "llm", 4, 2, SampleCost(constant=0.5, linear=1.0, quadratic=1e-4))
    assert a == residual_imbalance(
        _skewed(16), "llm", "llm", 4, 2, SampleCost(constant=0.5, linear=1.0, quadratic=1e-4)
    )


def test_a_tower_of_fixed_size_images_is_priced_balanced_by_image():
    """Samples of 1 to 8 images of 64 tokens, 2 per rank: by image the phase nears its mean rank; whole samples
    cannot (a sample of 8 images is several ranks' mean)."""
    data = DataSpec.model_validate(
        {
            "global_batch": 8,
            "seq_len": 4096,
            "tasks": [
                {"weight": 0.75, "tokens": {"vision": 64, "llm": 64}},
                {"weight": 0.25, "tokens": {"vision": 512, "llm": 64}},
            ],
        }
    )
    cost = SampleCost(linear=1.0, quadratic=1 / 64)
    whole = residual_imbalance(data, "vision", "llm", 4, 4, cost)
    by_image = residual_imbalance(data, "vision", "llm", 4, 4, cost, items=64)
    assert whole > 1.5
    assert 1.0 <= by_image < 1.2
