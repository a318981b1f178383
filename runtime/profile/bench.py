"""`orch profile`'s rank body: every case of the profile timed on this rank, the medians gathered to rank 0.

Every rank runs every case at the same time, as training does: on a machine where ranks share
cores (here 4 gloo processes on 2 CPUs) a block timed alone runs about N/cores times faster than
in a step, so timing it on one idle process would predict a step 2x too short. Each case starts
after a barrier; a rank keeps the median of its repetitions (runtime/profile/timing.py) and of the
profile's passes over its cases (a pass under steal from the hypervisor is timed again: steal.py),
and the profile takes the slowest rank of a compute case, the median
rank of a collective.

The cases (runtime/profile/cases.py) and who times them: the modules' compute (compute.py), the
per-step work outside the modules, the runtime's own through its code (per_step.py), and
nccl-tests-style collectives inside a node and across nodes (collectives.py). The submitting host
turns rank 0's raw record into the profile (build.py).

`profile_rank` needs only an initialised process group, so a Slurm job can call it unchanged.
"""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from typing import Any

from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.profile.cases import (
    BlockCase,
    Case,
    OverheadCase,
    ProfileConfig,
    RestCase,
    RuntimeCase,
    StepCase,
    build_cases,
)
from orch.runtime.profile.collectives import link_groups, time_collective
from orch.runtime.profile.compute import ModuleCases
from orch.runtime.profile.fit import median
from orch.runtime.profile.per_step import time_bookkeeping, time_runtime
from orch.runtime.profile.steal import cpu_jiffies, steal_share
from orch.runtime.profile.timing import Timer


def profile_rank(rank: int, world: int, cfg: ProfileConfig, device: str = "cpu") -> dict[str, Any] | None:
    """Run every case on this rank (the process group is initialised); rank 0 returns the raw record:

    `times` (case key -> seconds: a compute case's slowest rank, a collective's median rank; a runtime
    case's boundary points and their bytes too),
    `memory` (peak block case key -> activation bytes per token), `group_sizes` (link kind -> ranks),
    `device`, `sharing` (the cores and ranks of the busiest host, on CPUs) and `steal` (the largest share of
    CPU time the host stole during a kept pass, and how many passes were timed again for it), all plain JSON.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    model = ModelSpec.model_validate_json(cfg.model_json)
    data = DataSpec.model_validate_json(cfg.data_json)
    dev = torch.device(device)
    timer = Timer(cfg.reps, dev)
    cases = build_cases(cfg, model, world)
    # Process groups: every rank creates every one, in the same order (torch requires it).
    groups = link_groups(rank, world, cfg.ranks_per_node)
    # (dp, tp) meshes per TP degree: a block's TP group and the ranks its data parallelism spans
    meshes: dict[int, tuple[Any, Any]] = {1: (init_device_mesh(dev.type, (world,), mesh_dim_names=("dp",)), None)}
    # each rank by itself (the overhead of a module with no DP peer)
    alone = init_device_mesh(dev.type, (world, 1), mesh_dim_names=("rank", "dp"))["dp"] if world > 1 else meshes[1][0]
    for t in sorted({c.tp for c in cases if isinstance(c, BlockCase)}):
        if t > 1:
            grid = init_device_mesh(dev.type, (world // t, t), mesh_dim_names=("dp", "tp"))
            meshes[t] = (grid["dp"], grid["tp"])
    modules = ModuleCases(model, cfg, timer, meshes, rank, alone)

    memory: dict[str, float] = {}
    kept: list[dict[str, float]] = []  # each kept pass: case key -> seconds
    stolen: list[float] = []  # the kept passes' steal shares (the most of any host)
    repeated = 0
    progress = _Progress(len(cases) * cfg.passes) if cfg.progress and rank == 0 else None
    try:
        while len(kept) < cfg.passes:
            before = cpu_jiffies()
            timed: dict[str, float] = {}
            for case in cases:
                if progress is not None:
                    progress.show(case)
                dist.barrier()
                timed.update(_run_case(case, modules, memory, groups, model, data, cfg, rank, world, dev, timer))
                if progress is not None:
                    progress.advance()
            mine = steal_share(before, cpu_jiffies())
            most = timer.agree_max(-1.0 if mine is None else mine)  # the most of any host; < 0: none can tell
            share = None if most < 0 else most
            if share is not None and share > cfg.max_steal and repeated < cfg.passes:
                repeated += 1  # every rank agrees (the most of any host): the same passes on all
                if progress is not None:
                    progress.extend(len(cases))
                continue
            kept.append(timed)
            if share is not None:
                stolen.append(share)
    finally:
        if progress is not None:
            progress.stop()
    results = {k: median([p[k] for p in kept]) for k in kept[0]}
    everyone: list[Any] = [None] * world
    host = (socket.gethostname(), len(os.sched_getaffinity(0)))
    dist.all_gather_object(everyone, {"times": results, "memory": memory, "host": host})
    if rank != 0:
        return None
    sharing = None
    if dev.type == "cpu":  # ranks of one machine share its cores (GPUs: a device per rank)
        per_host: dict[str, list[int]] = {}
        for e in everyone:
            per_host.setdefault(e["host"][0], []).append(e["host"][1])
        busiest = max(per_host.values(), key=len)
        sharing = {"cores": min(busiest), "ranks": len(busiest)}
    # A step waits for its slowest rank at the collective that ends each phase: the modules' compute and the
    # step's bookkeeping are priced at the slowest rank (ranks sharing cores get unequal shares of them; with a
    # device per rank they agree). Collectives and the runtime's routes at the median rank: each rank's figure
    # there also holds its wait for the last to arrive (docs/validation.md reads them the same way).
    slowest = {c.key for c in cases if isinstance(c, BlockCase | RestCase | OverheadCase | StepCase)}
    merged = {
        k: (max if k in slowest else median)([e["times"][k] for e in everyone if k in e["times"]]) for k in results
    }
    mem = {k: median([e["memory"][k] for e in everyone if k in e["memory"]]) for k in memory}
    group_sizes = {link: len(ranks) for link, (_, ranks) in groups.items()}
    return {
        "times": merged,
        "memory": mem,
        "group_sizes": group_sizes,
        "device": _device_name(dev),
        "sharing": sharing,
        "steal": {"share": max(stolen) if stolen else None, "repeated": repeated},
    }


def _run_case(
    case: Case,
    modules: ModuleCases,
    memory: dict[str, float],
    groups: dict[str, Any],
    model: ModelSpec,
    data: DataSpec,
    cfg: ProfileConfig,
    rank: int,
    world: int,
    dev: Any,
    timer: Timer,
) -> dict[str, float]:
    """One pass of `case` on this rank: its result keys and seconds (a peak block's activation bytes go to
    `memory`, measured on the first pass only)."""
    if isinstance(case, BlockCase):
        seconds, peak = modules.block(replace(case, peak=case.peak and case.key not in memory))
        if peak is not None:
            memory[case.key] = peak
        return {case.key: seconds}
    if isinstance(case, RestCase):
        return {case.key: modules.rest(case)}
    if isinstance(case, OverheadCase):
        return {case.key: modules.overhead(case)}
    if isinstance(case, RuntimeCase):
        return time_runtime(case, model, data, cfg, rank, world, dev)
    if isinstance(case, StepCase):
        return {case.key: time_bookkeeping(model, data, cfg, rank, world, timer)}
    if case.link in groups:
        g, ranks = groups[case.link]
        return {case.key: time_collective(case, g, ranks, rank, timer)}
    return {}


class _Progress:
    """Rank 0's progress bar on stderr, one step per case."""

    def __init__(self, total: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description:<36}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.bar.start()
        self.total = total
        self.task = self.bar.add_task("profiling", total=total)

    def show(self, case: Case) -> None:
        self.bar.update(self.task, description=case.key.replace("/", " "))

    def advance(self) -> None:
        self.bar.advance(self.task)

    def extend(self, steps: int) -> None:
        """A pass to time again: `steps` more to go."""
        self.total += steps
        self.bar.update(self.task, total=self.total)

    def stop(self) -> None:
        self.bar.stop()


def _device_name(dev: Any) -> str:
    import torch

    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    return "cpu"


__all__ = ["profile_rank"]
