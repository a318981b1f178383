"""Predicted step time of a full choice (one candidate per module): the search's objective.

The CP-SAT model in planner/search.py encodes exactly these formulas in integers; the
brute-force test enumerates choices through this module and must agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from orch.planner.candidates import Candidate, HomogeneousOption, SearchInput
from orch.planner.plan import Placement
from orch.planner.profile import busy_ratio


@dataclass(frozen=True)
class Choice:
    placement: Placement
    modules: dict[str, Candidate]
    step_s: float
    phases: dict[str, float]
    island: int | None = None  # encoder island size (disaggregated)

    def signature(self) -> tuple[object, ...]:
        return (self.placement, self.island, *((n, c.describe()) for n, c in sorted(self.modules.items())))


def dp_compatible(src_dp: int, dst_dp: int) -> bool:
    return src_dp % dst_dp == 0 or dst_dp % src_dp == 0


def boundary_s(encoder: Candidate, llm: Candidate) -> float:
    """Moving one encoder's outputs into the LLM's layout: the slower side of the transfer."""
    return max(encoder.send_s, llm.recv_for(encoder.module))


@dataclass(frozen=True)
class DisaggregatedParts:
    """A disaggregated step's work, as the graph-aware 1F1B runs it (seconds, every rank busy)."""

    island: float  # encoders' forward+backward and their sends: cut into the LLM's micro-batches
    llm_side: float  # the LLM's forward+backward and its receives
    island_fixed: float  # once per step at the end: the encoders' gradient sync and optimizer
    llm_fixed: float  # the LLM's
    common: float  # every rank: the orchestrator and the step's bookkeeping


def island_work(encoder: Candidate) -> float:
    """An encoder's share of the island's pipelined work: its passes and its sends."""
    return encoder.cost.work_s + encoder.send_s


def llm_work(llm: Candidate, encoders: list[str]) -> float:
    """The LLM island's pipelined work: its passes and its receives from every encoder."""
    return llm.cost.work_s + sum(llm.recv_for(e) for e in encoders)


def disaggregated_parts(encs: list[Candidate], llm: Candidate) -> DisaggregatedParts:
    return DisaggregatedParts(
        island=sum(island_work(e) for e in encs),
        llm_side=llm_work(llm, [e.module for e in encs]),
        island_fixed=sum(e.cost.fixed_s for e in encs),
        llm_fixed=llm.cost.overhead_s,
        common=llm.cost.orchestrator_s,
    )


def disaggregated_pace(island: float, llm_side: float, r_enc: float, r_llm: float) -> float:
    """Seconds for both islands' work when they overlap fully, each measured with every rank busy.

    While both islands work, each runs at its measured pace; once the lighter one is done, the other
    runs alone at r times its measured time (busy_ratio; 1 on machines of their own). If the island
    is the heavier: light + r_enc·(heavy − light) = r_enc·island + (1 − r_enc)·llm_side, and
    symmetrically; the right one is the larger of the two (r_enc + r_llm >= 1). With r = 1 this is
    max(island, llm_side): the slower island sets the pace.
    """
    return max(r_enc * island + (1 - r_enc) * llm_side, r_llm * llm_side + (1 - r_llm) * island)


def graph_pipeline(island: float, llm_side: float, m: int, r_enc: float, r_llm: float) -> float:
    """Both islands' work under the graph-aware 1F1B over m micro-batches (two stages: island, LLM).

    m − 1 of each island's m chunks overlap with the other's (disaggregated_pace); one chunk of each
    runs while the other island waits (the encoders' first forward, the LLM's last backward), alone
    at r times its measured time. m = 1: nothing overlaps, the islands take turns. With r = 1 and
    a heavier LLM: llm_side + island / m, the classic fill.
    """
    m = max(m, 1)
    return (m - 1) / m * disaggregated_pace(island, llm_side, r_enc, r_llm) + (r_enc * island + r_llm * llm_side) / m


def evaluate_homogeneous(opt: HomogeneousOption) -> Choice:
    mods = {opt.llm.module: opt.llm, **{c.module: c for c in opt.encoders}}
    phases = {c.module: c.time_s for c in opt.encoders}
    phases[opt.llm.module] = opt.llm.time_s
    if opt.boundary_s:
        phases["boundaries"] = opt.boundary_s
    return Choice(Placement.HOMOGENEOUS, mods, opt.step_s, phases)


def evaluate(inp: SearchInput, placement: Placement, modules: dict[str, Candidate]) -> Choice | None:
    """Step time of a heterogeneous choice, or None when it breaks a rule (memory, DP ratio, GPUs)."""
    llm_name = inp.model.llm_name
    llm = modules[llm_name]
    encs = [modules[e] for e in inp.model.encoder_names]
    if not inp.uneven_boundary and any(not dp_compatible(e.layout.dp, llm.layout.dp) for e in encs):
        return None
    phases: dict[str, float] = {}
    if placement == Placement.COLOCATED:
        if any(c.gpus != inp.world for c in modules.values()):
            return None
        if sum(c.memory_gb for c in modules.values()) > inp.capacity_gb:
            return None
        for e in encs:
            phases[e.module] = e.time_s
            phases[f"{e.module}->{llm_name}"] = boundary_s(e, llm)
        phases[llm_name] = llm.time_s
        return Choice(placement, dict(modules), sum(phases.values()), phases)
    if placement == Placement.DISAGGREGATED:
        k = encs[0].gpus if encs else 0
        if any(e.gpus != k for e in encs) or llm.gpus != inp.world - k or k <= 0:
            return None
        if sum(e.memory_gb for e in encs) > inp.capacity_gb:
            return None
        parts = disaggregated_parts(encs, llm)
        r_enc, r_llm = busy_ratio(inp.profile, inp.world, k), busy_ratio(inp.profile, inp.world, inp.world - k)
        m = llm.num_micro_batches
        pipeline = graph_pipeline(parts.island, parts.llm_side, m, r_enc, r_llm)
        for e in encs:
            phases[e.module] = e.time_s
            phases[f"{e.module}->{llm_name}"] = max(e.send_s, llm.recv_for(e.module))
        phases[llm_name] = llm.time_s
        phases["fill"] = (r_enc * parts.island + r_llm * parts.llm_side) / m  # one island alone: fill and drain
        step = parts.common + max(parts.island_fixed, parts.llm_fixed) + pipeline
        return Choice(placement, dict(modules), step, phases, island=k)
    raise ValueError(f"evaluate() handles heterogeneous placements, not {placement}")
