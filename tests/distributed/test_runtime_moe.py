"""Mixture-of-Experts and expert parallelism: the MoE block's math, EP refusals, and float64 equivalence.

The multi-process plans run on gloo against the single-process reference (all experts local):
loss within 1e-9 relative at every step, step-0 gradients within 1e-9, parameters after 3 SGD
steps within 1e-8, as in test_runtime_equivalence.py.
"""

import pytest
import torch
from equivalence import assert_close, run_plans

from orch.planner.balance.mode import Mode
from orch.planner.loading import load_data
from orch.planner.plan import Layout
from orch.runtime.models.reference import MoE, build_model, init_module
from orch.runtime.models.registry import load_model
from orch.runtime.parallel.expert import ep_groups, expert_owner, local_experts
from orch.runtime.parallel.grid import Grid
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.single_process import run_reference
from orch.runtime.train.support import UnsupportedPlan, check_supported

STEPS = 2
SEED = 7


@pytest.fixture(scope="module")
def moe_model():
    return load_model("tiny-moe")


def _data(global_batch: int = 8):
    return load_data("tiny-mix").model_copy(update={"global_batch": global_batch, "seq_len": 96})


@pytest.mark.parametrize("mlp", ["swiglu", "gelu"])
def test_moe_block_equals_a_per_token_loop(moe_model, mlp):
    spec = moe_model.llm.model_copy(update={"mlp": mlp})
    moe = MoE(spec).to(torch.float64)
    init_module(moe, "moe", SEED)
    x = torch.randn(37, spec.hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = moe(x)
    want = torch.zeros_like(x)
    for t in range(x.shape[0]):
        probs = torch.softmax(x[t] @ moe.router.weight.T, -1)
        top = sorted(range(spec.experts), key=lambda e: (-probs[e].item(), e))[: spec.top_k]
        norm = sum(probs[e] for e in top)
        for e in top:
            want[t] += probs[e] / norm * moe.experts[str(e)](x[t : t + 1])[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # Dropless: a token's output does not depend on the tokens it shares the call with.
    torch.testing.assert_close(torch.cat([moe(x[:5]), moe(x[5:])]), got, rtol=1e-12, atol=1e-12)
    assert moe(x[:0]).shape == (0, spec.hidden)


def test_moe_llm_blocks_and_parameter_names(moe_model):
    llm = build_model(moe_model, SEED, torch.float64, ["llm"])["llm"]
    names = {n for n, _ in llm.named_parameters()}
    assert "blocks.0.mlp.router.weight" in names and "blocks.3.mlp.experts.3.down.weight" in names
    assert not any(".mlp.gate." in n for n in names)
    # An empty micro-batch still has a graph through every layer (EP ranks run it for the all_to_alls).
    logits = llm([], [])
    assert logits.shape == (0, moe_model.llm.vocab) and logits.requires_grad


def test_expert_placement_and_groups():
    assert [expert_owner(e, 4, 2) for e in range(4)] == [0, 0, 1, 1]
    assert local_experts(1, 8, 4) == [2, 3]
    g = Grid("llm", tp=2, cp=1, dp=4, pp=1, ranks=tuple(range(8)))
    eps, edps = ep_groups(g, 2)
    # EP groups: consecutive DP indices with the same tp; EDP: the same EP rank across EP groups.
    assert eps == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert edps == [[0, 4], [2, 6], [1, 5], [3, 7]]


def test_ep_not_dividing_experts_is_refused(moe_model):
    enc = {e: (Layout(dp=3), [0, 1, 2]) for e in ("vision", "audio")}
    plan = hand_plan(moe_model, _data(), {"llm": (Layout(dp=3, ep=3), [0, 1, 2]), **enc})
    with pytest.raises(UnsupportedPlan, match=r"modules\.llm\.layout\.ep: 3 does not divide the module's 4 experts"):
        check_supported(plan)
    enc = {e: (Layout(dp=2), [0, 1]) for e in ("vision", "audio")}
    dense = hand_plan(load_model("tiny"), _data(), {"llm": (Layout(dp=2, ep=2), [0, 1]), **enc})
    with pytest.raises(UnsupportedPlan, match=r"modules\.llm\.layout\.ep: 2 does not divide the module's 1 experts"):
        check_supported(dense)
    # Encoders run no EP (their micro-batch loop does not pad empty micro-batches).
    with pytest.raises(UnsupportedPlan, match=r"modules\.vision\.layout\.ep: 2: expert parallelism is executed for"):
        check_supported(hand_plan(moe_model, _data(), {"llm": (Layout(dp=2, ep=2), [0, 1])}))
    check_supported(hand_plan(moe_model, _data(), {"llm": (Layout(dp=4, ep=4), [0, 1, 2, 3]), **ENC_DP4}))


ENC_DP4 = {"vision": (Layout(dp=4), [0, 1, 2, 3]), "audio": (Layout(dp=4), [0, 1, 2, 3])}
PLANS = {
    "moe_llm_dp4_ep2": ({"llm": (Layout(dp=4, ep=2), [0, 1, 2, 3]), **ENC_DP4}, 8),
    "moe_llm_dp2_ep2_tp2": (
        {
            "llm": (Layout(tp=2, dp=2, ep=2), [0, 1, 2, 3]),
            "vision": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
            "audio": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        },
        8,
    ),
    # 7 samples over dp4: DP index 3 runs one real and one empty micro-batch.
    "moe_llm_dp4_ep4_uneven": ({"llm": (Layout(dp=4, ep=4), [0, 1, 2, 3]), **ENC_DP4}, 7),
    # 3 samples over dp4: DP index 3 holds no sample at all and still joins every all_to_all.
    "moe_llm_dp4_ep2_empty_rank": ({"llm": (Layout(dp=4, ep=2), [0, 1, 2, 3]), **ENC_DP4}, 3),
    # EP with CP: each CP rank routes its own positions' tokens; expert gradients sum over EDP and CP
    "moe_llm_cp2_dp2_ep2": ({"llm": (Layout(cp=2, dp=2, ep=2), [0, 1, 2, 3]), **ENC_DP4}, 8),
    "moe_llm_cp2_dp2_ep2_empty": ({"llm": (Layout(cp=2, dp=2, ep=2), [0, 1, 2, 3]), **ENC_DP4}, 3),
    # EP inside a pipeline stage, one DP index short of samples: empty micro-batches cross the stages
    "moe_llm_pp2_dp2_ep2_empty": ({"llm": (Layout(pp=2, dp=2, ep=2), [0, 1, 2, 3]), **ENC_DP4}, 3),
}

_references: dict[int, object] = {}


def _reference(model, global_batch):
    if global_batch not in _references:
        _references[global_batch] = run_reference(
            model, _data(global_batch), seed=SEED, steps=STEPS, optimizer="sgd", lr=0.1
        )
    return _references[global_batch]


@pytest.fixture(scope="module")
def launched(moe_model, tmp_path_factory):
    """Every plan's (losses, grads, params) and its output folder: ONE launch (every plan has 4 ranks; each
    runs on its own global batch)."""
    data = {name: _data(gb) for name, (_, gb) in PLANS.items()}
    plans = {name: hand_plan(moe_model, data[name], layouts) for name, (layouts, _) in PLANS.items()}
    assert {p.world_size for p in plans.values()} == {4}
    cfg = TrainConfig(optimizer="sgd", lr=0.1, steps=STEPS, seed=SEED, dtype="float64", balance=Mode.NONE)
    out = tmp_path_factory.mktemp("moe")
    return {n: (*r, out / n) for n, r in run_plans(plans, data, cfg, out).items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_moe_plan_matches_reference(name, moe_model, launched):
    layouts, global_batch = PLANS[name]
    reference = _reference(moe_model, global_batch)
    losses, grads, params, out = launched[name]
    assert len(losses) == STEPS
    for got, want in zip(losses, reference.losses, strict=True):
        assert got == pytest.approx(want, rel=1e-9, abs=0)
    assert_close(grads, reference.grads, 1e-9)
    assert_close(params, reference.params, 1e-8)
    # Each writing rank held only its EP rank's experts (experts / ep of them).
    ep = layouts["llm"][0].ep
    for f in out.glob("params.rank*.pt"):
        held = {n.split(".experts.")[1].split(".")[0] for n in torch.load(f) if ".experts." in n}
        assert len(held) in (0, moe_model.llm.experts // ep), (f.name, held)
