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
        module = inp.model.modules.get(p.module)
        why = module.refuses(p.axis, p.value) if module is not None and p.axis in ("tp", "cp", "pp") else None
        if why is not None:
            raise SpecError("--fix", f"{p.module}.{p.axis}={p.value}", why)
    by_module: dict[str, dict[str, int]] = {}
    for p in inp.pins:
        by_module.setdefault(p.module, {})[p.axis] = p.value
    for module, axes in by_module.items():
        degrees = {a: v for a, v in axes.items() if a in ("tp", "cp", "pp", "dp")}
        total = 1
        for v in degrees.values():
            total *= v
        pins = " ".join(f"{module}.{a}={v}" for a, v in axes.items())
        limit = axes.get("gpus", inp.world)
        divides = total <= limit and limit % total == 0
        # Without a GPU-count pin the module's count is the search's choice: every GPU (colocated, homogeneous)
        # or an island's, any count that leaves the others at least one GPU; the pins are checked against
        # the count once chosen (candidates.layouts), here only against every count the module may take.
        island = "gpus" not in axes and _may_take_an_island(inp) and total <= inp.world - 1
        if not divides and not island:
            why = f"tp*cp*pp*dp = {total} does not divide the module's {limit} GPUs"
            if "gpus" not in axes and _may_take_an_island(inp):
                why += " and leaves no GPU for the others on an island of its own"
            raise SpecError("--fix", pins, why)
        if "ep" in axes and "dp" in axes and axes["dp"] % axes["ep"]:
            raise SpecError("--fix", f"{module}.ep={axes['ep']}", f"ep must divide dp ({axes['dp']})")


def _may_take_an_island(inp: SearchInput) -> bool:
    """Whether a module may run on fewer GPUs than the cluster's: disaggregated islands are allowed."""
    return Placement.DISAGGREGATED in inp.placements and bool(inp.model.encoder_names)


def _explain_infeasible(inp: SearchInput) -> Exception:
    """Why nothing fits: pins; a cluster too small for the model at the largest parallelism the search tries
    (memory); or one too large for the batch (a module's DP degree is at most its samples per step)."""
    from orch.planner.candidates import degrees
    from orch.planner.costs import module_cost
    from orch.planner.plan import Recompute, Sharding

    if inp.pins:
        pins = " ".join(f"{p.module}.{p.axis}={p.value}" for p in inp.pins)
        return InfeasibleError(f"--fix {pins}: no layout satisfies these pins with memory and divisibility rules")
    llm = inp.model.llm_name
    n, batch = inp.world, inp.data.global_batch
    deg = degrees(inp, llm, allow_pp=True)
    # the smallest footprint of the LLM on its own: the widest TP, CP and PP that fit the cluster at dp 1, or
    # on every GPU with its state resharded over DP and, for a MoE, its experts over the widest EP that splits them
    experts = inp.model.modules[llm].experts
    shapes = []
    for t, c, p in ((t, c, p) for t in deg.tp for c in deg.cp for p in deg.pp if t * c * p <= n):
        shapes.append((Layout(tp=t, cp=c, pp=p), Sharding.KEEP))
        dp = n // (t * c * p)
        if dp > 1 and n % (t * c * p) == 0:
            ep = max(e for e in range(1, dp + 1) if dp % e == 0 and experts % e == 0)
            shapes.append((Layout(tp=t, cp=c, pp=p, dp=dp, ep=ep), Sharding.RESHARD))
    costs = [
        (module_cost(inp.model, inp.data, inp.cluster, llm, x, 1, Recompute.FULL, in_flight=x.pp, sharding=sh), x, sh)
        for x, sh in shapes
    ]
    smallest, lay, sharding = min(costs, key=lambda cx: cx[0].memory_gb)
    resharded = " resharded" if sharding == Sharding.RESHARD and lay.dp > 1 else ""
    gpu = inp.cluster.gpu
    if smallest.memory_gb > inp.capacity_gb:
        return SpecError(
            f"cluster {inp.cluster.name}",
            "gpu.memory_gb",
            f"model '{inp.model.name}' needs about {smallest.memory_gb + gpu.reserve:.0f} GB per GPU "
            f"even at {lay.short()}{resharded} with full recompute on {n} GPUs; the GPU has {gpu.memory_gb:g} GB, "
            f"{gpu.reserve:g} of it reserved (gpu.reserve_gb) (add nodes or use larger GPUs)",
        )
    # memory is not the limit: the batch is, when no layout of the LLM on every GPU keeps dp <= batch
    units = sorted({x.gpus for x, sh in shapes if sh == Sharding.KEEP and n % x.gpus == 0})
    if units and n // units[-1] > batch:
        need = n // units[-1]
        return SpecError(
            f"data {inp.data.name}".strip(),
            "global_batch",
            f"{batch} samples per step cannot feed {n} GPUs: a module's DP degree is at most its samples, and "
            f"'{llm}' fills {n} GPUs at dp {need} or more (tp*cp*pp at most {units[-1]} divides {n}); "
            f"raise it to at least {need} (--global-batch) or plan on fewer nodes",
        )
    return InfeasibleError(
        f"no layout of '{inp.model.name}' fits {n} GPUs: memory, divisibility (tp*cp*pp*dp = GPUs) and the global "
        f"batch of {batch} (dp <= batch) together; try another node count"
    )
