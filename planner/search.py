"""CP-SAT model that picks one layout per module and the placement (STYLE.md §13).

Variables are one boolean per candidate (planner/candidates.py did the arithmetic and the
dominance pre-filter); the model adds the combinatorics: exactly one placement, one
candidate per module, shared GPU memory, encoder island size, DP ratios at the boundary,
and the step time of each placement as a linear (or max-of-linear) expression.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from orch.planner.candidates import (
    Candidate,
    HomogeneousOption,
    SearchInput,
    homogeneous_options,
    island_sizes,
    module_candidates,
)
from orch.planner.evaluate import Choice, dp_compatible, evaluate, evaluate_homogeneous, island_work, llm_work
from orch.planner.plan import Placement
from orch.planner.profile import busy_ratio


@dataclass(frozen=True)
class SolverConfig:
    time_limit_s: float = 10.0
    workers: int = 1
    seed: int = 0
    alternatives: int = 4  # extra solutions after the best (top-k)


@dataclass
class CandidateSet:
    """Everything the model chooses from, by placement."""

    homogeneous: list[HomogeneousOption] = field(default_factory=list)
    colocated: dict[str, list[Candidate]] = field(default_factory=dict)
    disaggregated: dict[int, dict[str, list[Candidate]]] = field(default_factory=dict)  # island k -> module -> cands

    def size(self) -> int:
        n = len(self.homogeneous) + sum(len(v) for v in self.colocated.values())
        return n + sum(len(v) for per_k in self.disaggregated.values() for v in per_k.values())


def build_candidates(inp: SearchInput) -> CandidateSet:
    cs = CandidateSet()
    model = inp.model
    # the baseline cannot honour island pins, nor encoder degrees that differ from the LLM's
    conflicting = any(
        inp.pinned(e, a) not in (None, inp.pinned(model.llm_name, a))
        for e in model.encoder_names
        for a in ("tp", "cp", "dp")
    )
    if Placement.HOMOGENEOUS in inp.placements and not conflicting and not any(p.axis == "gpus" for p in inp.pins):
        cs.homogeneous = homogeneous_options(inp)
    if Placement.COLOCATED in inp.placements and model.encoder_names:
        per_module = {n: module_candidates(inp, n, inp.world, Placement.COLOCATED) for n in model.modules}
        if all(per_module.values()):
            cs.colocated = per_module
    if Placement.DISAGGREGATED in inp.placements and model.encoder_names:
        for k in island_sizes(inp):
            per_module = {e: module_candidates(inp, e, k, Placement.DISAGGREGATED) for e in model.encoder_names}
            if not all(per_module.values()):
                continue
            llm = module_candidates(inp, model.llm_name, inp.world - k, Placement.DISAGGREGATED)
            if llm:
                cs.disaggregated[k] = {**per_module, model.llm_name: llm}
    return cs


class Solution:
    """The best choice, its objective and bound, and the runner-up choices."""

    def __init__(self, best: Choice, alternatives: list[Choice], objective_s: float, bound_s: float, status: str):
        self.best = best
        self.alternatives = alternatives
        self.objective_s = objective_s
        self.bound_s = bound_s
        self.status = status


class _Vars:
    """Booleans of the model with the queries the constraint families need."""

    def __init__(self) -> None:
        self.placement: dict[Placement, Any] = {}
        self.homogeneous: list[tuple[Any, HomogeneousOption]] = []
        self.colocated: dict[str, list[tuple[Any, Candidate]]] = defaultdict(list)
        self.island: dict[int, Any] = {}
        self.disaggregated: dict[int, dict[str, list[tuple[Any, Candidate]]]] = defaultdict(lambda: defaultdict(list))

    def all_choice_literals(self) -> list[Any]:
        out = [v for v, _ in self.homogeneous]
        out += [v for vs in self.colocated.values() for v, _ in vs]
        out += [v for per_k in self.disaggregated.values() for vs in per_k.values() for v, _ in vs]
        return out


class LayoutModel:
    """Builds and solves the CP-SAT model in named steps."""

    def __init__(self, inp: SearchInput, cands: CandidateSet, cfg: SolverConfig) -> None:
        from ortools.sat.python import cp_model

        self.cp_model = cp_model
        self.inp = inp
        self.cands = cands
        self.cfg = cfg
        self.m = cp_model.CpModel()
        self.v = _Vars()
        self.unit = _time_unit(cands)
        self.mem_unit = 1e-3  # GB -> MB, integers
        self._build()

    def t(self, seconds: float) -> int:
        return round(seconds / self.unit)

    def mem(self, gb: float) -> int:
        return math.ceil(gb / self.mem_unit)

    # --- building -----------------------------------------------------------------------
    def _build(self) -> None:
        self._add_variables()
        self._add_one_placement()
        self._add_one_candidate_per_module()
        self._add_island_choice()
        self._add_memory()
        self._add_boundary_ratios()
        self._add_objective()

    def _add_variables(self) -> None:
        m, v, cs = self.m, self.v, self.cands
        enc = self.inp.model.encoder_names
        if cs.homogeneous:
            v.placement[Placement.HOMOGENEOUS] = m.new_bool_var("place[homogeneous]")
            for i, opt in enumerate(cs.homogeneous):
                v.homogeneous.append((m.new_bool_var(f"homog[{i}]"), opt))
        if cs.colocated and enc:
            v.placement[Placement.COLOCATED] = m.new_bool_var("place[colocated]")
            for name, cands in cs.colocated.items():
                for i, c in enumerate(cands):
                    v.colocated[name].append((m.new_bool_var(f"coloc[{name},{i}]"), c))
        if cs.disaggregated and enc:
            v.placement[Placement.DISAGGREGATED] = m.new_bool_var("place[disaggregated]")
            for k, per_module in cs.disaggregated.items():
                v.island[k] = m.new_bool_var(f"island[{k}]")
                for name, cands in per_module.items():
                    for i, c in enumerate(cands):
                        v.disaggregated[k][name].append((m.new_bool_var(f"disagg[{k},{name},{i}]"), c))

    def _add_one_placement(self) -> None:
        # exactly one placement kind is chosen
        self.m.add_exactly_one(self.v.placement.values())

    def _add_one_candidate_per_module(self) -> None:
        v = self.v
        if v.homogeneous:
            # the baseline is one joint option (encoders inherit the LLM layout)
            self.m.add(sum(x for x, _ in v.homogeneous) == v.placement[Placement.HOMOGENEOUS])
        for lits in v.colocated.values():
            # colocated: each module picks one grid over all GPUs
            self.m.add(sum(x for x, _ in lits) == v.placement[Placement.COLOCATED])
        for k, per_module in v.disaggregated.items():
            for lits in per_module.values():
                # disaggregated: each module picks one grid on its island, only for the chosen k
                self.m.add(sum(x for x, _ in lits) == v.island[k])

    def _add_island_choice(self) -> None:
        if self.v.island:
            # one encoder island size when disaggregated, none otherwise
            self.m.add(sum(self.v.island.values()) == self.v.placement[Placement.DISAGGREGATED])

    def _add_memory(self) -> None:
        cap = self.mem(self.inp.capacity_gb)
        if self.v.colocated:
            # colocated modules share every GPU's memory
            self.m.add(sum(self.mem(c.memory_gb) * x for lits in self.v.colocated.values() for x, c in lits) <= cap)
        llm = self.inp.model.llm_name
        for per_module in self.v.disaggregated.values():
            # the encoders of an island share its GPUs' memory
            enc = [(x, c) for name, lits in per_module.items() if name != llm for x, c in lits]
            self.m.add(sum(self.mem(c.memory_gb) * x for x, c in enc) <= cap)

    def _dp_value_literals(self, lits: list[tuple[Any, Candidate]], tag: str) -> dict[int, Any]:
        by_dp: dict[int, list[Any]] = defaultdict(list)
        for x, c in lits:
            by_dp[c.layout.dp].append(x)
        out = {}
        for dp, xs in by_dp.items():
            d = self.m.new_bool_var(f"dp[{tag},{dp}]")
            self.m.add(d == sum(xs))
            out[dp] = d
        return out

    def _add_boundary_ratios(self) -> None:
        if self.inp.uneven_boundary:
            return
        llm = self.inp.model.llm_name
        groups: list[tuple[str, dict[str, list[tuple[Any, Candidate]]]]] = []
        if self.v.colocated:
            groups.append(("coloc", self.v.colocated))
        groups += [(f"k{k}", per) for k, per in self.v.disaggregated.items()]
        for tag, per_module in groups:
            dst = self._dp_value_literals(per_module[llm], f"{tag},{llm}")
            for e in self.inp.model.encoder_names:
                src = self._dp_value_literals(per_module[e], f"{tag},{e}")
                for ds, xs in src.items():
                    for dd, xd in dst.items():
                        if not dp_compatible(ds, dd):
                            # DP_src/DP_dst or its inverse must be an integer (Fan-in / Fan-out)
                            self.m.add_bool_or([xs.Not(), xd.Not()])

    def _add_objective(self) -> None:
        m, v = self.m, self.v
        terms = []
        llm = self.inp.model.llm_name
        enc = self.inp.model.encoder_names
        # any sum of one candidate per module (with its moves) stays below this
        horizon = self.t(max(_max_time(self.cands), 1e-9) * (len(self.inp.model.modules) + 1)) + 1
        # homogeneous: the joint option carries its step time
        terms += [self.t(o.step_s) * x for x, o in v.homogeneous]
        if v.colocated:
            # colocated: modules run one after another (three-phase), plus each boundary's slower side
            terms += [self.t(c.time_s) * x for lits in v.colocated.values() for x, c in lits]
            for e in enc:
                b = m.new_int_var(0, horizon, f"boundary[coloc,{e}]")
                m.add(b >= sum(self.t(c.send_s) * x for x, c in v.colocated[e]))
                m.add(b >= sum(self.t(c.recv_for(e)) * x for x, c in v.colocated[llm]))
                terms.append(b)
        if v.disaggregated:
            # evaluate.graph_pipeline: with the island size k (busy ratios) and the LLM's micro-batch count m
            # fixed, every part is linear in the chosen candidates; m enters through one enforced bound each
            world, prof = self.inp.world, self.inp.profile
            by_enc, by_llm, serial, fixed_enc, fixed_llm, common = [], [], [], [], [], []
            by_m: dict[int, list[Any]] = {}
            for k, per in v.disaggregated.items():
                r_enc, r_llm = busy_ratio(prof, world, k), busy_ratio(prof, world, world - k)
                for e in enc:
                    for x, c in per[e]:
                        work = island_work(c)
                        alone = self.t(r_enc * work) * x  # the island's pace, and its turn alone
                        by_enc.append(alone)
                        by_llm.append(self.t((1 - r_llm) * work) * x)
                        serial.append(alone)
                        fixed_enc.append(self.t(c.cost.fixed_s) * x)
                for x, c in per[llm]:
                    work = llm_work(c, list(enc))
                    alone = self.t(r_llm * work) * x
                    by_enc.append(self.t((1 - r_enc) * work) * x)
                    by_llm.append(alone)
                    serial.append(alone)
                    fixed_llm.append(self.t(c.cost.overhead_s) * x)
                    common.append(self.t(c.cost.orchestrator_s) * x)
                    by_m.setdefault(c.num_micro_batches, []).append(x)
            pace = m.new_int_var(0, horizon, "pace[disagg]")
            m.add(pace >= sum(by_enc))
            m.add(pace >= sum(by_llm))
            fixed = m.new_int_var(0, horizon, "fixed[disagg]")
            m.add(fixed >= sum(fixed_enc))
            m.add(fixed >= sum(fixed_llm))
            pipeline = m.new_int_var(0, horizon, "pipeline[disagg]")
            for count, lits in sorted(by_m.items()):
                chosen = m.new_bool_var(f"llm_micro_batches[{count}]")
                m.add(chosen == sum(lits))
                m.add(count * pipeline >= (count - 1) * pace + sum(serial)).only_enforce_if(chosen)
            terms += [pipeline, fixed, *common]
        self.objective = sum(terms)
        m.minimize(self.objective)

    # --- solving ------------------------------------------------------------------------
    def solve(self) -> Solution:
        from orch.planner.errors import InfeasibleError

        solver = self.cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = self.cfg.time_limit_s
        solver.parameters.num_workers = self.cfg.workers
        solver.parameters.random_seed = self.cfg.seed
        status = solver.solve(self.m)
        if status not in (self.cp_model.OPTIMAL, self.cp_model.FEASIBLE):
            raise InfeasibleError("no layout satisfies memory, divisibility and the pins together")
        best = self._read(solver)
        objective = solver.objective_value * self.unit
        bound = solver.best_objective_bound * self.unit
        status_name = solver.status_name(status)
        alternatives = []
        for _ in range(self.cfg.alternatives):
            # forbid the assignment just found (no-good cut) and solve again
            chosen = [x for x in self.v.all_choice_literals() if solver.boolean_value(x)]
            self.m.add_bool_or([x.Not() for x in chosen])
            status = solver.solve(self.m)
            if status not in (self.cp_model.OPTIMAL, self.cp_model.FEASIBLE):
                break
            alternatives.append(self._read(solver))
        alternatives.sort(key=lambda c: c.step_s)
        return Solution(best, alternatives, objective, bound, status_name)

    def _read(self, solver: Any) -> Choice:
        v = self.v
        for x, opt in v.homogeneous:
            if solver.boolean_value(x):
                return evaluate_homogeneous(opt)
        if Placement.COLOCATED in v.placement and solver.boolean_value(v.placement[Placement.COLOCATED]):
            mods = {n: c for n, lits in v.colocated.items() for x, c in lits if solver.boolean_value(x)}
            return _must(evaluate(self.inp, Placement.COLOCATED, mods))
        for per in v.disaggregated.values():
            mods = {n: c for n, lits in per.items() for x, c in lits if solver.boolean_value(x)}
            if mods:
                return _must(evaluate(self.inp, Placement.DISAGGREGATED, mods))
        raise AssertionError("solver returned no placement")


def _must(choice: Choice | None) -> Choice:
    assert choice is not None, "CP-SAT chose an assignment that evaluate() rejects"
    return choice


def _max_time(cs: CandidateSet) -> float:
    times = [o.step_s for o in cs.homogeneous]
    for per in [cs.colocated, *cs.disaggregated.values()]:
        times += [c.time_s + c.send_s + sum(v for _, v in c.recv_s) for cands in per.values() for c in cands]
    return max(times, default=1.0)


def _time_unit(cs: CandidateSet) -> float:
    """Integer time unit: about 1e-7 of the longest time, so step times stay below ~1e8 units."""
    return 10.0 ** (math.floor(math.log10(max(_max_time(cs), 1e-12))) - 7)


def search(inp: SearchInput, cfg: SolverConfig = SolverConfig()) -> tuple[Solution, CandidateSet]:
    from orch.planner.errors import InfeasibleError

    cands = build_candidates(inp)
    if cands.size() == 0:
        raise InfeasibleError("no candidate layout fits")
    return LayoutModel(inp, cands, cfg).solve(), cands
