"""The start-up calibration's own cost (runtime/train/calibration.py): its fixed short shapes, then longer
samples only within a fraction of what one of the data's longest samples costs, whatever that length; and
the fit still recovers the module's cost model. Timed against a simulated module (seconds = a known
SampleCost), so the assertions are exact and nothing is slow."""

import pytest
import torch

from orch.planner.sample_cost import SampleCost
from orch.runtime.models.registry import load_model
from orch.runtime.train import calibration
from orch.runtime.train.calibration import CALIBRATION_BUDGET, CALIBRATION_SHAPES, Timing, calibrate_points

# attention-heavy at length: a 6,400-token sample (a video's patches) costs ~0.4 s, a 256-token one ~2 ms
MODULE = SampleCost(call=2e-4, constant=1e-3, linear=1e-6, quadratic=1e-8)
SHORT = max(n for _, n in CALIBRATION_SHAPES)


def _simulated(calls):
    """A TimeAt whose calls take MODULE's seconds: one warm-up and `repeats` timed, all of them spent."""

    def time_at(k: int, n: int, repeats: int) -> Timing:
        calls.append((k, n, 1 + repeats))
        seconds = MODULE.per_call(k, n)
        return Timing(n, seconds, (1 + repeats) * seconds)

    return time_at


@pytest.mark.parametrize("max_len", [300, 1_000, 6_400, 100_000])
def test_longer_samples_cost_the_calibration_a_fraction_of_one_longest_sample(max_len):
    calls = []
    calibrated = calibrate_points(_simulated(calls), max_len)
    fixed = sum(runs * MODULE.per_call(k, n) for k, n, runs in calls if n <= SHORT)
    longer = [(k, n, runs) for k, n, runs in calls if n > SHORT]
    assert sum(runs * MODULE.per_call(k, n) for k, n, runs in longer) <= CALIBRATION_BUDGET * MODULE.per_call(
        1, max_len
    )
    assert calibrated.seconds == pytest.approx(fixed + sum(runs * MODULE.per_call(k, n) for k, n, runs in longer))
    assert all(k == 1 and runs == 2 and n < max_len for k, n, runs in longer)
    # the fit is exact on exact timings, so the longest sample is priced as the module runs it
    assert calibrated.cost is not None
    assert calibrated.cost.per_call(1, max_len) == pytest.approx(MODULE.per_call(1, max_len), rel=1e-6)


def test_the_rungs_climb_as_far_as_the_budget_reaches():
    calls = []
    calibrated = calibrate_points(_simulated(calls), 6_400)
    # 2 x cost(512) + 2 x cost(1,024) is 8% of cost(6,400); with 2,048 they would be 30%
    assert [n for _, n, _ in calls if n > SHORT] == [512, 1_024]
    assert calibrated.longest == 1_024
    calls = []
    assert calibrate_points(_simulated(calls), 6_400, budget=1.0).longest == 2_048  # 30%; with 4,096: 113%


def test_calibrate_module_times_no_sample_near_the_data_s_longest(monkeypatch):
    """What a video's 6,400 patches met: the module timed through calibrate_module, each call simulated."""
    calls = []

    def simulated(model, name, module, k, n, dtype, device=None):
        calls.append((k, n))
        return MODULE.per_call(k, n)

    monkeypatch.setattr(calibration, "_time_module", simulated)
    calibration._calibrate.cache_clear()
    try:
        calibrated = calibration.calibrate_module(load_model("tiny"), "llm", torch.float64, "cpu", 6_400)
    finally:
        calibration._calibrate.cache_clear()
    spent = sum(MODULE.per_call(k, n) for k, n in calls)
    fixed = sum((1 + calibration.CALIBRATION_REPEATS) * MODULE.per_call(k, n) for k, n in CALIBRATION_SHAPES)
    assert spent <= fixed + CALIBRATION_BUDGET * MODULE.per_call(1, 6_400)
    assert max(n for _, n in calls) == 1_024
    assert calibrated.cost is not None and calibrated.cost.quadratic == pytest.approx(MODULE.quadratic, rel=1e-6)


def test_progress_line_says_what_was_timed_and_what_was_extrapolated():
    from orch.runtime.train.calibration import Calibration, calibration_line

    timed = Calibration(MODULE, ((1, 2, 0.001), (1, 256, 0.002), (1, 1_024, 0.02)), 1.234)
    assert calibration_line("vision", timed, 6_400, 0, 2) == (
        "calibrated vision (1/2) in 1.23 s: 3 shapes up to 1,024 tokens (its data's longest, 6,400, extrapolated)"
    )
    assert calibration_line("llm", Calibration(None, timed.points, 0.5), 1_024, 1, 2) == (
        "calibrated llm (2/2) in 0.50 s: 3 shapes up to 1,024 tokens; too noisy to fit: the FLOP model prices it"
    )
