"""Every step record carries each rank's measured memory: its training state exactly, and its peak."""

import pytest
from launching import train_tasks

from orch.planner.balance.mode import Mode
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig


@pytest.mark.slow
def test_state_bytes_are_what_the_rank_holds_and_tp_shards_them(tmp_path):
    import torch

    from orch.runtime.models.reference import build_model

    model = load_model("tiny")
    data = load_data("tiny-mix").model_copy(update={"global_batch": 4, "seq_len": 64})
    plans = {
        "dp2": hand_plan(model, data, {"llm": (Layout(dp=2), [0, 1])}),
        "llm_tp2": hand_plan(
            model,
            data,
            {"llm": (Layout(tp=2), [0, 1]), "vision": (Layout(dp=2), [0, 1]), "audio": (Layout(dp=2), [0, 1])},
        ),
    }
    cfg = TrainConfig(
        optimizer="sgd", lr=0.1, steps=2, seed=0, dtype="float64", balance=Mode.NONE
    )  # SGD: no optimizer state
    records = train_tasks(plans, data, cfg, tmp_path)
    full = sum(p.numel() for m in build_model(model, 0, torch.float64).values() for p in m.parameters())
    dp2 = records["dp2"][-1].memory
    assert set(dp2) == {"0", "1"}
    assert dp2["0"]["state_bytes"] == dp2["1"]["state_bytes"] == 2 * 8 * full  # parameters and gradients
    tp2 = records["llm_tp2"][-1].memory["0"]["state_bytes"]
    assert tp2 < dp2["0"]["state_bytes"]
    for rec in (*records["dp2"], *records["llm_tp2"]):
        for rank in rec.memory.values():
            assert rank["peak_bytes"] > rank["state_bytes"]  # activations were held for backward
