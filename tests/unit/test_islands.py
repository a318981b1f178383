"""Encoder islands: every grouping, sizes that fill the cluster, and plans with one island per encoder."""

from dataclasses import replace

import pytest

from orch.planner.candidates import Pin, SearchInput
from orch.planner.islands import Islands, IslandSizes, island_layouts, island_sizes, llm_island_sizes, set_partitions
from orch.planner.loading import load_cluster, load_data, parse_text
from orch.planner.plan import Placement
from orch.planner.planner import make_plan
from orch.planner.search import SolverConfig, search
from orch.planner.specs import ClusterSpec, ModelSpec
from orch.runtime.models.registry import load_model

SEVEN = """
name: seven
nodes: 1
gpus_per_node: 7
gpu: {memory_gb: 4, peak_tflops: 0.05}
links: {intra_node_gbps: 2, inter_node_gbps: 1, intra_node_latency_us: 50, inter_node_latency_us: 100}
mfu: 0.5
cpus_per_gpu: 1
"""


@pytest.mark.parametrize(("n", "bell"), [(1, 1), (2, 2), (3, 5), (4, 15)])
def test_set_partitions_are_every_grouping_once(n, bell):
    items = [f"e{i}" for i in range(n)]
    parts = list(set_partitions(items))
    assert len(parts) == bell
    assert len({frozenset(frozenset(g) for g in p) for p in parts}) == bell
    for p in parts:
        assert sorted(x for g in p for x in g) == items


def test_islands_lay_out_ranks_in_order():
    isl = Islands((("vision",), ("audio", "video")), (2, 3))
    assert isl.encoder_gpus == 5
    assert (isl.offset_of("vision"), isl.offset_of("audio"), isl.offset_of("video")) == (0, 2, 2)
    assert isl.size_of("video") == 3 and isl.groups[1] == ("audio", "video")
    assert isl.describe() == "vision:2 | audio+video:3"


def test_island_layouts_fill_the_cluster():
    inp = SearchInput(load_model("tiny"), load_cluster("local-cpu"), load_data("tiny-mix"))  # 2 nodes x 2
    layouts = list(island_layouts(inp))
    assert layouts, "no island layout on 4 GPUs"
    for isl in layouts:
        assert inp.world - isl.encoder_gpus in llm_island_sizes(inp)
    # separate islands of one rank each, the LLM on the second node
    assert Islands((("vision",), ("audio",)), (1, 1)) in layouts


def test_one_island_per_encoder_on_seven_gpus():
    """Vision on 2, audio on 2, the LLM on 3: 'no layout satisfies these pins' before encoder islands."""
    cluster = parse_text(ClusterSpec, "seven", SEVEN)
    model = load_model("tiny")
    pins = tuple(Pin.parse(t, model) for t in ("vision.gpus=2", "audio.gpus=2", "llm.gpus=3"))
    inp = SearchInput(model, cluster, load_data("tiny-mix"), pins=pins, placements=(Placement.DISAGGREGATED,))
    plan = make_plan(inp, SolverConfig(alternatives=0))
    assert plan.placement == Placement.DISAGGREGATED and plan.schedule == "graph_1f1b"
    assert plan.modules["vision"].ranks == [0, 1]
    assert plan.modules["audio"].ranks == [2, 3]
    assert plan.modules["llm"].ranks == [4, 5, 6]


def test_search_may_group_encoders_or_not():
    """Unpinned, the optimum over every grouping is at least as good as the one-island optimum."""
    cluster = parse_text(ClusterSpec, "seven", SEVEN)
    inp = SearchInput(load_model("tiny"), cluster, load_data("tiny-mix"), placements=(Placement.DISAGGREGATED,))
    best = search(inp, SolverConfig(alternatives=0))[0].best
    assert best.islands is not None
    from orch.planner.candidates import module_candidates
    from orch.planner.evaluate import evaluate

    one_island = float("inf")
    for k in island_sizes(inp):
        encs = {e: module_candidates(inp, e, k, Placement.DISAGGREGATED) for e in inp.model.encoder_names}
        llms = module_candidates(inp, "llm", inp.world - k, Placement.DISAGGREGATED)
        for v in encs["vision"]:
            for a in encs["audio"]:
                for lc in llms:
                    c = evaluate(inp, Placement.DISAGGREGATED, {"vision": v, "audio": a, "llm": lc})
                    one_island = min(one_island, c.step_s) if c else one_island
    assert best.step_s <= one_island * (1 + 1e-6)


def test_large_clusters_search_a_layout_grid_of_sizes_with_the_pins_in_it():
    model = load_model("omni-84b")
    cluster = load_cluster("h100-80g", 320)
    data = load_data("omni-mix").model_copy(update={"global_batch": 5120})
    inp = SearchInput(model, cluster, data, pins=(Pin("vision", "gpus", 1032),))
    sizes = IslandSizes.of(inp)
    assert len(sizes.encoders) < len(island_sizes(inp)) and len(sizes.llm) < len(llm_island_sizes(inp))
    assert 1032 in sizes.encoders
    assert set(sizes.llm) <= set(llm_island_sizes(inp))
    # small clusters: every size
    small = SearchInput(load_model("tiny"), load_cluster("local-cpu"), load_data("tiny-mix"))
    assert IslandSizes.of(small) == IslandSizes(tuple(island_sizes(small)), tuple(llm_island_sizes(small)))


def test_tp_never_splits_kv_heads_unevenly():
    """A model with one KV head (found by bench_sweep: profile ranks died in unflatten at TP 2)."""
    from orch.planner.candidates import layouts
    from orch.planner.plan import Layout
    from orch.runtime.plans import hand_plan
    from orch.runtime.profile.cases import tp_degrees
    from orch.runtime.train.support import UnsupportedPlan, check_supported

    model = parse_text(
        ModelSpec,
        "gqa1",
        """
name: gqa1
modules:
  vision: {kind: encoder, modality: vision, layers: 1, hidden: 16, heads: 2, ffn: 32, feeds: llm}
  llm: {kind: llm, layers: 2, hidden: 24, heads: 2, kv_heads: 1, ffn: 72, vocab: 512}
""",
    )
    assert not model.llm.splits_over(2) and model.modules["vision"].splits_over(2)
    inp = SearchInput(model, load_cluster("local-cpu"), load_data("tiny-mix"))
    assert {lay.tp for lay in layouts(inp, "llm", 4, allow_pp=True)} == {1}
    assert tp_degrees(model, "llm", 4, 2) == [1] and tp_degrees(model, "vision", 4, 2) == [1, 2]
    plan = hand_plan(model, load_data("tiny-mix"), {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3])})
    with pytest.raises(UnsupportedPlan, match=r"modules\.llm\.layout\.tp: 2: does not split 2 heads, 1 KV heads"):
        check_supported(plan)


def test_encoder_islands_at_any_dp_beside_the_llm_at_another():
    """Issue 33: encoders at DP 2 on islands of 2, the LLM at DP 3 on 3 (a 2:3 boundary, which the runtime's
    routing runs: tests/distributed 'disaggregated_enc_dp2_llm_dp3') used to be 'no layout satisfies'."""
    cluster = parse_text(ClusterSpec, "seven", SEVEN)
    model = load_model("tiny")
    fixes = ("vision.gpus=2", "audio.gpus=2", "vision.dp=2", "audio.dp=2", "llm.gpus=3", "llm.dp=3")
    inp = SearchInput(model, cluster, load_data("tiny-mix"), pins=tuple(Pin.parse(t, model) for t in fixes))
    plan = make_plan(inp, SolverConfig(alternatives=0))
    assert plan.placement == Placement.DISAGGREGATED
    assert {n: (m.layout.dp, m.ranks) for n, m in plan.modules.items()} == {
        "vision": (2, [0, 1]),
        "audio": (2, [2, 3]),
        "llm": (3, [4, 5, 6]),
    }
    assert {(e.src, e.kind.value) for e in plan.edges} == {("vision", "fan_out"), ("audio", "fan_out")}


def test_a_dp_pin_is_checked_against_the_gpus_the_module_gets():
    """`--fix vision.dp=2` on 7 GPUs: 2 does not divide the cluster, but an island of 2 (or 4, 6) does."""
    cluster = parse_text(ClusterSpec, "seven", SEVEN)
    model = load_model("tiny")
    inp = SearchInput(model, cluster, load_data("tiny-mix"), pins=(Pin.parse("vision.dp=2", model),))
    plan = make_plan(inp, SolverConfig(alternatives=0))
    assert plan.placement == Placement.DISAGGREGATED and plan.modules["vision"].layout.dp == 2
    # without islands the module spans the cluster, and the pin must divide it
    from orch.planner.errors import SpecError

    with pytest.raises(SpecError, match=r"vision.dp=2: tp\*cp\*pp\*dp = 2 does not divide the module's 7 GPUs$"):
        make_plan(replace(inp, placements=(Placement.COLOCATED,)))
    with pytest.raises(SpecError, match=r"dp = 8 does not divide the module's 7 GPUs and leaves no GPU for the others"):
        make_plan(replace(inp, pins=(Pin.parse("vision.dp=8", model),)))
