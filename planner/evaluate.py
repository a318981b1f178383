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


def disaggregated_pace(island: float, llm_side: float, r_enc: float, r_llm: float) -> float:
    """Seconds for both islands' work of a step, each measured with every rank busy.

    While both islands work, each runs at its measured pace; once the lighter one is done, the other
    runs alone at r times its measured time (busy_ratio; 1 on machines of their own). If the island
    is the heavier: light + r_enc·(heavy − light) = r_enc·island + (1 − r_enc)·llm_side, and
    symmetrically; the right one is the larger of the two (r_enc + r_llm >= 1). With r = 1 this is
    max(island, llm_side): the slower island sets the pace.
    """
    return max(r_enc * island + (1 - r_enc) * llm_side, r_llm * llm_side + (1 - r_llm) * island)


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
        island = sum(e.time_s + e.send_s for e in encs)
        common = llm.cost.orchestrator_s  # every rank announces, dispatches and assembles the step
        llm_side = llm.time_s - common + sum(llm.recv_for(e.module) for e in encs)
        r_enc, r_llm = busy_ratio(inp.profile, inp.world, k), busy_ratio(inp.profile, inp.world, inp.world - k)
        fill = r_enc * sum(e.fill_s for e in encs)
        for e in encs:
            phases[e.module] = e.time_s
            phases[f"{e.module}->{llm_name}"] = max(e.send_s, llm.recv_for(e.module))
        phases[llm_name] = llm.time_s
        phases["fill"] = fill
        step = common + disaggregated_pace(island, llm_side, r_enc, r_llm) + fill
        return Choice(placement, dict(modules), step, phases, island=k)
    raise ValueError(f"evaluate() handles heterogeneous placements, not {placement}")
