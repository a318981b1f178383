"""`orch profile`'s per-step cases outside the modules: the step's bookkeeping and the runtime's own work.

The bookkeeping (StepCase): batch assembly, the samples a rank builds for every module, the global
loss all_reduce and the metrics all_gather_object. The runtime's own work (RuntimeCase) runs through
its code: the orchestrator, the input routes and the boundary moves of runtime/train/step.py's step.
"""

from __future__ import annotations

from typing import Any

from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.profile.cases import ProfileConfig, RuntimeCase
from orch.runtime.profile.fit import median
from orch.runtime.profile.timing import Timer

RUNTIME_REPS = 4  # at least this many repetitions of the runtime case per profile pass (tens of ms each)


def time_bookkeeping(
    model: ModelSpec, data: DataSpec, cfg: ProfileConfig, rank: int, world: int, timer: Timer
) -> float:
    """Seconds of one step's work outside the modules (the boundary moves and the orchestrator's work are
    the runtime case)."""
    import torch
    import torch.distributed as dist

    from orch.runtime.data.synthetic import SyntheticBatch

    counter, dtype = [0], cfg.torch_dtype

    def step() -> None:
        counter[0] += 1
        batch = SyntheticBatch.build(model, data, cfg.seed, counter[0])
        for _ in model.modules:
            for i in range(rank, batch.size, world):
                batch.sample(i, dtype)
        dist.all_reduce(torch.zeros((), dtype=torch.float64))
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, {"step": 0.0})

    return timer.time(step)


def time_runtime(
    case: RuntimeCase, model: ModelSpec, data: DataSpec, cfg: ProfileConfig, rank: int, world: int, device: Any
) -> dict[str, float]:
    """The runtime's per-step work outside the modules, through its own code, by result key:

    - the case's key: the post-balancing orchestrator (runtime/train/post_balance.py) on synthetic batches
      of the DataSpec, what of it the runtime's step waits for: the next step's announce (length
      all_gather, then the dispatch handed to the worker thread) and this step's input routes
      (runtime/train/inputs.py `InputRouter.inputs`: one transport.move per module, encoder features,
      the LLM's text and label ids) while the thread dispatches; the dispatch itself runs during the step
      before, as `prefetch` overlaps it in the runtime;
    - each boundary point: its encoder's boundary move into the LLM layout by the orchestrator's composed
      table (runtime/parallel/boundary.py `Boundary.route`), forward and backward (transport.routed),
      encoder outputs of the batch's sizes with the rows multiplied by the point's scale; its bytes key:
      the mean encoder-output bytes per rank.

    Every module on dp = world, tp = 1 (the plan-independent part); each repetition starts after a barrier,
    so what is timed is the work itself, not the skew between ranks.
    """
    import dataclasses
    import time

    import torch
    import torch.distributed as dist

    from orch.planner.balance.mode import Mode
    from orch.planner.plan import Layout
    from orch.runtime.data.batch import encoder_order
    from orch.runtime.data.synthetic import SyntheticBatch
    from orch.runtime.parallel.boundary import Boundary
    from orch.runtime.parallel.grid import build_grids
    from orch.runtime.parallel.transport import routed
    from orch.runtime.plans import hand_plan
    from orch.runtime.train.inputs import InputRouter
    from orch.runtime.train.post_balance import PostBalancer

    llm, hidden, dtype = model.llm_name, model.llm.hidden, cfg.torch_dtype
    plan = hand_plan(model, data, {llm: (Layout(dp=world), list(range(world)))})
    plan = plan.model_copy(update={"ranks_per_node": cfg.ranks_per_node})  # the nodes being profiled
    grids = build_grids(plan.modules, device.type)
    orch = PostBalancer(plan, grids, Mode.ORCH, cfg.elem_bytes, device=device)
    router = InputRouter(plan, grids, rank, world, device, balanced=True)
    boundaries = {e.src: Boundary(e, grids[e.src], grids[llm]) for e in plan.edges}
    samples: dict[str, list[float]] = {}
    nbytes: dict[str, list[float]] = {}
    try:
        reps = max(cfg.reps, RUNTIME_REPS)  # short cases: more reps
        orch.prefetch(SyntheticBatch.build(model, data, cfg.seed, 1_000), rank, world)
        for step in range(reps + 1):  # the first is a warm-up
            batch = SyntheticBatch.build(model, data, cfg.seed, 1_000 + step)
            # as in runtime/train/step.py: this step's tables were dispatched on the worker thread while the
            # step before ran (untimed here: the runtime hides that wait behind the step's compute) ...
            tables = orch.tables(batch, rank, world)
            dist.barrier()
            t = time.perf_counter()
            # ... and on the critical path: the next step's length announce, then this step's input routes
            # while the dispatcher works
            if step < reps:
                orch.prefetch(SyntheticBatch.build(model, data, cfg.seed, 1_000 + step + 1), rank, world)
            for name in [*encoder_order(model), llm]:
                router.inputs(name, batch, tables, dtype, serves=True)
            took = time.perf_counter() - t
            if step:
                samples.setdefault(case.key, []).append(took)
            for point in case.boundaries:
                e = point.encoder
                route = boundaries[e].route(batch, tables.boundary_table(e), rows=tables.boundary_rows(e, batch))
                route = dataclasses.replace(route, rows=tuple(point.scale * r for r in route.rows))
                held = sum(route.rows[i] for i in router.held(point.encoder, tables))
                x = torch.randn(held, hidden, dtype=dtype, device=device).requires_grad_()
                dist.barrier()
                t = time.perf_counter()
                y = routed(x, route, rank, world)
                y.backward(torch.ones_like(y))
                took = time.perf_counter() - t
                if step:
                    samples.setdefault(point.key, []).append(took)
                    moved = sum(route.rows) * hidden * cfg.elem_bytes / world
                    nbytes.setdefault(point.bytes_key, []).append(moved)
    finally:
        orch.close()
    out = {k: median(v) for k, v in samples.items()}
    out.update({k: median(v) for k, v in nbytes.items()})
    return out


__all__ = ["time_bookkeeping", "time_runtime"]
