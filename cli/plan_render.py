"""Rich rendering of a plan: layouts, a picture of the placement, prediction vs baseline, alternatives."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from orch.cli.output import table
from orch.planner.plan import ModulePlan, Plan, Prediction

COLOURS = ("cyan", "magenta", "yellow", "green", "blue", "red")
MAX_NODES_DRAWN = 8


def _colour_of(plan: Plan) -> dict[str, str]:
    names = [*plan.model.encoder_names, plan.model.llm_name]
    return {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(names)}


def _layout_table(plan: Plan, colours: dict[str, str]) -> Table:
    gpu = plan.cluster.gpu
    t = table(
        f"{plan.model.name} on {plan.cluster.name} ({plan.world_size} GPUs): {plan.placement.value}",
        [
            ("module", "name"),
            ("layout", "text"),
            ("GPUs", "num"),
            ("ranks", "text"),
            ("micro", "num"),
            ("recompute", "name"),
            ("DP", "name"),
            (f"GB/GPU of {gpu.usable_gb:g}", "num"),
            ("busy s", "num"),
        ],
        caption=(
            "micro: samples per micro-batch x micro-batches; DP: fsdp (sharded state, gathered for the step), "
            "fsdp/rs (sharded state, each block gathered per call: ZeRO-3) or repl (replicated); "
            f"GB/GPU: predicted peak memory, of the {gpu.usable_gb:g} GB a plan may fill ({gpu.memory_gb:g} GB "
            f"less a {gpu.reserve:g} GB reserve for the {gpu.device} runtime: gpu.reserve_gb); busy s: compute per step"
        ),
    )
    for name, mp in plan.modules.items():
        t.add_row(
            Text(name, style=colours[name]),
            mp.layout.short(),
            str(mp.layout.gpus),
            _ranks(mp),
            f"{mp.micro_batch}x{mp.num_micro_batches}",
            mp.recompute.value,
            _dp(mp),
            f"{mp.memory_gb:.1f}",
            f"{mp.time_s:.3f}",
        )
    return t


def _dp(mp: ModulePlan) -> str:
    if mp.data_parallel != "fsdp":
        return "repl"
    return "fsdp/rs" if mp.reshards else "fsdp"


def _ranks(mp: ModulePlan) -> str:
    r = mp.ranks
    contiguous = r == list(range(r[0], r[0] + len(r)))
    if contiguous and len(r) > 1:
        return f"{r[0]}-{r[-1]}"
    return ",".join(map(str, r[:8])) + (f" +{len(r) - 8} more" if len(r) > 8 else "")


def _placement_picture(plan: Plan, colours: dict[str, str]) -> Text:
    """One row per node, one cell per GPU, letters and colours of the modules on it."""
    gpn = plan.ranks_per_node
    nodes = plan.world_size // gpn
    owners: dict[int, list[str]] = {r: [] for r in range(plan.world_size)}
    for name, mp in plan.modules.items():
        for r in mp.ranks:
            owners[r].append(name)
    text = Text()
    shown = list(range(min(nodes, MAX_NODES_DRAWN)))
    if nodes > MAX_NODES_DRAWN:
        shown[-1] = nodes - 1
    for i, node in enumerate(shown):
        if nodes > MAX_NODES_DRAWN and i == len(shown) - 1:
            text.append(f"   … {nodes - MAX_NODES_DRAWN + 1} more nodes …\n", style="dim")
        text.append(f"node {node:>4} ")
        for g in range(gpn):
            text.append("[")
            for name in owners[node * gpn + g]:
                text.append(name[0].upper(), style=f"bold {colours[name]}")
            text.append("]")
        text.append("\n")
    legend = "  ".join(f"{n[0].upper()}={n}" for n in colours)
    text.append(legend, style="dim")
    return text


def _prediction_table(plan: Plan) -> Table:
    base: Prediction | None = plan.baseline.predicted if plan.baseline else None
    columns = [("", "text"), (f"orch ({plan.placement.value})", "num")]
    if base is not None:
        columns += [("baseline (homogeneous)", "num"), ("gain", "num")]
    t = table("predicted step (cost model)", columns)
    p = plan.predicted
    mem = max(mp.memory_gb for mp in plan.modules.values())
    rows = [("step time", f"{p.step_time_s:.3f} s", base and f"{base.step_time_s:.3f} s"),
            ("tokens/s", f"{p.tokens_per_s:,.0f}", base and f"{base.tokens_per_s:,.0f}"),
            ("MFU", f"{p.mfu:.1%}", base and f"{base.mfu:.1%}")]  # fmt: skip
    for label, ours, theirs in rows:
        if base is None:
            t.add_row(label, ours)
        elif label == "step time":
            t.add_row(label, ours, theirs, f"{base.step_time_s / p.step_time_s - 1:+.1%}")
        else:
            t.add_row(label, ours, theirs, "")
    if plan.baseline is not None:
        bmem = max(mp.memory_gb for mp in plan.baseline.modules.values())
        t.add_row("peak memory/GPU", f"{mem:.1f} GB", f"{bmem:.1f} GB", "")
        layouts = ", ".join(f"{n} {mp.layout.short()}" for n, mp in plan.baseline.modules.items())
        t.caption = f"baseline: {layouts}"
    else:
        t.add_row("peak memory/GPU", f"{mem:.1f} GB")
        t.caption = "baseline: the homogeneous layout does not fit in memory"
    return t


def _alternatives_table(plan: Plan) -> Table:
    t = table(
        "next best plans",
        [("#", "num"), ("placement", "name"), ("layouts", "text"), ("step s", "num"), ("vs best", "num")],
    )
    for i, a in enumerate(plan.alternatives, start=2):
        layouts = "; ".join(f"{n}: {lay} ({a.gpus[n]} GPUs)" for n, lay in a.layouts.items())
        ratio = a.predicted.step_time_s / plan.predicted.step_time_s - 1
        t.add_row(str(i), a.placement.value, layouts, f"{a.predicted.step_time_s:.3f}", f"{ratio:+.1%}")
    return t


def render_plan(console: Console, plan: Plan) -> None:
    colours = _colour_of(plan)
    console.print(_layout_table(plan, colours))
    console.print(_placement_picture(plan, colours))
    edges = ", ".join(f"{e.src}->{e.dst} {e.kind.value} ({e.transport.value})" for e in plan.edges)
    if edges:
        console.print(f"boundaries: {edges}; schedule: {plan.schedule}")
    console.print(_prediction_table(plan))
    if plan.alternatives:
        console.print(_alternatives_table(plan))
