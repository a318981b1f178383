"""Turn the search's choice into the plan file: exact ranks, edges, schedule, predictions."""

from __future__ import annotations

from orch.planner.candidates import Candidate, SearchInput
from orch.planner.costs import profiled_sample_cost
from orch.planner.evaluate import Choice
from orch.planner.plan import (
    Alternative,
    BaselinePlan,
    Edge,
    EdgeKind,
    Layout,
    ModulePlan,
    Placement,
    Plan,
    Prediction,
    Schedule,
    Transport,
)

SCHEDULES: dict[Placement, Schedule] = {
    Placement.HOMOGENEOUS: "1f1b",
    Placement.COLOCATED: "three_phase",
    Placement.DISAGGREGATED: "graph_1f1b",
}


def module_ranks(inp: SearchInput, choice: Choice, name: str) -> list[int]:
    """Global ranks of a module, in its mesh order (tp fastest, then cp, dp, pp)."""
    c = choice.modules[name]
    if choice.placement == Placement.DISAGGREGATED and choice.islands is not None:
        # the encoder islands in order from rank 0, the LLM after the last
        islands = choice.islands
        start = islands.encoder_gpus if name == inp.model.llm_name else islands.offset_of(name)
        return list(range(start, start + c.gpus))
    # homogeneous encoders sit on the LLM's first pipeline stage: its first gpus ranks
    return list(range(c.gpus))


def edge_kind(src: Layout, dst: Layout) -> EdgeKind:
    if src.dp == dst.dp:
        return EdgeKind.EQUAL_DP
    return EdgeKind.FAN_IN if src.dp > dst.dp else EdgeKind.FAN_OUT


def _edges(inp: SearchInput, choice: Choice) -> list[Edge]:
    llm = inp.model.llm_name
    transport = Transport.P2P if choice.placement == Placement.DISAGGREGATED else Transport.COLOCATED
    return [
        Edge(src=e, dst=llm, kind=edge_kind(choice.modules[e].layout, choice.modules[llm].layout), transport=transport)
        for e in inp.model.encoder_names
    ]


def prediction_terms(inp: SearchInput, choice: Choice) -> dict[str, float]:
    """The step's parts as the runtime times them (metrics.jsonl), per rank of the module that does them."""
    terms = {f"{n} fwd+bwd": c.cost.work_s for n, c in choice.modules.items()}
    llm = inp.model.llm_name
    terms["boundaries"] = choice.phases.get("boundaries", 0.0) + sum(
        choice.phases.get(f"{e}->{llm}", 0.0) for e in inp.model.encoder_names
    )
    terms["grad sync+optimizer"] = (
        sum(c.cost.overhead_s * len(module_ranks(inp, choice, n)) for n, c in choice.modules.items()) / inp.world
    )
    prof = inp.profile
    terms["orchestrator"] = prof.balance_step_s if prof is not None else 0.0
    terms["step bookkeeping"] = prof.step_bookkeeping_s if prof is not None else 0.0
    return terms


def prediction(inp: SearchInput, choice: Choice) -> Prediction:
    from orch.planner.costs import workload

    tokens = workload(inp.model, inp.data, inp.model.llm_name).tokens
    flops = sum(c.cost.model_flops for c in choice.modules.values())
    peak = inp.world * inp.cluster.gpu.peak_tflops * 1e12
    return Prediction(
        step_time_s=choice.step_s,
        tokens_per_s=tokens / choice.step_s if choice.step_s else 0.0,
        mfu=flops / (choice.step_s * peak) if choice.step_s else 0.0,
        phases=dict(choice.phases),
        terms=prediction_terms(inp, choice),
    )


def _module_plan(inp: SearchInput, choice: Choice, name: str) -> ModulePlan:
    c: Candidate = choice.modules[name]
    memory = c.memory_gb
    if choice.placement == Placement.COLOCATED:
        memory = sum(x.memory_gb for x in choice.modules.values())  # all modules share each GPU
    elif choice.placement == Placement.HOMOGENEOUS and (name != inp.model.llm_name or c.layout.pp == 1):
        memory = sum(x.memory_gb for x in choice.modules.values())  # first stage holds the encoders too
    elif choice.placement == Placement.DISAGGREGATED and name != inp.model.llm_name:
        # the encoders of its island share each GPU (one island of every encoder when none are given)
        groups = choice.islands.groups if choice.islands is not None else (tuple(inp.model.encoder_names),)
        memory = sum(choice.modules[e].memory_gb for e in next(g for g in groups if name in g))
    return ModulePlan(
        layout=c.layout,
        ranks=module_ranks(inp, choice, name),
        micro_batch=c.micro_batch,
        num_micro_batches=c.num_micro_batches,
        recompute=c.recompute,
        data_parallel=c.cost.data_parallel,
        sharding=c.cost.sharding,
        memory_gb=round(memory, 3),
        time_s=c.time_s,
        sample_cost=profiled_sample_cost(inp.model, inp.data, name, c.layout, c.recompute, inp.profile),
    )


def _modules(inp: SearchInput, choice: Choice) -> dict[str, ModulePlan]:
    return {name: _module_plan(inp, choice, name) for name in inp.model.modules}


def alternative(inp: SearchInput, choice: Choice) -> Alternative:
    return Alternative(
        placement=choice.placement,
        layouts={n: c.describe() for n, c in choice.modules.items()},
        gpus={n: c.gpus for n, c in choice.modules.items()},
        predicted=prediction(inp, choice),
    )


def assemble(inp: SearchInput, best: Choice, baseline: Choice | None, alternatives: list[Choice]) -> Plan:
    return Plan(
        placement=best.placement,
        schedule=SCHEDULES[best.placement],
        world_size=inp.world,
        ranks_per_node=inp.cluster.gpus_per_node,
        modules=_modules(inp, best),
        edges=_edges(inp, best),
        predicted=prediction(inp, best),
        baseline=(
            BaselinePlan(modules=_modules(inp, baseline), predicted=prediction(inp, baseline))
            if baseline is not None
            else None
        ),
        alternatives=[alternative(inp, a) for a in alternatives],
        model=inp.model,
        cluster=inp.cluster,
        data=inp.data,
    )
