"""Tensor parallelism of any degree that splits a module's heads (issue 44): InternVL-78B's tower, InternViT-6B
(25 heads, 3,200 wide, 45 blocks), takes TP 5 where data parallelism alone does not fit beside its state."""

import pytest

from orch.planner.candidates import SearchInput, module_candidates, tp_degrees
from orch.planner.costs import CostConfig, Links
from orch.planner.loading import load_cluster
from orch.planner.plan import Layout, Placement, Sharding
from orch.planner.planner import make_plan
from orch.planner.search import SolverConfig
from orch.planner.specs import DataSpec, ModelSpec, ModuleSpec
from orch.runtime.plans import hand_plan
from orch.runtime.train.support import UnsupportedPlan, check_supported

# InternVL2.5-78B's shape: InternViT-6B tiles of 448 px (32 x 32 patches of 14 px, pixel-shuffled 4 into one
# LLM token through a two-layer MLP) feeding a Qwen2.5-72B-shaped LLM.
INTERNVL_78B = ModelSpec.model_validate(
    {
        "name": "internvl-78b-shaped",
        "modules": {
            "vision": {"kind": "encoder", "modality": "vision", "layers": 45, "hidden": 3200, "heads": 25,
                       "ffn": 12800, "mlp": "gelu", "input_dim": 588, "downsample": 4, "image_tokens": 1024,
                       "projector_hidden": 8192, "feeds": "llm"},
            "llm": {"kind": "llm", "layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 29568,
                    "vocab": 151674},
        },
    }
)  # fmt: skip
# 12 tiles an image (InternVL's max_dynamic_patch), 2 samples per GPU on 5 nodes of 8 x 80 GB
TILES = DataSpec.model_validate(
    {"global_batch": 80, "seq_len": 8192, "tasks": [{"weight": 1, "tokens": {"vision": 12 * 1024, "llm": 3584}}]}
)


def _spec(**shape) -> ModuleSpec:
    return ModuleSpec.model_validate({"kind": "encoder", "layers": 1, "feeds": "llm", **shape})


def test_tp_candidates_are_every_degree_that_splits_heads_kv_heads_and_ffn():
    vit = INTERNVL_78B.modules["vision"]
    assert tp_degrees(vit, 8) == [1, 5]  # powers of two alone left it only 1
    assert tp_degrees(INTERNVL_78B.llm, 8) == [1, 2, 4, 8]
    assert tp_degrees(_spec(hidden=1280, heads=20, ffn=5120), 8) == [1, 2, 4, 5]  # a Whisper-large audio tower
    assert tp_degrees(_spec(hidden=768, heads=12, ffn=3072), 8) == [1, 2, 3, 4, 6]
    assert tp_degrees(_spec(hidden=768, heads=12, kv_heads=4, ffn=3072), 8) == [1, 2, 4]  # whole KV heads
    assert tp_degrees(_spec(hidden=768, heads=12, ffn=3070), 8) == [1, 2]  # an equal FFN slice
    assert tp_degrees(_spec(hidden=768, heads=12, ffn=3072, max_tp=3), 8) == [1, 2, 3]
    assert tp_degrees(vit, 4) == [1]  # inside a node
    # on several nodes a degree whose groups straddle two nodes only where no other splits the module
    assert tp_degrees(vit, 8, nodes=5) == [1, 5]
    assert tp_degrees(_spec(hidden=1280, heads=20, ffn=5120), 8, nodes=5) == [1, 2, 4]
    assert tp_degrees(_spec(hidden=768, heads=12, ffn=3072), 8, nodes=2) == [1, 2, 4]


def test_a_tp_group_straddling_two_nodes_is_priced_on_the_inter_node_link():
    links = Links.build(load_cluster("h100-80g", 5), None)
    assert links.axis(1, 5) == pytest.approx((50, 15e-6))  # TP 5 on 8-GPU nodes: ranks 5-9 span two nodes
    assert links.axis(1, 4) == pytest.approx((450, 5e-6))
    assert Links.build(load_cluster("h100-80g", 1), None).axis(1, 5) == pytest.approx((450, 5e-6))  # one node


def test_an_internvit_6b_tower_takes_tp_5_where_data_parallelism_alone_does_not_fit():
    """Gathered once per step (fsdp keep), the tower holds its 5.5B parameters in bf16 and their gradients in
    fp32, 33 GB, at every DP degree: beside any layout of the LLM on the same GPUs no TP 1 layout fits, while TP 5
    holds a fifth of it. Before, the planner tried TP 1 only (25 heads: no power of two but 1 divides them) and
    found no plan."""
    inp = SearchInput(INTERNVL_78B, load_cluster("h100-80g", 5), TILES, cfg=CostConfig(sharding=Sharding.KEEP))
    plan = make_plan(inp, SolverConfig(alternatives=0))
    assert plan.modules["vision"].layout.tp == 5
    # the memory model says why: the tower's state at TP 1 and the smallest LLM beside it pass the GPU
    vision = module_candidates(inp, "vision", inp.world, Placement.COLOCATED, prune=False)
    llm = module_candidates(inp, "llm", inp.world, Placement.COLOCATED, prune=False)
    smallest_llm = min(c.memory_gb for c in llm)
    dp_only = [c for c in vision if c.layout.tp == 1]
    assert dp_only and min(c.cost.params_gb for c in dp_only) > 33
    assert min(c.memory_gb for c in dp_only) + smallest_llm > inp.capacity_gb
    tp5 = [c for c in vision if c.layout.tp == 5]
    assert min(c.cost.params_gb for c in tp5) < min(c.cost.params_gb for c in dp_only) / 4
    assert min(c.memory_gb for c in tp5) + smallest_llm <= inp.capacity_gb


def test_a_plan_whose_tp_does_not_split_the_heads_is_one_line():
    plan = hand_plan(INTERNVL_78B, TILES, {"llm": (Layout(tp=8, dp=5), list(range(40)))})
    with pytest.raises(UnsupportedPlan) as err:
        check_supported(plan)
    assert str(err.value) == ("modules.vision.layout.tp: 8: does not split 25 heads, 25 KV heads and FFN 12800 evenly")
