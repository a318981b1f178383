"""CP-SAT model that picks one layout per module and the placement (docs/design.md, Conventions: built in named steps).

Variables are one boolean per candidate (planner/candidates.py did the arithmetic and the
dominance pre-filter); the model adds the combinatorics: exactly one placement, one
candidate per module, shared GPU memory, encoder islands (grouping and sizes), DP ratios at a colocated boundary,
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
    module_candidates,
    pricing,
)
from orch.planner.evaluate import (
    Choice,
    disaggregated_ratios,
    dp_compatible,
    evaluate,
    evaluate_homogeneous,
    island_work,
    llm_work,
)
from orch.planner.islands import Group, Islands, IslandSizes, subsets
from orch.planner.plan import Placement


@dataclass(frozen=True)
class SolverConfig:
    time_limit_s: float = 10.0
    workers: int = 1
    seed: int = 0
    alternatives: int = 4  # extra solutions after the best (top-k)
    # CP-SAT's presolve probing: on these models (hundreds of booleans, the disaggregated step's enforced
    # bounds) it costs 3-4x the deterministic time of the search itself and finds nothing the search does not
    probing_level: int = 0
    # CP-SAT's LP relaxation: on these models the search alone proves the optimum sooner and more steadily (the
    # disaggregated model of four encoders on 2,560 GPUs: 0.25-0.37 s over seeds at 0, 0.26-1.74 s at the default)
    linearization_level: int = 0


RUNNER_UP_MIN_S = 0.5


@dataclass
class DisaggregatedCandidates:
    """Disaggregated candidates by island size: each encoder's on an island of k GPUs, the LLM's on n."""

    encoders: dict[str, dict[int, list[Candidate]]]  # encoder -> island GPUs -> candidates
    llm: dict[int, list[Candidate]]  # LLM island GPUs -> candidates

    def size(self) -> int:
        return sum(len(c) for per_k in self.encoders.values() for c in per_k.values()) + sum(
            len(c) for c in self.llm.values()
        )

    def all(self) -> list[Candidate]:
        out = [c for per_k in self.encoders.values() for cands in per_k.values() for c in cands]
        return out + [c for cands in self.llm.values() for c in cands]


@dataclass
class CandidateSet:
    """Everything the model chooses from, by placement."""

    homogeneous: list[HomogeneousOption] = field(default_factory=list)
    colocated: dict[str, list[Candidate]] = field(default_factory=dict)
    disaggregated: DisaggregatedCandidates | None = None

    def size(self) -> int:
        n = len(self.homogeneous) + sum(len(v) for v in self.colocated.values())
        return n + (self.disaggregated.size() if self.disaggregated is not None else 0)

    def placements(self) -> list[Placement]:
        """The placements that have candidates, in Placement order."""
        has = {
            Placement.HOMOGENEOUS: bool(self.homogeneous),
            Placement.COLOCATED: bool(self.colocated),
            Placement.DISAGGREGATED: self.disaggregated is not None,
        }
        return [p for p in Placement if has[p]]

    def only(self, placement: Placement) -> CandidateSet:
        """The candidates of one placement (shared, not copied)."""
        return CandidateSet(
            homogeneous=self.homogeneous if placement == Placement.HOMOGENEOUS else [],
            colocated=self.colocated if placement == Placement.COLOCATED else {},
            disaggregated=self.disaggregated if placement == Placement.DISAGGREGATED else None,
        )


def build_candidates(inp: SearchInput) -> CandidateSet:
    """Every candidate of every allowed placement; disaggregated ones on the island sizes of IslandSizes.of.

    Every module's layout-independent figures are computed once (candidates.pricing) and shared by all
    placements and island sizes; `make_plan` builds this set once and every search it runs reads it."""
    sizes = IslandSizes.of(inp)
    cs = CandidateSet()
    model = inp.model
    pr = pricing(inp)
    # the baseline cannot honour island pins, nor encoder degrees that differ from the LLM's
    conflicting = any(
        inp.pinned(e, a) not in (None, inp.pinned(model.llm_name, a))
        for e in model.encoder_names
        for a in ("tp", "cp", "dp")
    )
    if Placement.HOMOGENEOUS in inp.placements and not conflicting and not any(p.axis == "gpus" for p in inp.pins):
        cs.homogeneous = homogeneous_options(inp, pr)
    if Placement.COLOCATED in inp.placements and model.encoder_names:
        per_module = {n: module_candidates(inp, n, inp.world, Placement.COLOCATED, pr=pr) for n in model.modules}
        if all(per_module.values()):
            cs.colocated = per_module
    if Placement.DISAGGREGATED in inp.placements and model.encoder_names:
        dis = Placement.DISAGGREGATED
        encs = {
            e: {k: c for k in sizes.encoders if (c := module_candidates(inp, e, k, dis, pr=pr))}
            for e in model.encoder_names
        }
        llm = {n: c for n in sizes.llm if (c := module_candidates(inp, model.llm_name, n, dis, pr=pr))}
        if all(encs.values()) and llm:
            cs.disaggregated = DisaggregatedCandidates(encs, llm)
    return cs


class Solution:
    """The best choice, its objective and bound, the runner-up choices, and the best of every placement."""

    def __init__(
        self,
        best: Choice,
        alternatives: list[Choice],
        objective_s: float,
        bound_s: float,
        status: str,
        per_placement: dict[Placement, Choice] | None = None,
    ):
        self.best = best
        self.alternatives = alternatives
        self.objective_s = objective_s
        self.bound_s = bound_s
        self.status = status
        self.per_placement = per_placement if per_placement is not None else {best.placement: best}


@dataclass(frozen=True)
class _Found:
    """One solve's answer: the choice, its integer objective, the solver's bound and status."""

    choice: Choice
    objective: int
    bound_s: float
    optimal: bool


class _Vars:
    """Booleans of the model with the queries the constraint families need."""

    def __init__(self) -> None:
        self.placement: dict[Placement, Any] = {}
        self.homogeneous: list[tuple[Any, HomogeneousOption]] = []
        self.colocated: dict[str, list[tuple[Any, Candidate]]] = defaultdict(list)
        # disaggregated: encoder -> island GPUs k -> literals; the LLM's by its island GPUs n
        self.dis_enc: dict[str, dict[int, list[tuple[Any, Candidate]]]] = defaultdict(lambda: defaultdict(list))
        self.dis_llm: dict[int, list[tuple[Any, Candidate]]] = defaultdict(list)
        self.island: dict[tuple[Group, int], Any] = {}  # group g is an island of k GPUs
        self.active: dict[Group, Any] = {}  # group g is an island
        self.llm_gpus: dict[int, Any] = {}  # the LLM island has n GPUs

    def dis_enc_literals(self, group: Group, k: int | None = None) -> list[tuple[Any, Candidate]]:
        """The candidates of the group's encoders, on islands of k GPUs (every k when None)."""
        return [xc for e in group for size, lits in self.dis_enc[e].items() if k is None or size == k for xc in lits]

    def all_choice_literals(self) -> list[Any]:
        out = [v for v, _ in self.homogeneous]
        out += [v for vs in self.colocated.values() for v, _ in vs]
        out += [v for per_k in self.dis_enc.values() for vs in per_k.values() for v, _ in vs]
        out += [v for vs in self.dis_llm.values() for v, _ in vs]
        return out + list(self.island.values())


class LayoutModel:
    """Builds and solves the CP-SAT model in named steps."""

    def __init__(self, inp: SearchInput, cands: CandidateSet, cfg: SolverConfig, unit: float | None = None) -> None:
        from ortools.sat.python import cp_model

        self.cp_model = cp_model
        self.inp = inp
        self.cands = cands
        self.cfg = cfg
        self.m = cp_model.CpModel()
        self.v = _Vars()
        self.unit = unit if unit is not None else _time_unit(cands)
        self._solver: Any = None
        self._last: _Found | None = None
        self._first_s = 0.0  # the first solve's wall time: what each runner-up may take
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
        if cs.disaggregated is not None and enc:
            v.placement[Placement.DISAGGREGATED] = m.new_bool_var("place[disaggregated]")
            for name, per_k in cs.disaggregated.encoders.items():
                for k, cands in per_k.items():
                    for i, c in enumerate(cands):
                        v.dis_enc[name][k].append((m.new_bool_var(f"disagg[{name},{k},{i}]"), c))
            for n, cands in cs.disaggregated.llm.items():
                v.llm_gpus[n] = m.new_bool_var(f"llm_gpus[{n}]")
                for i, c in enumerate(cands):
                    v.dis_llm[n].append((m.new_bool_var(f"disagg[llm,{n},{i}]"), c))
            for g in subsets(list(enc)):
                # an island of k GPUs for group g needs a candidate of each of its encoders at k
                sizes = set.intersection(*(set(cs.disaggregated.encoders[e]) for e in g))
                if not sizes:
                    continue
                v.active[g] = m.new_bool_var(f"active[{'+'.join(g)}]")
                for k in sorted(sizes):
                    v.island[(g, k)] = m.new_bool_var(f"island[{'+'.join(g)},{k}]")

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
        for n, lits in v.dis_llm.items():
            # disaggregated: the LLM picks one grid on its island of n GPUs, only for the chosen n
            self.m.add(sum(x for x, _ in lits) == v.llm_gpus[n])
        for e, per_k in v.dis_enc.items():
            for k, lits in per_k.items():
                # an encoder picks one grid of k GPUs when the island that holds it has k
                on_k = [s for (g, size), s in v.island.items() if size == k and e in g]
                self.m.add(sum(x for x, _ in lits) == sum(on_k))

    def _add_island_choice(self) -> None:
        v = self.v
        if Placement.DISAGGREGATED not in v.placement:
            return
        placed = v.placement[Placement.DISAGGREGATED]
        m = self.m
        # one LLM island size, and the encoders split into islands: each in exactly one, of one size
        m.add(sum(v.llm_gpus.values()) == placed)
        for g, a in v.active.items():
            m.add(sum(s for (h, _), s in v.island.items() if h == g) == a)
        for e in self.inp.model.encoder_names:
            m.add(sum(a for g, a in v.active.items() if e in g) == placed)
        # the islands and the LLM use every rank
        gpus = sum(n * z for n, z in v.llm_gpus.items()) + sum(k * s for (_, k), s in v.island.items())
        m.add(gpus == self.inp.world * placed)

    def _add_memory(self) -> None:
        cap = self.mem(self.inp.capacity_gb)
        if self.v.colocated:
            # colocated modules share every GPU's memory
            self.m.add(sum(self.mem(c.memory_gb) * x for lits in self.v.colocated.values() for x, c in lits) <= cap)
        for (g, k), s in self.v.island.items():
            if len(g) > 1:
                # the encoders of an island share its GPUs' memory
                lits = self.v.dis_enc_literals(g, k)
                self.m.add(sum(self.mem(c.memory_gb) * x for x, c in lits) <= cap).only_enforce_if(s)

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
            # colocated only: a disaggregated boundary runs any DP ratio (SearchInput.uneven_boundary)
            groups.append(("coloc", self.v.colocated))
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
        if v.dis_llm:
            terms += self._disaggregated_terms(horizon)
        self.objective = sum(terms)
        m.minimize(self.objective)

    def _disaggregated_terms(self, horizon: int) -> list[Any]:
        """evaluate.graph_pipeline in integers. With the LLM island's size n fixed the busy ratios are
        constants, and with the islands fixed every part is linear in the chosen candidates; so each
        bound is enforced under the literals of its ratio pair and island, and m (the LLM's micro-batch
        count) enters through one enforced bound each."""
        m, v = self.m, self.v
        enc = list(self.inp.model.encoder_names)
        by_ratios: dict[tuple[float, float], list[int]] = defaultdict(list)
        for n in v.dis_llm:
            by_ratios[disaggregated_ratios(self.inp, n)].append(n)

        def llm_sum(ns: list[int], scale: float) -> Any:
            return sum(self.t(scale * llm_work(c, enc)) * x for n in ns for x, c in v.dis_llm[n] if scale)

        def island_sum(g: Group, scale: float) -> Any:
            return sum(self.t(scale * island_work(c)) * x for x, c in v.dis_enc_literals(g) if scale)

        pace = m.new_int_var(0, horizon, "pace[disagg]")
        enc_alone = m.new_int_var(0, horizon, "encoders_alone[disagg]")
        llm_alone = []
        for (r_enc, r_llm), ns in sorted(by_ratios.items()):
            on = m.new_bool_var(f"ratios[{r_enc:.6g},{r_llm:.6g}]")
            m.add(on == sum(v.llm_gpus[n] for n in ns))
            llm_alone.append(llm_sum(ns, r_llm))
            m.add(pace >= llm_alone[-1]).only_enforce_if(on)
            llm_own, llm_waiting = llm_alone[-1], llm_sum(ns, 1 - r_enc)
            for g, a in v.active.items():
                island = island_sum(g, r_enc)
                # evaluate.disaggregated_pace: each island against the LLM, both ways
                m.add(pace >= island + llm_waiting).only_enforce_if([on, a])
                if r_llm != 1:
                    m.add(pace >= llm_own + island_sum(g, 1 - r_llm)).only_enforce_if([on, a])
                # evaluate.pipeline_serial: the slowest island alone
                m.add(enc_alone >= island).only_enforce_if([on, a])
        fixed = m.new_int_var(0, horizon, "fixed[disagg]")
        for g, a in v.active.items():
            m.add(fixed >= sum(self.t(c.cost.fixed_s) * x for x, c in v.dis_enc_literals(g))).only_enforce_if(a)
        llm_lits = [xc for lits in v.dis_llm.values() for xc in lits]
        m.add(fixed >= sum(self.t(c.cost.overhead_s) * x for x, c in llm_lits))
        pipeline = m.new_int_var(0, horizon, "pipeline[disagg]")
        by_m: dict[int, list[Any]] = defaultdict(list)
        for x, c in llm_lits:
            by_m[c.num_micro_batches].append(x)
        for count, lits in sorted(by_m.items()):
            chosen = m.new_bool_var(f"llm_micro_batches[{count}]")
            m.add(chosen == sum(lits))
            m.add(count * pipeline >= (count - 1) * pace + enc_alone + sum(llm_alone)).only_enforce_if(chosen)
        common = [self.t(c.cost.orchestrator_s) * x for x, c in llm_lits]
        return [pipeline, fixed, *common]

    # --- solving ------------------------------------------------------------------------
    def solve(self) -> Solution:
        """The best choice and `cfg.alternatives` runners-up of this model alone."""
        from orch.planner.errors import InfeasibleError

        first = self.first()
        if first is None:
            raise InfeasibleError("no layout satisfies memory, divisibility and the pins together")
        alternatives = []
        for _ in range(self.cfg.alternatives):
            found = self.next()
            if found is None:
                break
            alternatives.append(found.choice)
        alternatives.sort(key=lambda c: c.step_s)
        status = "OPTIMAL" if first.optimal else "FEASIBLE"
        return Solution(first.choice, alternatives, first.objective * self.unit, first.bound_s, status)

    def first(self) -> _Found | None:
        """The optimum of the model (None: infeasible)."""
        self._solver = self.cp_model.CpSolver()
        self._solver.parameters.max_time_in_seconds = self.cfg.time_limit_s
        self._solver.parameters.num_workers = self.cfg.workers
        self._solver.parameters.random_seed = self.cfg.seed
        self._solver.parameters.cp_model_probing_level = self.cfg.probing_level
        self._solver.parameters.linearization_level = self.cfg.linearization_level
        found = self._solve()
        self._first_s = self._solver.wall_time
        return found

    def next(self) -> _Found | None:
        """The next best assignment: the one just found forbidden (a no-good cut), solved again.

        When the last answer was optimal no other assignment is better: its objective bounds the next one
        from below, so a tie (another layout of an encoder off the critical path) is proven at once."""
        solver, last = self._solver, self._last
        literals = self.v.all_choice_literals()
        values = [solver.boolean_value(x) for x in literals]
        self.m.add_bool_or([x.Not() for x, on in zip(literals, values, strict=True) if on])
        if last is not None and last.optimal:
            self.m.add(self.objective >= last.objective)
        # the runner-up is mostly the last answer with one module changed: start the search beside it
        self.m.clear_hints()
        for x, on in zip(literals, values, strict=True):
            self.m.add_hint(x, on)
        # A runner-up is shown, not launched: it gets the first solve's time (at least RUNNER_UP_MIN_S), so k of
        # them cost about k first solves, not k proofs of optimality on a large disaggregated model.
        solver.parameters.max_time_in_seconds = min(self.cfg.time_limit_s, max(RUNNER_UP_MIN_S, self._first_s))
        return self._solve()

    def _solve(self) -> _Found | None:
        solver = self._solver
        status = solver.solve(self.m)
        if status not in (self.cp_model.OPTIMAL, self.cp_model.FEASIBLE):
            self._last = None
            return None
        self._last = _Found(
            self._read(solver),
            round(solver.objective_value),
            solver.best_objective_bound * self.unit,
            status == self.cp_model.OPTIMAL,
        )
        return self._last

    def _read(self, solver: Any) -> Choice:
        v = self.v
        for x, opt in v.homogeneous:
            if solver.boolean_value(x):
                return evaluate_homogeneous(opt)
        if Placement.COLOCATED in v.placement and solver.boolean_value(v.placement[Placement.COLOCATED]):
            mods = {n: c for n, lits in v.colocated.items() for x, c in lits if solver.boolean_value(x)}
            return _must(evaluate(self.inp, Placement.COLOCATED, mods))
        if Placement.DISAGGREGATED in v.placement and solver.boolean_value(v.placement[Placement.DISAGGREGATED]):
            enc = list(self.inp.model.encoder_names)
            chosen = [(g, k) for (g, k), s in v.island.items() if solver.boolean_value(s)]
            chosen.sort(key=lambda gk: enc.index(gk[0][0]))
            islands = Islands(tuple(g for g, _ in chosen), tuple(k for _, k in chosen))
            mods = {
                c.module: c
                for lits in [*(lits for per_k in v.dis_enc.values() for lits in per_k.values()), *v.dis_llm.values()]
                for x, c in lits
                if solver.boolean_value(x)
            }
            return _must(evaluate(self.inp, Placement.DISAGGREGATED, mods, islands))
        raise AssertionError("solver returned no placement")


def _must(choice: Choice | None) -> Choice:
    assert choice is not None, "CP-SAT chose an assignment that evaluate() rejects"
    return choice


def _max_time(cs: CandidateSet) -> float:
    times = [o.step_s for o in cs.homogeneous]
    cands = [c for per in cs.colocated.values() for c in per]
    cands += cs.disaggregated.all() if cs.disaggregated is not None else []
    times += [c.time_s + c.send_s + sum(v for _, v in c.recv_s) for c in cands]
    return max(times, default=1.0)


def _time_unit(cs: CandidateSet) -> float:
    """Integer time unit: about 1e-7 of the longest time, so step times stay below ~1e8 units."""
    return 10.0 ** (math.floor(math.log10(max(_max_time(cs), 1e-12))) - 7)


def search(
    inp: SearchInput, cfg: SolverConfig = SolverConfig(), cands: CandidateSet | None = None
) -> tuple[Solution, CandidateSet]:
    """The best choice over every placement of `cands` (built from `inp` when None), with `cfg.alternatives`
    runners-up.

    One CP-SAT model per placement, in one time unit: the placements share no variable, so the best of
    the union is the best of the bests, and its k-th runner-up the k-th of their merged no-good-cut
    sequences; each model is solved again only when its last answer was taken. A placement whose best is
    far behind (a large disaggregated model next to a colocated one) is solved once, not k + 1 times."""
    from orch.planner.errors import InfeasibleError

    cands = cands if cands is not None else build_candidates(inp)
    if cands.size() == 0:
        raise InfeasibleError("no candidate layout fits")
    unit = _time_unit(cands)
    order = cands.placements()
    models = {p: LayoutModel(inp, cands.only(p), cfg, unit) for p in order}
    heads = {p: found for p in order if (found := models[p].first()) is not None}
    if not heads:
        raise InfeasibleError("no layout satisfies memory, divisibility and the pins together")
    per_placement = {p: f.choice for p, f in heads.items()}
    optimal = all(f.optimal for f in heads.values())
    bound_s = min(f.bound_s for f in heads.values())

    taken: list[Placement] = []  # the placement whose answer was taken last: solved again when needed

    def take() -> _Found | None:
        if taken and (again := models[taken[-1]].next()) is not None:
            heads[taken[-1]] = again
        if not heads:
            return None
        p = min(heads, key=lambda q: (heads[q].objective, order.index(q)))
        taken.append(p)
        return heads.pop(p)

    best = take()
    assert best is not None
    alternatives = []
    for _ in range(cfg.alternatives):
        found = take()
        if found is None:
            break
        alternatives.append(found.choice)
    alternatives.sort(key=lambda c: c.step_s)
    status = "OPTIMAL" if optimal else "FEASIBLE"
    solution = Solution(best.choice, alternatives, best.objective * unit, bound_s, status, per_placement)
    return solution, cands
