"""AdamW with warmup, cosine decay, per-module rates and global-norm clipping: every plan matches the
single-process reference in float64 (losses 1e-9, parameters after the steps 1e-8), clipping included.

The clip is set below the gradient's norm so every step is clipped: the norm each plan computes from
its shards (TP shards once each, replicas once, pipeline stages their own layers) must be the one
torch.nn.utils.clip_grad_norm_ computes over the whole model, or the parameters part.
"""

import pytest
import torch
from equivalence import assert_close, merged
from launching import train_tasks

from orch.planner.balance.mode import Mode
from orch.planner.loading import load_data, load_model
from orch.planner.plan import Layout
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.optim import lr_at
from orch.runtime.train.single_process import run_reference

STEPS, SEED = 4, 11
PLANS = {
    "homogeneous_tp2_dp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3])},
    "colocated_enc_dp4_llm_pp2_tp2": {
        "llm": (Layout(pp=2, tp=2), [0, 1, 2, 3]),
        "vision": (Layout(dp=4), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
    "colocated_enc_tp2_dp2_llm_cp2_dp2": {
        "llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
        "vision": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        "audio": (Layout(dp=4), [0, 1, 2, 3]),
    },
}
CFG = TrainConfig(
    steps=STEPS, seed=SEED, dtype="float64", balance=Mode.NONE, optimizer="adamw", lr=0.01, lr_schedule="cosine",
    warmup_steps=2, min_lr=0.001, clip_norm=0.05, module_lr=(("vision", 3.0),),
)  # fmt: skip


def test_schedule_warms_up_then_decays_to_min_lr():
    lrs = [lr_at(CFG, k) for k in range(STEPS)]
    assert lrs[:2] == [0.005, 0.01]
    assert lrs[-1] == pytest.approx(0.001)
    assert lrs[1] > lrs[2] > lrs[3]
    linear = TrainConfig(steps=5, lr=1.0, lr_schedule="linear")
    assert [lr_at(linear, k) for k in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert lr_at(TrainConfig(steps=5, lr=0.3), 4) == 0.3


@pytest.mark.slow
def test_adamw_schedule_and_clipping_match_the_reference(tmp_path):
    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})
    ref = run_reference(model, data, seed=SEED, steps=STEPS, dtype=torch.float64, train=CFG)
    plans = {name: hand_plan(model, data, layout) for name, layout in PLANS.items()}
    records = train_tasks(plans, data, CFG, tmp_path)
    for name in PLANS:
        losses = [r.loss for r in records[name]]
        assert losses == pytest.approx(ref.losses, rel=1e-9), name
        norms = [r.grad_norm for r in records[name]]
        assert all(n is not None and n > CFG.clip_norm for n in norms), (name, norms)  # every step was clipped
        assert [r.lr for r in records[name]] == [lr_at(CFG, k) for k in range(STEPS)]
        assert_close(merged(tmp_path / name, "params"), ref.params, rel=1e-8)


def test_a_fixed_dataset_repeats_its_batches():
    assert [TrainConfig(repeat_every=3).data_step(k) for k in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert [TrainConfig().data_step(k) for k in range(3)] == [0, 1, 2]
