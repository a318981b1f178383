"""Runtime pieces without a process group: grids, data determinism, model shapes, plans."""

import pytest
import torch

from orch.planner.loading import load_data
from orch.planner.plan import Axis, EdgeKind, Layout, ModulePlan, Placement, Transport
from orch.planner.specs import projected_len
from orch.runtime.data.batch import initial_dp_index
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.models.reference import build_model
from orch.runtime.models.registry import load_model
from orch.runtime.parallel.boundary import expected_kind
from orch.runtime.parallel.grid import Grid
from orch.runtime.plans import hand_plan


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny"), load_data("tiny-mix").model_copy(update={"global_batch": 8, "seq_len": 96})


def test_grid_rank_order_is_tp_fastest_then_cp_dp_pp():
    g = Grid("llm", tp=2, cp=1, dp=2, pp=2, ranks=tuple(range(10, 18)))
    assert g.shape == (2, 2, 1, 2)
    assert g.rank_at(pp=1, dp=0, tp=1) == 15
    c = g.coord(15)
    assert (c.pp, c.dp, c.cp, c.tp) == (1, 0, 0, 1)
    assert g.coord(3) is None
    assert g.leader(1, pp=1) == 16
    assert g.replica_ranks(1) == [12, 13]
    assert g.degree(Axis.TP) == 2


def test_grid_from_plan_and_validation():
    mp = ModulePlan(layout=Layout(tp=2, dp=2), ranks=[3, 2, 1, 0], micro_batch=1, num_micro_batches=1, memory_gb=0)
    g = Grid.from_plan("vision", mp)
    assert g.ranks == (3, 2, 1, 0) and g.leader(1) == 1
    with pytest.raises(ValueError, match="ranks for"):
        Grid("x", tp=2, cp=1, dp=2, pp=1, ranks=(0, 1, 2))
    with pytest.raises(ValueError, match="repeat"):
        Grid("x", tp=2, cp=1, dp=1, pp=1, ranks=(0, 0))


def test_grid_equality_ignores_mesh_cache():
    a = Grid("x", tp=1, cp=1, dp=2, pp=1, ranks=(0, 1))
    b = Grid("x", tp=1, cp=1, dp=2, pp=1, ranks=(0, 1))
    assert a == b


def test_global_batch_depends_on_seed_and_step_only(tiny):
    model, data = tiny
    a = SyntheticBatch.build(model, data, seed=3, step=1)
    b = SyntheticBatch.build(model, data, seed=3, step=1)
    assert a == b
    assert SyntheticBatch.build(model, data, seed=3, step=2) != a
    assert SyntheticBatch.build(model, data, seed=4, step=1) != a
    sa, sb = a.sample(5, torch.float64), b.sample(5, torch.float64)
    assert torch.equal(sa.text, sb.text) and torch.equal(sa.labels, sb.labels)
    for e in model.encoder_names:
        assert torch.equal(sa.feats[e], sb.feats[e])


def test_sample_shapes_follow_lengths(tiny):
    model, data = tiny
    batch = SyntheticBatch.build(model, data, seed=0, step=0)
    for i in range(batch.size):
        s = batch.sample(i, torch.float32)
        assert s.text.shape == s.labels.shape == (batch.text_tokens[i],)
        assert s.feats["vision"].shape == (batch.enc_tokens[i]["vision"], 48)
        assert s.feats["audio"].shape == (2 * batch.enc_tokens[i]["audio"], 16)  # stride-2 conv stem
        llm_len = sum(batch.projected(e, i) for e in model.encoder_names) + batch.text_tokens[i]
        assert batch.text_tokens[i] >= 1 and (llm_len <= data.seq_len or batch.text_tokens[i] == 1)
    assert batch.label_tokens == sum(batch.text_tokens)


def test_initial_placement_round_robin():
    assert [initial_dp_index(i, 3) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_init_is_a_function_of_the_seed(tiny):
    model, _ = tiny
    a = build_model(model, seed=1, dtype=torch.float64)
    b = build_model(model, seed=1, dtype=torch.float64, names=["llm"])
    c = build_model(model, seed=2, dtype=torch.float64, names=["llm"])
    for (n, p), (_, q), (_, r) in zip(
        a["llm"].named_parameters(), b["llm"].named_parameters(), c["llm"].named_parameters(), strict=True
    ):
        assert torch.equal(p, q), n
        assert not torch.equal(p, r), n


def test_attention_does_not_cross_samples(tiny):
    model, _ = tiny
    llm = build_model(model, seed=0, dtype=torch.float64, names=["llm"])["llm"]
    h = model.llm.hidden
    p1, p2 = torch.randn(3, h, dtype=torch.float64), torch.randn(0, h, dtype=torch.float64)
    t1, t2 = torch.tensor([1, 2, 3]), torch.tensor([4, 5])
    packed = llm([p1, p2], [t1, t2])
    alone = torch.cat([llm([p1], [t1]), llm([p2], [t2])])
    torch.testing.assert_close(packed, alone, rtol=1e-12, atol=1e-12)


def test_projector_merges_with_padding():
    assert [projected_len(n, 2) for n in (0, 1, 2, 3)] == [0, 1, 1, 2]


def test_hand_plan_edges(tiny):
    model, data = tiny
    enc = (Layout(dp=2), [0, 1])
    plan = hand_plan(model, data, {"llm": (Layout(dp=3), [2, 3, 4]), "vision": enc, "audio": enc})
    assert plan.placement == Placement.DISAGGREGATED and plan.world_size == 5
    edge = {e.src: e for e in plan.edges}["vision"]
    assert edge.kind == EdgeKind.FAN_OUT and edge.transport == Transport.P2P
    assert expected_kind(4, 2) == EdgeKind.FAN_IN and expected_kind(2, 2) == EdgeKind.EQUAL_DP


def test_global_batch_ignores_key_order_of_the_data_spec(tiny):
    model, data = tiny
    shuffled = data.model_copy(
        update={"tasks": [t.model_copy(update={"tokens": dict(reversed(t.tokens.items()))}) for t in data.tasks]}
    )
    assert SyntheticBatch.build(model, shuffled, seed=0, step=0) == SyntheticBatch.build(model, data, seed=0, step=0)


def test_global_batch_ignores_module_order_of_the_model_spec(tiny):
    model, data = tiny
    reordered = model.model_copy(update={"modules": dict(reversed(model.modules.items()))})
    a, b = SyntheticBatch.build(model, data, 0, 0), SyntheticBatch.build(reordered, data, 0, 0)
    assert a.enc_tokens == b.enc_tokens and a.text_tokens == b.text_tokens
    assert torch.equal(a.sample(1, torch.float64).feats["audio"], b.sample(1, torch.float64).feats["audio"])
