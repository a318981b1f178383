"""The learning-rate schedule and the fixed dataset. AdamW with the schedule, per-module rates and the
global-norm clip against the single-process reference under every plan: tests/distributed/test_runtime_fsdp.py."""

import pytest

from orch.planner.balance.mode import Mode
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.optim import lr_at

STEPS, SEED = 4, 11
CFG = TrainConfig(
    steps=STEPS, seed=SEED, dtype="float64", balance=Mode.NONE, optimizer="adamw", lr=0.01, lr_schedule="cosine",
    warmup_steps=2, min_lr=0.001, clip_norm=0.05, module_lr={"vision": 3.0},
)  # fmt: skip


def test_schedule_warms_up_then_decays_to_min_lr():
    lrs = [lr_at(CFG, k) for k in range(STEPS)]
    assert lrs[:2] == [0.005, 0.01]
    assert lrs[-1] == pytest.approx(0.001)
    assert lrs[1] > lrs[2] > lrs[3]
    linear = TrainConfig(steps=5, lr=1.0, lr_schedule="linear")
    assert [lr_at(linear, k) for k in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert lr_at(TrainConfig(steps=5, lr=0.3), 4) == 0.3


def test_a_fixed_dataset_repeats_its_batches():
    assert [TrainConfig(repeat_every=3).data_step(k) for k in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [TrainConfig().data_step(k) for k in range(3)] == [0, 1, 2]
