"""`orch plan` as one function: specs in, Plan out."""

from __future__ import annotations

from dataclasses import replace

from orch.planner.assemble import assemble
from orch.planner.candidates import SearchInput
from orch.planner.errors import InfeasibleError, SpecError
from orch.planner.evaluate import Choice
from orch.planner.plan import Layout, Placement, Plan
from orch.planner.search import Solution, SolverConfig, search


def make_plan(inp: SearchInput, solver: SolverConfig = SolverConfig()) -> Plan:
    """Search the best layout and placement, and the homogeneous baseline beside it.

    The candidates of every placement are built once (search.build_candidates) and one search answers
    the best plan, its runners-up and the best of every placement (Solution.per_placement)."""
    _check_pins(inp)
    try:
        solution, _ = search(inp, solver)
    except InfeasibleError:
        raise _explain_infeasible(inp) from None
    baseline = _baseline(inp, solver, solution)
    alternatives = _with_every_placement(solver, solution)
    return assemble(inp, solution.best, baseline, alternatives)


def _with_every_placement(solver: SolverConfig, solution: Solution) -> list[Choice]:
    """Top-k from no-good cuts often differ only in one encoder's layout; add the best plan of
    every other allowed placement, so a user sees what each placement would cost."""
    found = solution.alternatives
    if solver.alternatives <= 0:
        return found
    seen = {solution.best.placement, *(c.placement for c in found)}
    extra = [c for p, c in solution.per_placement.items() if p not in seen]
    return sorted([*found, *extra], key=lambda c: c.step_s)


def _baseline(inp: SearchInput, solver: SolverConfig, solution: Solution) -> Choice | None:
    if solution.best.placement == Placement.HOMOGENEOUS:
        return solution.best
    if not inp.pins and Placement.HOMOGENEOUS in solution.per_placement:
        return solution.per_placement[Placement.HOMOGENEOUS]  # the same options the baseline searches
    base_inp = replace(inp, placements=(Placement.HOMOGENEOUS,), pins=())
    try:
        base, _ = search(base_inp, replace(solver, alternatives=0))
    except InfeasibleError:
        return None  # the baseline does not fit at all: heterogeneity is what makes it trainable
    return base.best


def _check_pins(inp: SearchInput) -> None:
    """Pins that contradict each other or the cluster, named before any search runs."""
    for p in inp.pins:
        if p.axis == "tp" and p.value > inp.cluster.gpus_per_node:
            raise SpecError(
                "--fix", f"{p.module}.tp={p.value}", f"TP stays inside a node of {inp.cluster.gpus_per_node} GPUs"
            )
        if p.axis == "gpus" and p.value >= inp.world:
            raise SpecError(
                "--fix", f"{p.module}.gpus={p.value}", f"an island must leave GPUs for the others (world {inp.world})"
            )
    by_module: dict[str, dict[str, int]] = {}
    for p in inp.pins:
        by_module.setdefault(p.module, {})[p.axis] = p.value
    for module, axes in by_module.items():
        degrees = {a: v for a, v in axes.items() if a in ("tp", "cp", "pp", "dp")}
        total = 1
        for v in degrees.values():
            total *= v
        limit = axes.get("gpus", inp.world)
        if total > limit or limit % total:
            pins = " ".join(f"{module}.{a}={v}" for a, v in axes.items())
            raise SpecError("--fix", pins, f"tp*cp*pp*dp = {total} does not divide the module's {limit} GPUs")
        if "ep" in axes and "dp" in axes and axes["dp"] % axes["ep"]:
            raise SpecError("--fix", f"{module}.ep={axes['ep']}", f"ep must divide dp ({axes['dp']})")


def _explain_infeasible(inp: SearchInput) -> Exception:
    """Why nothing fits: pins, or a cluster too small for the model at the largest parallelism."""
    from orch.planner.costs import module_cost
    from orch.planner.plan import Recompute

    if inp.pins:
        pins = " ".join(f"{p.module}.{p.axis}={p.value}" for p in inp.pins)
        return InfeasibleError(f"--fix {pins}: no layout satisfies these pins with memory and divisibility rules")
    llm = inp.model.llm_name
    m = inp.model.llm
    gpn, n = inp.cluster.gpus_per_node, inp.world
    tp = max(t for t in (1, 2, 4, 8, 16, 32) if t <= gpn and m.splits_over(t))
    pp = max(p for p in range(1, min(m.layers, max(n // tp, 1)) + 1) if m.layers % p == 0 and tp * p <= n)
    lay = Layout(tp=tp, pp=pp, dp=1)
    smallest = module_cost(inp.model, inp.data, inp.cluster, llm, lay, 1, Recompute.FULL, in_flight=pp)
    return SpecError(
        f"cluster {inp.cluster.name}",
        "gpu.memory_gb",
        f"model '{inp.model.name}' needs about {smallest.memory_gb + inp.cfg.memory_reserve_gb:.0f} GB per GPU "
        f"even at {lay.short()} with full recompute on {n} GPUs; the GPU has {inp.cluster.gpu.memory_gb:g} GB "
        "(add nodes or use larger GPUs)",
    )
