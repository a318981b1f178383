"""Hand-built plans for the tests, the demo and the benchmark (no planner search needed).

`hand_plan` fills in what the executor does not read (predictions, memory) with zeros and
derives each edge's kind from the DP ratio and its transport from rank overlap.
"""

from __future__ import annotations

from orch.planner.loading import load_cluster
from orch.planner.plan import (
    DataParallel,
    Edge,
    Layout,
    ModulePlan,
    Placement,
    Plan,
    Prediction,
    Recompute,
    Sharding,
    Transport,
)
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.parallel.boundary import expected_kind


def hand_plan(
    model: ModelSpec,
    data: DataSpec,
    layouts: dict[str, tuple[Layout, list[int]]],
    *,
    micro_batches: int = 2,
    data_parallel: DataParallel | dict[str, DataParallel] = DataParallel.REPLICATE,
    recompute: Recompute | dict[str, Recompute] = Recompute.NONE,
    sharding: Sharding | dict[str, Sharding] = Sharding.KEEP,
) -> Plan:
    """A Plan from per-module (layout, ranks); every module not named gets the LLM's. `data_parallel` and
    `recompute`, `sharding`: every module's, or per module name (default replicate, none, keep)."""
    llm = model.llm_name
    modules = {}
    for name in model.modules:
        layout, ranks = layouts.get(name, layouts[llm])
        per_rank = -(-data.global_batch // layout.dp)
        mb = min(micro_batches, per_rank)
        mode = data_parallel.get(name, DataParallel.REPLICATE) if isinstance(data_parallel, dict) else data_parallel
        rc = recompute.get(name, Recompute.NONE) if isinstance(recompute, dict) else recompute
        sh = sharding.get(name, Sharding.KEEP) if isinstance(sharding, dict) else sharding
        modules[name] = ModulePlan(
            layout=layout,
            ranks=ranks,
            micro_batch=-(-per_rank // mb),
            num_micro_batches=mb,
            memory_gb=0.0,
            data_parallel=mode,
            recompute=rc,
            sharding=sh,
        )
    edges = []
    for e in model.encoder_names:
        shared = set(modules[e].ranks) & set(modules[llm].ranks)
        kind = expected_kind(modules[e].layout.dp, modules[llm].layout.dp)
        edges.append(Edge(src=e, dst=llm, kind=kind, transport=Transport.COLOCATED if shared else Transport.P2P))
    all_ranks = {r for m in modules.values() for r in m.ranks}
    same = all(m.layout == modules[llm].layout and m.ranks == modules[llm].ranks for m in modules.values())
    disjoint = all(not (set(modules[e].ranks) & set(modules[llm].ranks)) for e in model.encoder_names)
    placement = Placement.HOMOGENEOUS if same else Placement.DISAGGREGATED if disjoint else Placement.COLOCATED
    return Plan(
        placement=placement,
        schedule="graph_1f1b" if placement == Placement.DISAGGREGATED else "three_phase",
        world_size=max(all_ranks) + 1,
        ranks_per_node=max(all_ranks) + 1,
        modules=modules,
        edges=edges,
        predicted=Prediction(step_time_s=0.0, tokens_per_s=0.0, mfu=0.0),
        model=model,
        cluster=load_cluster("local-cpu"),
        data=data,
    )
