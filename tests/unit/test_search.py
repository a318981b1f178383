"""The CP-SAT search finds the optimum of its own cost model (brute force on small spaces),
honours pins and rules, and agrees with the papers' direction on the presets."""

import itertools
from dataclasses import replace

import pytest

from orch.planner.candidates import Pin, SearchInput, homogeneous_options, module_candidates
from orch.planner.errors import InfeasibleError, SpecError
from orch.planner.evaluate import evaluate, evaluate_homogeneous
from orch.planner.islands import island_layouts
from orch.planner.loading import load_cluster, load_data, parse_text
from orch.planner.plan import Placement
from orch.planner.planner import make_plan
from orch.planner.search import SolverConfig, search
from orch.planner.specs import ModelSpec
from orch.runtime.models.registry import load_model

SMALL = """
name: small
modules:
  vision: {kind: encoder, layers: 4, hidden: 512, heads: 8, ffn: 2048, input_dim: 588, feeds: llm}
  llm: {kind: llm, layers: 8, hidden: 1024, heads: 16, kv_heads: 4, ffn: 4096, vocab: 32000}
"""


def brute_force(inp: SearchInput, prune: bool) -> float:
    """Enumerate every combination of candidates through evaluate(): the reference optimum."""
    best = float("inf")
    if Placement.HOMOGENEOUS in inp.placements:
        best = min([evaluate_homogeneous(o).step_s for o in homogeneous_options(inp)], default=best)
    names = list(inp.model.modules)
    if Placement.COLOCATED in inp.placements:
        lists = [module_candidates(inp, n, inp.world, Placement.COLOCATED, prune) for n in names]
        for combo in itertools.product(*lists):
            choice = evaluate(inp, Placement.COLOCATED, dict(zip(names, combo, strict=True)))
            if choice is not None:
                best = min(best, choice.step_s)
    if Placement.DISAGGREGATED in inp.placements:
        # every grouping of the encoders into islands, with every island size
        for islands in island_layouts(inp):
            lists = [
                module_candidates(
                    inp,
                    n,
                    inp.world - islands.encoder_gpus if n == inp.model.llm_name else islands.size_of(n),
                    Placement.DISAGGREGATED,
                    prune,
                )
                for n in names
            ]
            for combo in itertools.product(*lists):
                choice = evaluate(inp, Placement.DISAGGREGATED, dict(zip(names, combo, strict=True)), islands)
                if choice is not None:
                    best = min(best, choice.step_s)
    return best


def shared_cpu_profile():
    """A measured profile of 4 ranks on 2 shared cores, with per-step work on the LLM's row."""
    from orch.planner.profile import BoundaryFit, ComputeFit, CoreSharing, ModuleProfile, Profile

    fits = {"vision": 4e-5, "audio": 6e-5, "llm": 1e-4}
    return Profile(
        device="cpu",
        backend="gloo",
        modules={
            n: ModuleProfile(
                block={1: ComputeFit(constant=1e-4, linear=c1, quadratic=1e-8, call=1e-3)}, step_overhead_s=0.005
            )
            for n, c1 in fits.items()
        },
        boundary=BoundaryFit(alpha_s=0.002, gbps=0.5),
        balance_step_s=0.02,
        step_bookkeeping_s=0.01,
        sharing=CoreSharing(cores=2, ranks=4),
    )


def small_input(cluster: str = "h100-80g", nodes: int = 1, data: str = "llava-mix", **kw) -> SearchInput:
    model = parse_text(ModelSpec, "small", SMALL)
    return SearchInput(model, load_cluster(cluster, nodes), load_data(data), **kw)


@pytest.mark.parametrize(
    "inp",
    [
        pytest.param(small_input(), id="small-8gpu"),
        pytest.param(SearchInput(load_model("tiny"), load_cluster("local-cpu"), load_data("tiny-mix")), id="tiny-4"),
        pytest.param(small_input(nodes=2, data="video-heavy"), id="small-16gpu-video"),
        pytest.param(
            SearchInput(
                load_model("tiny"), load_cluster("local-cpu"), load_data("tiny-mix"), profile=shared_cpu_profile()
            ),
            id="tiny-4-shared-cores",
        ),
    ],
)
def test_cp_sat_matches_brute_force(inp):
    solution, _ = search(inp, SolverConfig(alternatives=0))
    reference = brute_force(inp, prune=True)
    assert solution.best.step_s == pytest.approx(reference, rel=1e-5)
    # the solver's integer objective is the same formula, rounded
    assert solution.objective_s == pytest.approx(solution.best.step_s, rel=1e-5)


def test_dominance_prefilter_loses_no_optimum():
    inp = small_input()
    assert brute_force(inp, prune=False) == pytest.approx(brute_force(inp, prune=True), rel=1e-12)


@pytest.mark.parametrize("placement", list(Placement))
def test_forcing_a_placement_matches_brute_force_of_that_placement(placement):
    inp = small_input(nodes=2, placements=(placement,))
    solution, _ = search(inp, SolverConfig(alternatives=0))
    assert solution.best.placement == placement
    assert solution.best.step_s == pytest.approx(brute_force(inp, prune=True), rel=1e-5)


def test_alternatives_are_distinct_and_not_better_than_the_best():
    solution, _ = search(small_input(nodes=2), SolverConfig(alternatives=4))
    sigs = {solution.best.signature(), *(a.signature() for a in solution.alternatives)}
    assert len(sigs) == 1 + len(solution.alternatives) == 5
    assert all(a.step_s >= solution.best.step_s * (1 - 1e-6) for a in solution.alternatives)


def test_pins_are_kept():
    inp = small_input(nodes=2)
    pins = (Pin.parse("llm.tp=4", inp.model), Pin.parse("vision.dp=16", inp.model))
    plan = make_plan(replace(inp, pins=pins))
    assert plan.modules["llm"].layout.tp == 4
    assert plan.modules["vision"].layout.dp == 16


def test_island_pin_forces_disaggregation():
    inp = small_input(nodes=2)
    plan = make_plan(replace(inp, pins=(Pin.parse("vision.gpus=8", inp.model),)))
    assert plan.placement == Placement.DISAGGREGATED
    assert plan.modules["vision"].ranks == list(range(8))
    assert plan.modules["llm"].ranks == list(range(8, 16))


def test_conflicting_pins_are_named():
    inp = small_input()
    with pytest.raises(SpecError, match=r"llm.tp=16: TP stays inside a node of 8 GPUs"):
        make_plan(replace(inp, pins=(Pin.parse("llm.tp=16", inp.model),)))
    with pytest.raises(SpecError, match="tp\\*cp\\*pp\\*dp = 12 does not divide"):
        make_plan(replace(inp, pins=(Pin.parse("llm.tp=4", inp.model), Pin.parse("llm.dp=3", inp.model))))
    # a valid degree that no layout can honour: a 70B LLM replicated on every GPU of a node
    big = SearchInput(load_model("llava-1b-70b"), load_cluster("h100-80g", 1), load_data("llava-mix"))
    with pytest.raises(InfeasibleError, match="--fix llm.dp=8: no layout satisfies"):
        make_plan(replace(big, pins=(Pin.parse("llm.dp=8", big.model),)))


def test_boundary_dp_ratio_rule():
    """Colocated edges keep an integer DP ratio; disaggregated islands take any (test_islands.py)."""
    inp = small_input(nodes=2)
    solution, cands = search(inp, SolverConfig(alternatives=6))
    for choice in [solution.best, *solution.alternatives]:
        if choice.placement == Placement.COLOCATED:
            a, b = choice.modules["vision"].layout.dp, choice.modules["llm"].layout.dp
            assert a % b == 0 or b % a == 0


def test_cluster_too_small_is_explained():
    inp = SearchInput(load_model("vit-12b-120b"), load_cluster("h100-80g", 1), load_data("llava-mix"))
    with pytest.raises(SpecError, match=r"gpu.memory_gb: model 'vit-12b-120b' needs about \d+ GB per GPU"):
        make_plan(inp)


def test_a_cluster_too_large_for_the_batch_names_the_batch():
    """Issue 33: 100,000 GPUs with a batch of 1,024 said 'needs about 32 GB per GPU ...; the GPU has 80 GB'."""
    inp = SearchInput(load_model("omni-84b"), load_cluster("h100-80g", 12500), load_data("omni-mix"))
    inp = replace(inp, placements=(Placement.HOMOGENEOUS, Placement.COLOCATED))
    with pytest.raises(SpecError, match=r"global_batch: 1024 samples per step cannot feed 100000 GPUs: .* dp 3125"):
        make_plan(inp, SolverConfig(alternatives=0))


# --- sanity against the papers ------------------------------------------------------------


def test_llava_1b_70b_gives_the_encoder_a_smaller_tp_and_a_gain_in_the_papers_range():
    plan = make_plan(SearchInput(load_model("llava-1b-70b"), load_cluster("h100-80g", 8), load_data("llava-mix")))
    assert plan.placement != Placement.HOMOGENEOUS
    assert plan.modules["vision"].layout.tp < plan.modules["llm"].layout.tp
    assert plan.baseline is not None
    gain = plan.baseline.predicted.step_time_s / plan.predicted.step_time_s - 1
    assert 0.05 <= gain <= 0.50


def test_large_encoder_considers_disaggregation():
    inp = SearchInput(load_model("vit-12b-120b"), load_cluster("h100-80g", 16), load_data("llava-mix"))
    solution, cands = search(inp)
    assert cands.disaggregated, "no disaggregated candidates were built"
    placements = {solution.best.placement, *(a.placement for a in solution.alternatives)}
    assert Placement.DISAGGREGATED in placements


def test_plans_follow_the_data_mix():
    def plan_for(data: str):
        return make_plan(SearchInput(load_model("llava-1b-70b"), load_cluster("h100-80g", 8), load_data(data)))

    video, text = plan_for("video-heavy"), plan_for("text-heavy")
    assert video.predicted.phases["vision"] > 5 * text.predicted.phases["vision"]
    layouts = lambda p: {n: (m.layout, m.micro_batch, m.recompute) for n, m in p.modules.items()}  # noqa: E731
    assert layouts(video) != layouts(text)


def test_alternatives_show_the_best_of_every_other_placement():
    plan = make_plan(small_input(nodes=2))
    placements = [a.placement for a in plan.alternatives]
    assert set(placements) | {plan.placement} == set(Placement)
    times = [a.predicted.step_time_s for a in plan.alternatives]
    assert times == sorted(times) and times[0] >= plan.predicted.step_time_s * (1 - 1e-6)


def test_prediction_terms_add_up_to_the_homogeneous_step():
    """`predicted.terms` splits the step the way the runtime times it: per module, boundaries, grad sync
    and optimizer, orchestrator. A homogeneous plan without PP runs them one after another on every rank."""
    from orch.planner.profile import BoundaryFit, ComputeFit, ModuleProfile, Profile

    fit = ComputeFit(constant=1e-4, linear=1e-5, quadratic=1e-8, call=1e-3)
    prof = Profile(
        device="cpu",
        backend="gloo",
        modules={
            n: ModuleProfile(block={1: fit}, step_overhead_s=0.01 * (i + 1))
            for i, n in enumerate(("vision", "audio", "llm"))
        },
        boundary=BoundaryFit(alpha_s=0.002, gbps=0.5),
        balance_step_s=0.03,
        step_bookkeeping_s=0.005,
    )
    inp = SearchInput(
        load_model("tiny"),
        load_cluster("local-cpu"),
        load_data("tiny-mix"),
        profile=prof,
        placements=(Placement.HOMOGENEOUS,),
    )
    plan = make_plan(inp)
    terms = plan.predicted.terms
    assert set(terms) == {
        "vision fwd+bwd",
        "audio fwd+bwd",
        "llm fwd+bwd",
        "boundaries",
        "grad sync+optimizer",
        "orchestrator",
        "step bookkeeping",
    }
    assert plan.modules["llm"].layout.pp == 1
    assert terms["grad sync+optimizer"] == pytest.approx(0.06)  # every module on every rank
    assert terms["orchestrator"] == pytest.approx(0.03)
    assert terms["step bookkeeping"] == pytest.approx(0.005)
    assert terms["boundaries"] > 2 * 0.002  # two encoders, each at least the fit's alpha
    assert sum(terms.values()) == pytest.approx(plan.predicted.step_time_s)


def test_disaggregated_pace_on_shared_cores():
    """Two islands of 2 ranks on 2 shared cores: once the lighter island is done the other runs twice as
    fast, so the pace is the mean of the two; on machines of their own it is the slower island."""
    from orch.planner.evaluate import disaggregated_pace
    from orch.planner.profile import CoreSharing, Profile, busy_ratio

    shared = Profile(device="cpu", backend="gloo", sharing=CoreSharing(cores=2, ranks=4))
    assert busy_ratio(shared, 4, 2) == pytest.approx(0.5)
    assert busy_ratio(shared, 4, 4) == pytest.approx(1.0)
    assert busy_ratio(shared, 4, 1) == pytest.approx(0.5)  # one rank cannot use two cores
    assert busy_ratio(shared, 8, 2) == 1.0  # another world than the profile's: no claim
    assert busy_ratio(Profile(device="cuda", backend="nccl"), 4, 2) == 1.0
    assert disaggregated_pace([0.10], 0.20, 0.5, 0.5) == pytest.approx(0.15)
    assert disaggregated_pace([0.10], 0.20, 1.0, 1.0) == pytest.approx(0.20)
    # 1 encoder rank, 3 LLM ranks on 2 cores: r_enc = 1/1.5, r_llm = 1.5/2
    r_enc, r_llm = busy_ratio(shared, 4, 1), busy_ratio(shared, 4, 3)
    assert disaggregated_pace([0.30], 0.10, r_enc, r_llm) == pytest.approx(0.10 + r_enc * 0.20)
    assert disaggregated_pace([0.10], 0.30, r_enc, r_llm) == pytest.approx(0.10 + r_llm * 0.20)


def test_graph_pipeline_overlaps_all_but_one_chunk_of_each_island():
    from orch.planner.evaluate import graph_pipeline

    # one micro-batch: the islands take turns, each alone (r) on shared cores, at full pace otherwise
    assert graph_pipeline([0.1], 0.3, 1, 1.0, 1.0) == pytest.approx(0.4)
    assert graph_pipeline([0.1], 0.3, 1, 0.5, 0.5) == pytest.approx(0.2)
    # a device per rank, LLM the heavier: the LLM's work plus one chunk of the encoders' (the fill)
    assert graph_pipeline([0.1], 0.3, 4, 1.0, 1.0) == pytest.approx(0.3 + 0.1 / 4)
    assert graph_pipeline([0.3], 0.1, 4, 1.0, 1.0) == pytest.approx(0.3 + 0.1 / 4)
    # 2 + 2 ranks on 2 cores: the cores are the bottleneck, overlap gains nothing (half the total work)
    assert graph_pipeline([0.1], 0.3, 4, 0.5, 0.5) == pytest.approx(0.2)
    # 3 + 3 ranks on 4 cores: more micro-batches overlap more, down to the overlapped pace
    times = [graph_pipeline([0.1], 0.3, m, 0.75, 0.75) for m in (1, 2, 4, 8, 1000)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]
    assert times[0] == pytest.approx(0.75 * 0.4)
    assert times[-1] == pytest.approx(0.25 * 0.1 + 0.75 * 0.3, rel=1e-2)


def test_homogeneous_pipeline_on_shared_cores():
    """LLM pp2 with the encoders on stage 0, 4 ranks on 2 cores: a stage working alone (the encoders, the fill and
    drain) runs twice as fast, so the pipeline takes the larger of its critical path at that pace and the mean
    rank's work; with a device per rank it is the classic (m + pp - 1) micro-batches of the slowest stage."""
    from orch.planner.candidates import Candidate, _homogeneous
    from orch.planner.costs import ModuleCost
    from orch.planner.plan import Layout, Placement, Recompute

    def cand(module: str, layout: Layout, compute: float) -> Candidate:
        cost = ModuleCost(
            compute_s=compute, tp_s=0, cp_s=0, ep_s=0, pp_p2p_s=0, dp_s=0, bubble_s=0, forward_s=0, params_gb=0,
            activations_gb=0, model_flops=0,
        )  # fmt: skip
        return Candidate(module, Placement.HOMOGENEOUS, layout, 1, Recompute.NONE, cost, 3)

    llm = cand("llm", Layout(pp=2, dp=2), 0.30)
    enc = cand("vision", Layout(dp=2), 0.06)
    per_mb = (0.30 + 0.06) / 3
    assert _homogeneous(llm, (enc,), 3).step_s == pytest.approx(per_mb * 4)
    assert _homogeneous(llm, (enc,), 3, alone=0.5).step_s == pytest.approx(0.30 + 0.06 / 2)  # every core busy
    heavy = replace(enc, cost=replace(enc.cost, compute_s=0.9))  # stage 0 the bottleneck: its critical path
    assert _homogeneous(llm, (heavy,), 3, alone=0.5).step_s == pytest.approx(0.5 * (0.30 + 0.9) / 3 * 4)


def test_packed_calls_count_the_samples_that_carry_the_module():
    """An encoder's chunks on a rank are its own samples cut into at most the micro-batch count (InputRouter.chunks):
    a modality few samples carry runs one call per such sample; EP runs every micro-batch."""
    from orch.planner.costs import packed_calls

    assert packed_calls(8, 1.0, 2) == 4  # 8 samples per rank, 2 per micro-batch
    assert packed_calls(8, 0.25, 2) == 2  # 2 of them carry the module: 2 calls
    assert packed_calls(6, 0.22, 2) == 2  # 1.3 on the mean rank: the busiest runs 2
    assert packed_calls(6, 0.05, 2) == 1  # at least one call
    assert packed_calls(8, 0.25, 2, ep=2) == 4
    assert packed_calls(1, 1.0, 4) == 1
