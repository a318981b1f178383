"""Each plan, run on gloo processes in float64, matches the single-process reference.

Loss within 1e-9 relative at every step, every parameter's gradient of step 0 within 1e-9
and every parameter after 3 SGD steps within 1e-8 (relative to the tensor's largest entry).
"""

import pytest
import torch
from equivalence import assert_close, run_plans
from launching import train_local

from orch.planner.balance.mode import Mode
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.launch.base import LaunchError
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig
from orch.runtime.train.single_process import run_reference

STEPS = 2
SEED = 7

PLANS = {
    "homogeneous_dp2_tp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3])},
    "colocated_enc_dp4_llm_dp2_tp2": {
        "llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "disaggregated_enc1_llm_dp3": {
        "llm": (Layout(dp=3), [1, 2, 3]),
        "vision": (Layout(dp=1), [0]),
        "audio": (Layout(dp=1), [0]),
    },
    "disaggregated_enc1_llm_pp3": {
        "llm": (Layout(pp=3), [1, 2, 3]),
        "vision": (Layout(dp=1), [0]),
        "audio": (Layout(dp=1), [0]),
    },
    "disaggregated_two_encoders_llm_pp2": {
        "llm": (Layout(pp=2), [2, 3]),
        "vision": (Layout(dp=1), [0]),
        "audio": (Layout(dp=1), [1]),
    },
    # one island per encoder, each with its own DP, into a data-parallel LLM (5 ranks)
    "disaggregated_islands_vision_dp2_audio_dp1_llm_dp2": {
        "llm": (Layout(dp=2), [3, 4]),
        "vision": (Layout(dp=2), [0, 1]),
        "audio": (Layout(dp=1), [2]),
    },
    "colocated_enc_dp4_llm_pp2_tp2": {
        "llm": (Layout(pp=2, tp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "colocated_enc_dp4_llm_pp2_dp2": {
        "llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "colocated_enc_dp4_llm_pp2_cp2": {
        "llm": (Layout(pp=2, cp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "disaggregated_enc1_llm_cp3": {
        "llm": (Layout(cp=3), [1, 2, 3]),
        "vision": (Layout(dp=1), [0]),
        "audio": (Layout(dp=1), [0]),
    },
    "disaggregated_enc_dp2_llm_dp3": {
        "llm": (Layout(dp=3), [2, 3, 4]),
        "vision": (Layout(dp=2), [0, 1]),
        "audio": (Layout(dp=2), [0, 1]),
    },
    # context parallelism (runtime/parallel/context.py): in the LLM, with DP and with TP, and in an encoder
    "colocated_llm_cp2": {
        "llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "llm_cp2_tp2": {
        "llm": (Layout(cp=2, tp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "enc_cp2_llm_dp2_tp2": {
        "llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
        "audio": (Layout(cp=2, tp=2), [0, 1, 2, 3]),  # the stride-2 stem and downsample 2 under CP, with TP
    },
}


@pytest.fixture(scope="module")
def specs():
    return load_model("tiny"), load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})


@pytest.fixture(scope="module")
def reference(specs):
    model, data = specs
    return run_reference(model, data, seed=SEED, steps=STEPS, dtype=torch.float64, optimizer="sgd", lr=0.1)


def _any_batch():
    """12 samples on DP 5 (ranks hold 3 or 2 before balancing), unbalanced and post-balanced:
    name -> (plan, data, cfg) (test_any_batch_on_any_dp_matches_reference)."""
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 12, "seq_len": 96})
    five = {"llm": (Layout(dp=5), [0, 1, 2, 3, 4])}
    return {
        "homogeneous_dp5": (
            hand_plan(model, data, five, micro_batches=1),
            data,
            TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", balance=Mode.NONE),
        ),
        "homogeneous_dp5_mb2": (
            hand_plan(model, data, five),
            data,
            TrainConfig(
                optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", balance=Mode.ORCH, calibrate=False
            ),
        ),
    }


@pytest.fixture(scope="module")
def launched(specs, tmp_path_factory):
    """Every plan's (losses, grads, params), PLANS' and _any_batch()'s: one launch per world size
    (equivalence.run_plans)."""
    model, data = specs
    cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", balance=Mode.NONE)
    runs = {name: (hand_plan(model, data, layouts), data, cfg) for name, layouts in PLANS.items()} | _any_batch()
    out = tmp_path_factory.mktemp("plans")
    results = {}
    for world in sorted({p.world_size for p, _, _ in runs.values()}):
        group = {n: r for n, r in runs.items() if r[0].world_size == world}
        plans = {n: p for n, (p, _, _) in group.items()}
        datas = {n: d for n, (_, d, _) in group.items()}
        cfgs = {n: c for n, (_, _, c) in group.items()}
        results |= run_plans(plans, datas, cfgs, out / f"world{world}")
    return results


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_plan_matches_reference(name, reference, launched):
    losses, grads, params = launched[name]
    assert len(losses) == STEPS
    for got, want in zip(losses, reference.losses, strict=True):
        assert got == pytest.approx(want, rel=1e-9, abs=0)
    assert_close(grads, reference.grads, 1e-9)
    assert_close(params, reference.params, 1e-8)


@pytest.mark.slow
def test_failing_rank_is_reported_and_nothing_hangs(specs, tmp_path):
    model, data = specs
    plan = hand_plan(model, data, PLANS["disaggregated_enc1_llm_dp3"])
    cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=2, seed=SEED, dtype="float64", balance=Mode.NONE)
    with pytest.raises(LaunchError, match="injected failure at step 1") as info:
        train_local(plan, data, cfg, tmp_path, debug=DebugConfig(fail_at=(2, 1)), timeout_s=30)
    assert info.value.rank == 2


@pytest.mark.slow
def test_out_of_memory_in_a_rank_is_reported_as_such(specs, tmp_path):
    """An allocation the allocator refuses (as CUDA's does on OOM) is recorded as the rank's out-of-memory."""
    model, data = specs
    plan = hand_plan(model, data, PLANS["disaggregated_enc1_llm_dp3"])
    cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=2, seed=SEED, dtype="float64", balance=Mode.NONE)
    debug = DebugConfig(oom_at=(1, 1, 1 << 30))  # 1 PiB: more than any machine
    with pytest.raises(LaunchError, match=r"rank 1 failed: out of memory: RuntimeError: .*can't allocate memory"):
        train_local(plan, data, cfg, tmp_path, debug=debug, timeout_s=30)


@pytest.mark.slow
def test_any_batch_on_any_dp_matches_reference(launched):
    """12 samples on DP 5 (ranks hold 3 or 2 before balancing), unbalanced and post-balanced (run in the
    module's 5-rank launch)."""
    runs = _any_batch()
    model = load_model("tiny")
    ref = run_reference(
        model, runs["homogeneous_dp5"][1], seed=SEED, steps=STEPS, dtype=torch.float64, optimizer="sgd", lr=0.1
    )
    for name in runs:
        losses, grads, params = launched[name]
        assert len(losses) == STEPS, name
        for got, want in zip(losses, ref.losses, strict=True):
            assert got == pytest.approx(want, rel=1e-9, abs=0), name
        assert_close(grads, ref.grads, 1e-9)
        assert_close(params, ref.params, 1e-8)
