"""FSDP2 data parallelism (runtime/parallel/fsdp.py) under every placement, with AdamW, warmup, cosine decay,
a per-module rate and the global-norm clip (below the gradient's norm, so every step is clipped: the norm
each plan computes from its shards must be the whole model's) on: float64 losses (1e-9) and parameters after the steps (1e-8) equal the single-process reference,
composed with TP, CP (sharded over the flattened (dp, cp) ranks), PP and EP (experts outside FSDP2), beside
replicated modules, and with recompute (which changes no loss). All in one launch.
"""

import pytest
import torch
from equivalence import assert_close, merged
from launching import train_tasks

from orch.planner.balance.mode import Mode
from orch.planner.loading import load_data
from orch.planner.plan import DataParallel, Layout, Recompute
from orch.runtime.models.registry import load_model
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.optim import lr_at
from orch.runtime.train.single_process import run_reference

FSDP, REPLICATE = DataParallel.FSDP, DataParallel.REPLICATE
STEPS, SEED = 2, 11
ENC_DP4 = {"vision": (Layout(dp=4), [0, 1, 2, 3]), "audio": (Layout(dp=4), [0, 1, 2, 3])}
# name -> (model, layouts, data_parallel, recompute)
PLANS = {
    "homogeneous_tp2_dp2": ("tiny", {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3])}, FSDP, Recompute.NONE),
    "colocated_llm_pp2_dp2": ("tiny", {"llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]), **ENC_DP4}, FSDP, Recompute.NONE),
    "colocated_llm_cp2_dp2_vision_tp2_dp2": (
        "tiny",
        {
            "llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
            "vision": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
            "audio": ENC_DP4["audio"],
        },
        FSDP,
        Recompute.NONE,
    ),
    "disaggregated_enc1_llm_dp3": (
        "tiny",
        {"llm": (Layout(dp=3), [1, 2, 3]), "vision": (Layout(dp=1), [0]), "audio": (Layout(dp=1), [0])},
        FSDP,
        Recompute.NONE,
    ),
    "llm_fsdp_encoders_replicated": (
        "tiny",
        {"llm": (Layout(dp=4), [0, 1, 2, 3]), **ENC_DP4},
        {"llm": FSDP, "vision": REPLICATE, "audio": REPLICATE},
        Recompute.NONE,
    ),
    "replicated_llm_cp2_dp2_vision_tp2_dp2": (
        "tiny",
        {
            "llm": (Layout(cp=2, dp=2), [0, 1, 2, 3]),
            "vision": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
            "audio": ENC_DP4["audio"],
        },
        REPLICATE,
        Recompute.NONE,
    ),
    "moe_dp4_ep2": ("tiny-moe", {"llm": (Layout(dp=4, ep=2), [0, 1, 2, 3]), **ENC_DP4}, FSDP, Recompute.NONE),
    "text_only_llm_dp4": ("text", {"llm": (Layout(dp=4), [0, 1, 2, 3])}, FSDP, Recompute.NONE),  # no encoders
    "recompute_full": ("tiny", {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3])}, FSDP, Recompute.FULL),
    "recompute_selective": (
        "tiny",
        {"llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]), **ENC_DP4},
        FSDP,
        {"llm": Recompute.SELECTIVE, "vision": Recompute.FULL, "audio": Recompute.SELECTIVE},
    ),
}
CFG = TrainConfig(
    steps=STEPS, seed=SEED, dtype="float64", balance=Mode.NONE, optimizer="adamw", lr=0.01, lr_schedule="cosine",
    warmup_steps=1, min_lr=0.001, clip_norm=0.05, module_lr={"vision": 3.0},
)  # fmt: skip
SGD = TrainConfig(
    optimizer="sgd", lr=0.1, steps=2, seed=SEED, dtype="float64", balance=Mode.NONE
)  # no optimizer state: params + grads
STATE = {"state_fsdp_dp4": FSDP, "state_replicate_dp4": REPLICATE}
PRECISION = {"float32": "float32", "bfloat16": "bfloat16"}


def _model(name: str):
    if name == "text":  # the tiny preset's LLM alone
        tiny = load_model("tiny")
        return tiny.model_copy(update={"name": "tiny-text", "modules": {"llm": tiny.modules["llm"]}})
    return load_model(name)


def _data():
    return load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    data = _data()
    plans, cfgs = {}, {}
    for name, (model, layouts, dp, rc) in PLANS.items():
        plans[name], cfgs[name] = hand_plan(_model(model), data, layouts, data_parallel=dp, recompute=rc), CFG
    for name, dp in STATE.items():
        plans[name], cfgs[name] = (
            hand_plan(load_model("tiny"), data, {"llm": (Layout(dp=4), [0, 1, 2, 3])}, data_parallel=dp),
            SGD,
        )
    for name, dtype in PRECISION.items():
        plans[name] = hand_plan(load_model("tiny"), data, {"llm": (Layout(dp=4), [0, 1, 2, 3])}, data_parallel=FSDP)
        cfgs[name] = SGD.model_copy(update={"dtype": dtype})  # an update proportional to the gradient
    out = tmp_path_factory.mktemp("fsdp")
    return train_tasks(plans, data, cfgs, out), out


_refs: dict[str, object] = {}


def _reference(model: str):
    if model not in _refs:
        _refs[model] = run_reference(_model(model), _data(), seed=SEED, steps=STEPS, dtype=torch.float64, train=CFG)
    return _refs[model]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_fsdp_plan_matches_the_reference(name, launched):
    records, out = launched
    ref = _reference(PLANS[name][0])
    assert [r.loss for r in records[name]] == pytest.approx(ref.losses, rel=1e-9)
    assert all(r.grad_norm > CFG.clip_norm for r in records[name])  # every step clipped: the norm is the whole model's
    assert [r.lr for r in records[name]] == [lr_at(CFG, k) for k in range(STEPS)]
    assert_close(merged(out / name, "params"), ref.params, rel=1e-8)


@pytest.mark.slow
def test_fsdp_shards_the_state_over_dp(launched):
    records, _ = launched
    sharded = records["state_fsdp_dp4"][-1].memory
    replicated = records["state_replicate_dp4"][-1].memory
    # every rank holds the whole state under replicate; under fsdp the four shards add up to it
    whole = {r["state_bytes"] for r in replicated.values()}
    assert len(whole) == 1
    assert sum(r["state_bytes"] for r in sharded.values()) == whole.pop()
    for rank in sharded.values():
        assert rank["peak_bytes"] > rank["state_bytes"]  # the step gathers full parameters and gradients


@pytest.mark.slow
def test_bfloat16_computes_in_bf16_on_fp32_masters(launched):
    records, out = launched
    f32 = [r.loss for r in records["float32"]]
    bf16 = [r.loss for r in records["bfloat16"]]
    assert bf16 != f32  # the math ran in bf16
    assert bf16 == pytest.approx(f32, rel=2e-2)
    params = merged(out / "bfloat16", "params")
    assert params and all(p.dtype == torch.float32 for p in params.values())  # the masters stay fp32
    assert_close(
        params, merged(out / "float32", "params"), rel=2e-2
    )  # the same training, to bf16's precision (as the losses)
