"""`orch profile`'s measurements: one rank body that times compute and collectives, and a local launcher.

Every rank runs every case at the same time, as training does: on a machine where ranks share
cores (here 4 gloo processes on 2 CPUs) a block timed alone runs about N/cores times faster than
in a step, so timing it on one idle process would predict a step 2x too short. Each case starts
after a barrier; a rank keeps the median of its repetitions and the profile takes the median
over ranks.

What is timed is what the runtime executes (runtime/train/step.py): a Block (a DTensor TP shard
over a real TP group when tp > 1) forward+backward on a packed micro-batch of k samples with
per-sample attention; the module's parts outside the blocks; the per-step fixed work (one
coalesced gradient all_reduce per module, the optimizer step, batch assembly and the metric
collectives); the runtime's own per-step work through its code (`_time_runtime`: the orchestrator's
announce, dispatch and input routes, and the boundary moves forward and backward); and
nccl-tests-style collectives inside a node and across nodes.

`profile_rank` needs only an initialised process group, so a Slurm job can call it unchanged.
"""

from __future__ import annotations

import math
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from orch.planner.errors import OrchError
from orch.planner.profile import BoundaryFit, CollectiveRow, ComputeFit, CoreSharing, LinkFit, ModuleProfile, Profile
from orch.planner.specs import DataSpec, ModelSpec, ModuleKind
from orch.runtime.profile.cases import (
    LINKS,
    BlockCase,
    CommCase,
    Link,
    OverheadCase,
    ProfileConfig,
    RestCase,
    RuntimeCase,
    StepCase,
    build_cases,
    tp_degrees,
)
from orch.runtime.profile.fit import bandwidths, fit_alpha_beta, fit_compute, median

RUNTIME_REPS = 10  # at least this many repetitions of the runtime case (tens of ms each: medians of 3 are noisy)
MIN_WINDOW_S = 0.02  # a timed window spans several scheduler slices (see _time)
MAX_CALLS = 64


def _time(fn: Any, reps: int, sync: Any, agree: Any = None) -> float:
    """Median seconds of one call of `fn` over `reps` timed windows of at least MIN_WINDOW_S each.

    One call of a tiny block is well under a scheduler time slice: where ranks share cores, a lone
    call either runs undisturbed or waits a whole slice, and its median is neither. A window of
    many calls sees the share of the core a rank really gets, as a training step does. `agree`
    makes every rank use the largest call count (collective cases must call equally often).
    """
    fn()  # warm-up: allocator, autograd graph, DTensor dispatch caches
    sync()
    t = time.perf_counter()
    fn()
    sync()
    one = time.perf_counter() - t
    calls = max(1, min(MAX_CALLS, math.ceil(MIN_WINDOW_S / max(one, 1e-9))))
    if agree is not None:
        calls = agree(calls)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t) / calls)
    return median(times)


def _agree(calls: int, device: Any, group: Any = None) -> int:
    """The largest call count over the group (every rank of a collective case must call equally often)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([calls], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def _saved_bytes(fn: Any) -> int:
    """Bytes autograd keeps for backward during one forward (the CPU stand-in for the allocator's peak)."""
    import torch

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        local = getattr(t, "_local_tensor", t)  # a DTensor's shard is what this rank holds
        try:
            st = local.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        except RuntimeError:  # no real storage (views of wrapper subclasses): count the tensor itself
            seen[id(t)] = local.numel() * local.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def _peak_bytes(fn: Any, dev: Any) -> int:
    """Activation bytes of one forward: the allocator's peak on CUDA, the saved tensors' sizes on CPU."""
    import torch

    if dev.type != "cuda":
        return _saved_bytes(fn)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(dev) - base
    del out
    return int(peak)


def profile_rank(rank: int, world: int, cfg: ProfileConfig, device: str = "cpu") -> dict[str, Any] | None:
    """Run every case on this rank (the process group is initialised); rank 0 returns the raw results."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from orch.runtime.data.synthetic import GlobalBatch, Sample
    from orch.runtime.models.reference import LLM, Block, Encoder, build_module, init_module
    from orch.runtime.parallel.tensor import apply_tp
    from orch.runtime.train.compute import build_optimizer, encode, text_loss
    from orch.runtime.train.grad_sync import all_reduce_flat

    model = ModelSpec.model_validate_json(cfg.model_json)
    data = DataSpec.model_validate_json(cfg.data_json)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[cfg.dtype]
    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def agree(calls: int) -> int:
        return _agree(calls, dev)

    rpn = cfg.ranks_per_node
    nodes = world // rpn
    # Groups of both link kinds; every rank creates every group in the same order (torch requires it).
    groups: dict[str, Any] = {}
    for kind, members in (
        ("intra_node", [list(range(n * rpn, (n + 1) * rpn)) for n in range(nodes)]),
        ("inter_node", [list(range(i, world, rpn)) for i in range(rpn)] if nodes > 1 else []),
    ):
        for ranks in members:
            g = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks and g is not None:
                groups[kind] = (g, ranks)
    tp_meshes = {}
    cases = build_cases(cfg, model, world)
    for t in sorted({c.tp for c in cases if isinstance(c, BlockCase)}):
        if t > 1:
            tp_meshes[t] = init_device_mesh(dev.type, (world // t, t), mesh_dim_names=("dp", "tp"))["tp"]

    results: dict[str, float] = {}
    memory: dict[str, float] = {}
    progress = None
    if cfg.progress and rank == 0:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(
            TextColumn("{task.description:<36}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        progress.start()
        task = progress.add_task("profiling", total=len(cases))
    blocks: dict[tuple[str, int], Any] = {}
    rests: dict[str, Any] = {}
    gen = torch.Generator().manual_seed(cfg.seed + rank)
    try:
        for case in cases:
            if progress is not None:
                progress.update(task, description=case.key.replace("/", " "))
            dist.barrier()
            key = case.key
            if isinstance(case, BlockCase):
                n, t, k, length = case.module, case.tp, case.k, case.length
                spec = model.modules[n]
                if (n, t) not in blocks:
                    blk = Block(spec, causal=spec.kind == ModuleKind.LLM).to(dtype)
                    init_module(blk, n, cfg.seed)
                    if t > 1:
                        apply_tp(blk, tp_mesh=tp_meshes[t])
                    blocks[(n, t)] = blk.to(dev)
                blk = blocks[(n, t)]
                x = torch.randn(k * length, spec.hidden, generator=gen, dtype=dtype).to(dev).requires_grad_()
                seqlens = [length] * k

                def run(blk: Any = blk, x: Any = x, seqlens: list[int] = seqlens) -> None:
                    blk(x, seqlens).sum().backward()

                results[key] = _time(run, cfg.reps, sync, agree)
                if case.peak:
                    memory[key] = _peak_bytes(lambda blk=blk, x=x, s=seqlens: blk(x, s), dev) / (k * length)
            elif isinstance(case, RestCase):
                n, k, length = case.module, case.k, case.length
                spec = model.modules[n]
                if n not in rests:
                    bare = spec.model_copy(update={"layers": 0})
                    mod = (
                        LLM(bare) if spec.kind == ModuleKind.LLM else Encoder(bare, model.llm.hidden, model.modality(n))
                    )
                    init_module(mod.to(dtype), n, cfg.seed)
                    rests[n] = mod.to(dev)
                mod = rests[n]
                empty = torch.zeros(0, dtype=torch.int64, device=dev)
                if spec.kind == ModuleKind.LLM:
                    vocab = spec.vocab or 1
                    texts = [torch.randint(0, vocab, (length,), generator=gen).to(dev) for _ in range(k)]
                    prefixes = [torch.zeros(0, spec.hidden, dtype=dtype, device=dev) for _ in range(k)]
                    texts_only = [Sample(i, {}, text, text) for i, text in enumerate(texts)]

                    def run(mod: Any = mod, p: Any = prefixes, s: Any = texts_only, n: int = k * length) -> None:
                        text_loss(mod, p, s, label_tokens=n).backward()

                else:
                    frames = model.modality(n).frames_per_token
                    feats = torch.randn(k * length * frames, spec.input_dim or 1, generator=gen, dtype=dtype).to(dev)
                    inputs = [Sample(i, {n: f}, empty, empty) for i, f in enumerate(feats.split(length * frames))]

                    def run(mod: Any = mod, n: str = n, s: list[Sample] = inputs, fpt: int = frames) -> None:
                        encode(mod, n, s, dtype, fpt).sum().backward()

                results[key] = _time(run, cfg.reps, sync, agree)
            elif isinstance(case, OverheadCase):
                n = case.module
                full = build_module(n, model).to(dtype).to(dev)
                params = list(full.parameters())
                for p in params:
                    p.grad = torch.zeros_like(p)
                opt = build_optimizer(params, "sgd", 0.0)

                def run(params: list[Any] = params, opt: Any = opt) -> None:
                    # what the gradient sync and the optimizer do once per step for this module, DP over all
                    # ranks (runtime/train/grad_sync.py): one coalesced all_reduce of its gradients
                    all_reduce_flat([p.grad for p in params], None)
                    opt.step()
                    opt.zero_grad(set_to_none=False)

                results[key] = _time(run, cfg.reps, sync, agree)
            elif isinstance(case, RuntimeCase):
                results.update(_time_runtime(case, model, data, cfg, rank, world, dtype, dev))
            elif isinstance(case, StepCase):
                counter = [0]

                def run(counter: list[int] = counter) -> None:
                    # per-step work outside the modules: batch assembly, the samples this rank builds for
                    # every module it serves, the boundary moves (every placement runs them, also homogeneous),
                    # the global loss all_reduce and the metrics all_gather_object
                    counter[0] += 1
                    batch = GlobalBatch.build(model, data, cfg.seed, counter[0])
                    for _ in model.modules:
                        for i in range(rank, batch.size, world):
                            batch.sample(i, dtype)
                    # (the boundary moves and the orchestrator's work are the "runtime" case)
                    dist.all_reduce(torch.zeros((), dtype=torch.float64))
                    everyone: list[Any] = [None] * world
                    dist.all_gather_object(everyone, {"step": 0.0})

                results[key] = _time(run, cfg.reps, sync, agree)
            elif case.link in groups:
                g, ranks = groups[case.link]
                results[key] = _time_collective(case, g, ranks, rank, dev, cfg.reps, sync)
            if progress is not None:
                progress.advance(task)
    finally:
        if progress is not None:
            progress.stop()
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
    merged = {k: median([e["times"][k] for e in everyone if k in e["times"]]) for k in results}
    mem = {k: median([e["memory"][k] for e in everyone if k in e["memory"]]) for k in memory}
    group_sizes = {kind: len(groups[kind][1]) for kind in groups}
    return {
        "times": merged,
        "memory": mem,
        "group_sizes": group_sizes,
        "device": _device_name(dev),
        "sharing": sharing,
    }


def _time_runtime(
    case: RuntimeCase,
    model: ModelSpec,
    data: DataSpec,
    cfg: ProfileConfig,
    rank: int,
    world: int,
    dtype: Any,
    dev: Any,
) -> dict[str, float]:
    """The runtime's per-step work outside the modules, through its own code (runtime/train/step.py's step):

    - the case's key: the post-balancing orchestrator (runtime/train/orchestrator.py) on a synthetic batch
      of the DataSpec: announce (length all_gather), dispatch on its worker thread and the wait for it, then
      the input routes (runtime/train/inputs.py `InputRouter.inputs`: one transport.move per module,
      encoder features, the LLM's text and label ids);
    - each boundary point: its encoder's boundary move into the LLM layout by the orchestrator's composed
      table (runtime/parallel/boundary.py `Boundary.route`), forward and backward (transport.routed),
      encoder outputs of the batch's sizes with the rows multiplied by the point's scale; its bytes key:
      the mean encoder-output bytes per rank.

    Every module on dp = world, tp = 1 (the plan-independent part); each repetition starts after a barrier,
    so what is timed is the work itself, not the skew between ranks.
    """
    import dataclasses

    import torch
    import torch.distributed as dist

    from orch.planner.balance.mode import Mode
    from orch.planner.plan import Layout
    from orch.runtime.data.synthetic import GlobalBatch, encoder_order
    from orch.runtime.parallel.boundary import Boundary
    from orch.runtime.parallel.grid import build_grids
    from orch.runtime.parallel.transport import routed
    from orch.runtime.plans import hand_plan
    from orch.runtime.train.inputs import InputRouter
    from orch.runtime.train.orchestrator import Orchestrator

    llm, hidden = model.llm_name, model.llm.hidden
    plan = hand_plan(model, data, {llm: (Layout(dp=world), list(range(world)))})
    plan = plan.model_copy(update={"ranks_per_node": cfg.ranks_per_node})  # the nodes being profiled
    grids = build_grids(plan.modules, dev.type)
    orch = Orchestrator(plan, grids, Mode.ORCH, cfg.elem_bytes, device=dev)
    router = InputRouter(plan, grids, rank, world, dev, balanced=True)
    boundaries = {e.src: Boundary(e, grids[e.src], grids[llm]) for e in plan.edges}
    samples: dict[str, list[float]] = {}
    nbytes: dict[str, list[float]] = {}
    try:
        for step in range(max(cfg.reps, RUNTIME_REPS) + 1):  # the first is a warm-up; short cases: more reps
            batch = GlobalBatch.build(model, data, cfg.seed, 1_000 + step)
            dist.barrier()
            t = time.perf_counter()
            orch.prefetch(batch, rank, world)
            tables = orch.tables(batch, rank, world)
            for name in [*encoder_order(model), llm]:
                router.inputs(name, batch, tables, dtype, serves=True)
            took = time.perf_counter() - t
            if step:
                samples.setdefault(case.key, []).append(took)
            for point in case.boundaries:
                route = boundaries[point.encoder].route(batch, tables.boundary_table(point.encoder))
                route = dataclasses.replace(route, rows=tuple(point.scale * r for r in route.rows))
                held = sum(route.rows[i] for i in router.held(point.encoder, tables))
                x = torch.randn(held, hidden, dtype=dtype, device=dev).requires_grad_()
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


def _time_collective(case: CommCase, group: Any, ranks: list[int], rank: int, dev: Any, reps: int, sync: Any) -> float:
    import torch
    import torch.distributed as dist

    op, n = case.op, len(ranks)
    numel = max(case.nbytes // 4 // n * n, n)  # float32, divisible by the group size
    x = torch.zeros(numel, dtype=torch.float32, device=dev)
    me = ranks.index(rank)
    if op == "all_reduce":
        fn = lambda: dist.all_reduce(x, group=group)  # noqa: E731
    elif op == "all_gather":  # nccl-tests: the message is the gathered output
        parts = [torch.empty(numel // n, device=dev) for _ in range(n)]
        fn = lambda: dist.all_gather(parts, x[: numel // n], group=group)  # noqa: E731
    elif op == "reduce_scatter":
        out = torch.empty(numel // n, device=dev)
        rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # renamed in torch 2.13
        fn = lambda: rs(out, x, group=group)  # noqa: E731
    elif op == "all_to_all":
        out = torch.empty_like(x)
        fn = lambda: dist.all_to_all_single(out, x, group=group)  # noqa: E731
    else:  # send_recv: every rank sends to the next and receives from the previous (nccl-tests sendrecv)
        buf = torch.empty_like(x)

        def fn() -> None:
            reqs = [
                dist.isend(x, ranks[(me + 1) % n], group=group),
                dist.irecv(buf, ranks[(me - 1) % n], group=group),
            ]
            for r in reqs:
                r.wait()

    try:
        return _time(fn, reps, sync, lambda c: _agree(c, dev, group))
    except (RuntimeError, NotImplementedError):
        return -1.0  # the backend lacks this op (gloo has no reduce_scatter); left out of the table


def _device_name(dev: Any) -> str:
    import torch

    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    return "cpu"


def build_profile(raw: dict[str, Any], model: ModelSpec, cfg: ProfileConfig, world: int, backend: str) -> Profile:
    """Fit the raw medians into the profile the planner reads (each number found by its case)."""
    import torch

    times: dict[str, float] = raw["times"]
    memory: dict[str, float] = raw["memory"]
    cases = build_cases(cfg, model, world)
    modules: dict[str, ModuleProfile] = {}
    for n in model.modules:
        fits: dict[int, ComputeFit] = {}
        for t in tp_degrees(model, n, world, cfg.ranks_per_node):
            blocks = [c for c in cases if isinstance(c, BlockCase) and c.module == n and c.tp == t]
            pts = _points(blocks, times)
            if pts:
                mem = next((memory[c.key] for c in blocks if c.peak and c.key in memory), 0.0)
                fits[t] = _fit(pts, mem)
        if not fits:
            continue
        rest_pts = _points([c for c in cases if isinstance(c, RestCase) and c.module == n], times)
        overhead = times.get(OverheadCase(n).key, 0.0)
        modules[n] = ModuleProfile(block=fits, rest=_fit(rest_pts, 0.0) if rest_pts else None, step_overhead_s=overhead)
    rows: list[CollectiveRow] = []
    links: dict[Link, LinkFit] = {}
    sizes: dict[str, int] = raw["group_sizes"]
    comms = sorted((c for c in cases if isinstance(c, CommCase)), key=lambda c: (c.link, c.op, c.nbytes))
    for c in comms:
        secs = times.get(c.key, 0.0)
        if secs <= 0:  # not measured, or the backend lacks the op
            continue
        ranks = sizes[c.link]
        algbw, busbw = bandwidths(c.op, ranks, c.nbytes, secs)
        rows.append(
            CollectiveRow(
                op=c.op, link=c.link, ranks=ranks, bytes=c.nbytes, time_s=secs, algbw_gbps=algbw, busbw_gbps=busbw
            )
        )
    for link in (link for link in LINKS if link in sizes):
        pts = [(r.bytes, r.time_s) for r in rows if r.link == link and r.op == "send_recv"]
        if len(pts) >= 2:
            alpha, gbps = fit_alpha_beta(pts)
            links[link] = LinkFit(alpha_s=alpha, gbps=gbps)
    boundary = None
    runtime = next(c for c in cases if isinstance(c, RuntimeCase))
    bpts = [(times[p.bytes_key], times[p.key]) for p in runtime.boundaries if p.key in times]
    if len({b for b, _ in bpts}) >= 2:
        alpha, gbps = fit_alpha_beta(sorted(bpts))
        boundary = BoundaryFit(alpha_s=alpha, gbps=gbps, elem_bytes=cfg.elem_bytes)
    return Profile(
        cluster=f"local x{world}",
        device=raw["device"],
        backend=backend,
        torch_version=torch.__version__,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        dtype=cfg.dtype,
        model=model.name,
        modules=modules,
        links=links,
        collectives=rows,
        nproc=world,
        ranks_per_node=cfg.ranks_per_node,
        quick=cfg.quick,
        boundary=boundary,
        balance_step_s=times.get(runtime.key, 0.0),
        step_bookkeeping_s=times.get(StepCase().key, 0.0),
        sharing=CoreSharing(**raw["sharing"]) if raw.get("sharing") else None,
    )


def _points(cases: list[BlockCase] | list[RestCase], times: dict[str, float]) -> list[tuple[int, int, float]]:
    """(k, length, seconds) of the measured `cases`, sorted."""
    return sorted((c.k, c.length, times[c.key]) for c in cases if c.key in times)


def _fit(points: list[tuple[int, int, float]], mem_per_token: float) -> ComputeFit:
    quadratic = len({length for _, length, _ in points}) >= 3
    f = fit_compute(points, quadratic=quadratic)
    return ComputeFit(
        c0=f.c0, c1=f.c1, c2=f.c2, call_s=f.call, rel_error=f.rel_error, memory_bytes_per_token=mem_per_token
    )


def run_profile_local(cfg: ProfileConfig, *, nproc: int, workdir: str | os.PathLike[str]) -> Profile:
    """Profile on `nproc` local gloo processes (the local launcher running a ProfileTask)."""
    from orch.runtime.launch.base import LaunchError
    from orch.runtime.launch.local import LocalLauncher
    from orch.runtime.profile.task import ProfileTask

    if nproc < 1 or nproc % cfg.ranks_per_node:
        raise OrchError(f"--nproc {nproc}: must be a positive multiple of {cfg.ranks_per_node} ranks per node")
    task = ProfileTask(cfg, str(workdir), nproc, device="cpu")
    try:
        profile: Profile = LocalLauncher(nproc).submit(task).result()
    except LaunchError as exc:
        raise OrchError(f"profile rank {exc.rank} failed: {exc.message}") from None
    return profile


__all__ = ["ProfileConfig", "build_profile", "profile_rank", "run_profile_local"]
