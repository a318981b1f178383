"""Predicted step time of a full choice (one candidate per module): the search's objective.

The CP-SAT model in planner/search.py encodes exactly these formulas in integers; the
brute-force test enumerates choices through this module and must agree with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orch.planner.candidates import Candidate, HomogeneousOption, SearchInput
from orch.planner.islands import Islands
from orch.planner.plan import Placement
from orch.planner.profile import busy_ratio


@dataclass(frozen=True)
class Choice:
    placement: Placement
    modules: dict[str, Candidate]
    step_s: float
    phases: dict[str, float]
    islands: Islands | None = None  # encoder islands (disaggregated)

    def signature(self) -> tuple[object, ...]:
        return (self.placement, self.islands, *((n, c.describe()) for n, c in sorted(self.modules.items())))


def dp_compatible(src_dp: int, dst_dp: int) -> bool:
    return src_dp % dst_dp == 0 or dst_dp % src_dp == 0


def boundary_s(encoder: Candidate, llm: Candidate) -> float:
    """Moving one encoder's outputs into the LLM's layout: the slower side of the transfer."""
    return max(encoder.send_s, llm.recv_for(encoder.module))


@dataclass(frozen=True)
class DisaggregatedParts:
    """A disaggregated step's work, as the graph-aware 1F1B runs it (seconds, every rank busy)."""

    islands: tuple[float, ...]  # per encoder island: its encoders' forward+backward and sends, cut into chunks
    llm_side: float  # the LLM's forward+backward and its receives
    islands_fixed: tuple[float, ...]  # per island, once per step at the end: gradient sync and optimizer
    llm_fixed: float  # the LLM's
    common: float  # every rank: the orchestrator and the step's bookkeeping


def island_work(encoder: Candidate) -> float:
    """An encoder's share of its island's pipelined work: its passes and its sends."""
    return encoder.cost.work_s + encoder.send_s


def llm_work(llm: Candidate, encoders: list[str]) -> float:
    """The LLM island's pipelined work: its passes and its receives from every encoder."""
    return llm.cost.work_s + sum(llm.recv_for(e) for e in encoders)


def disaggregated_parts(islands: list[list[Candidate]], llm: Candidate) -> DisaggregatedParts:
    """The parts of a step whose encoders sit on `islands` (one list of encoder candidates per island)."""
    return DisaggregatedParts(
        islands=tuple(sum(island_work(e) for e in encs) for encs in islands),
        llm_side=llm_work(llm, [e.module for encs in islands for e in encs]),
        islands_fixed=tuple(sum(e.cost.fixed_s for e in encs) for encs in islands),
        llm_fixed=llm.cost.overhead_s,
        common=llm.cost.orchestrator_s,
    )


def disaggregated_pace(islands: Sequence[float], llm_side: float, r_enc: float, r_llm: float) -> float:
    """Seconds for every island's work when they overlap fully, each measured with every rank busy.

    The encoder islands run side by side, each feeding the LLM's first stage. While both sides work,
    each runs at its measured pace; once the lighter one is done, the other runs alone at r times its
    measured time (busy_ratio; 1 on machines of their own). If an encoder island is the heavier:
    light + r_enc·(heavy − light) = r_enc·island + (1 − r_enc)·llm_side, and symmetrically; the right one
    is the largest of these (r_enc + r_llm >= 1). With r = 1 this is the slowest island's work.
    """
    enc = max(r_enc * w + (1 - r_enc) * llm_side for w in islands)
    return max(enc, max(r_llm * llm_side + (1 - r_llm) * w for w in islands))


def pipeline_serial(islands: Sequence[float], llm_side: float, r_enc: float, r_llm: float) -> float:
    """One chunk of each side while the other waits (the encoders' first forward, the LLM's last backward),
    times m: the slowest island's and the LLM's work, each alone."""
    return r_enc * max(islands) + r_llm * llm_side


def graph_pipeline(islands: Sequence[float], llm_side: float, m: int, r_enc: float, r_llm: float) -> float:
    """Every island's work under the graph-aware 1F1B over m micro-batches (two stages: islands, LLM).

    m − 1 of each side's m chunks overlap with the other's (disaggregated_pace); one chunk of each runs
    while the other waits (pipeline_serial). m = 1: nothing overlaps, the sides take turns. With r = 1 and
    a heavier LLM: llm_side + island / m, the classic fill.
    """
    m = max(m, 1)
    pace = disaggregated_pace(islands, llm_side, r_enc, r_llm)
    return (m - 1) / m * pace + pipeline_serial(islands, llm_side, r_enc, r_llm) / m


def disaggregated_ratios(inp: SearchInput, llm_gpus: int) -> tuple[float, float]:
    """Busy ratios (profile.busy_ratio) of the encoder side (every island at once) and of the LLM island."""
    world = inp.world
    return busy_ratio(inp.profile, world, world - llm_gpus), busy_ratio(inp.profile, world, llm_gpus)


def evaluate_homogeneous(opt: HomogeneousOption) -> Choice:
    mods = {opt.llm.module: opt.llm, **{c.module: c for c in opt.encoders}}
    phases = {c.module: c.time_s for c in opt.encoders}
    phases[opt.llm.module] = opt.llm.time_s
    if opt.boundary_s:
        phases["boundaries"] = opt.boundary_s
    return Choice(Placement.HOMOGENEOUS, mods, opt.step_s, phases)


def evaluate(
    inp: SearchInput,
    placement: Placement,
    modules: dict[str, Candidate],
    islands: Islands | None = None,
) -> Choice | None:
    """Step time of a heterogeneous choice, or None when it breaks a rule (memory, DP ratio, GPUs).

    Disaggregated: `islands` says which encoders share ranks (default: every encoder on one island)."""
    llm_name = inp.model.llm_name
    llm = modules[llm_name]
    encs = [modules[e] for e in inp.model.encoder_names]
    phases: dict[str, float] = {}
    if placement == Placement.COLOCATED:
        if not inp.uneven_boundary and any(not dp_compatible(e.layout.dp, llm.layout.dp) for e in encs):
            return None  # disaggregated islands take any ratio (candidates.SearchInput.uneven_boundary)
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
        enc_names = list(inp.model.encoder_names)
        if islands is None:
            islands = Islands.one(enc_names, encs[0].gpus if encs else 0)
        if sorted(e for g in islands.groups for e in g) != sorted(enc_names) or min(islands.sizes, default=0) <= 0:
            return None
        if any(modules[e].gpus != islands.size_of(e) for e in enc_names):
            return None
        if llm.gpus != inp.world - islands.encoder_gpus:
            return None
        per_island = [[modules[e] for e in g] for g in islands.groups]
        if any(sum(e.memory_gb for e in encs) > inp.capacity_gb for encs in per_island):
            return None
        parts = disaggregated_parts(per_island, llm)
        r_enc, r_llm = disaggregated_ratios(inp, llm.gpus)
        m = llm.num_micro_batches
        pipeline = graph_pipeline(parts.islands, parts.llm_side, m, r_enc, r_llm)
        for e in encs:
            phases[e.module] = e.time_s
            phases[f"{e.module}->{llm_name}"] = boundary_s(e, llm)
        phases[llm_name] = llm.time_s
        # one side alone: fill and drain
        phases["fill"] = pipeline_serial(parts.islands, parts.llm_side, r_enc, r_llm) / m
        step = parts.common + max(*parts.islands_fixed, parts.llm_fixed) + pipeline
        return Choice(placement, dict(modules), step, phases, islands=islands)
    raise ValueError(f"evaluate() handles heterogeneous placements, not {placement}")
