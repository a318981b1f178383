"""One rank's share of a plan, built once; `TrainStep.step(k)` runs training step k on it.

A step: this step's post-balancing tables (runtime/train/post_balance.py, prefetched during the last
step), the schedule (three-phase for homogeneous and colocated plans, graph-aware 1F1B for a
disaggregated one: runtime/train/schedules/), the gradient sync (runtime/train/grad_sync.py) and an
optimizer step per rank. The loss is normalised by the global label-token count, which is what makes
moving samples between ranks gradient-neutral (OrchMLLM).

Parallelism lives in runtime/parallel/ (TP, CP, EP, pipeline stages, boundary moves); the modules come
from runtime/models/; which samples a rank runs, and their micro-batches, from runtime/train/inputs.py.

Device (runtime/device.py): `TrainStep.device` is this rank's device (`cuda:{local_rank}` under NCCL,
else the CPU under gloo). Parameters move there after initialisation (before TP sharding), samples are
generated on the CPU from the seed and then moved, and every buffer, leaf and tensor handed to a
collective is created there. The planner's tables and split sizes stay on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from orch.planner.balance.mode import Mode
from orch.planner.plan import Plan
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.data.batch import GlobalBatch, initial_dp_index
from orch.runtime.data.prefetch import SamplePrefetcher
from orch.runtime.data.problems import DataProblems
from orch.runtime.data.source import BatchSource, ConversationBatch
from orch.runtime.launch.heartbeat import Heartbeat
from orch.runtime.memory import measured_step, parameter_storages, peak_bytes, state_parts
from orch.runtime.parallel.boundary import Boundary
from orch.runtime.parallel.context import CPGroup
from orch.runtime.parallel.expert import is_expert_param
from orch.runtime.parallel.grid import Grid, build_grids, build_meshes
from orch.runtime.train.aux_loss import RouterAux
from orch.runtime.train.calibration import longest_sample, modules_to_calibrate, shared_calibration, warm_up
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig, write_dump
from orch.runtime.train.grad_sync import sync_expert_grads
from orch.runtime.train.inputs import InputRouter
from orch.runtime.train.optim import build_optimizer, clip_grads, global_grad_norm, lr_at, set_lr
from orch.runtime.train.post_balance import PostBalancer, StepTables
from orch.runtime.train.rank_model import build_rank_model
from orch.runtime.train.schedules.context import StepContext, StepWork
from orch.runtime.train.support import check_supported
from orch.runtime.train.trace import Span
from orch.runtime.workdir.run_dir import say


@dataclass
class StepMetrics:
    """What one rank measured in one step (the trainer gathers every rank's into a StepRecord)."""

    step: int
    loss: float
    tokens: int
    step_time_s: float
    phases: dict[str, float] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)  # (module, phase, start, end), perf_counter
    balance: dict[str, object] = field(default_factory=dict)  # per phase costs and bytes, dispatcher seconds
    processed: dict[str, dict[int, int]] = field(default_factory=dict)  # module -> sample id -> tokens (DP leaders)
    grad_norm: float = 0.0  # the whole model's gradient norm, before clipping
    lr: float = 0.0  # the step's learning rate (before a module's factor)
    memory: dict[str, int] = field(default_factory=dict)  # state_bytes, peak_bytes (runtime/memory.py)
    data: dict[str, int] | None = None  # a data file's outcomes on this rank (ConversationBatch.data_counts)
    aux_loss: float | None = None  # the router's auxiliary loss of a MoE LLM (runtime/train/aux_loss.py)


class TrainStep:
    """One rank's modules, their grids, boundaries and optimizer; `step(k)` runs step k."""

    def __init__(
        self,
        plan: Plan,
        data: DataSpec,
        cfg: TrainConfig,
        rank: int,
        world: int,
        device: torch.device | str = "cpu",
        debug: DebugConfig | None = None,
        problems: DataProblems | None = None,
        heartbeat: Heartbeat | None = None,
    ) -> None:
        """`device`: this rank's device, matching the process group's backend (runtime/device.py `rank_device`);
        `problems`: where the media this rank cannot read are listed (RUN_DIR/data_problems.jsonl);
        `heartbeat`: told each phase boundary (runtime/launch/heartbeat.py: the watchdog reads it)."""
        check_supported(plan)
        if world != plan.world_size:
            raise ValueError(f"plan needs {plan.world_size} ranks, launched with {world}")
        self.plan, self.data, self.cfg, self.rank, self.world = plan, data, cfg, rank, world
        self.debug = debug or DebugConfig()
        self.heartbeat, self._step_now = heartbeat, 0
        self.device = torch.device(device)
        self.model = model = plan.model
        self.batches = BatchSource(model, data, cfg.seed, problems)  # synthetic, or the user's data file
        opened = (model, data) if problems is None else (model, data, problems)
        self.prefetcher = SamplePrefetcher(cfg.loader_workers, opened)
        self._upcoming: GlobalBatch | None = None
        self.grids: dict[str, Grid] = build_grids(plan.modules, self.device.type)
        build_meshes(self.grids)
        built = build_rank_model(plan, self.grids, cfg, rank, self.device)
        self.modules, self.ep, self.data_parallel = built.modules, built.ep, built.data_parallel
        self.optimizer = build_optimizer(self.modules, cfg)
        self.balancer = PostBalancer(
            plan, self.grids, cfg.balance, torch.finfo(cfg.torch_dtype).bits // 8, self._calibration(), self.device,
            cfg.encoder_balance,
        )  # fmt: skip
        edges = {e.src: e for e in plan.edges}
        llm_grid = self.grids[model.llm_name]
        self.ctx = StepContext(
            model, rank, world, self.device, cfg.torch_dtype, self.grids, self.modules, built.cp, built.stage,
            boundaries={e: Boundary(edges[e], self.grids[e], llm_grid) for e in model.encoder_names},
            router=InputRouter(
                plan, self.grids, rank, world, self.device, balanced=self.balancer.mode != Mode.NONE,
                at_destination=cfg.loads_at_destination(data.source is not None),
            ),
            beat=self.beat, aux=self._router_aux(model, built.cp),
        )  # fmt: skip
        # The graph-aware 1F1B needs the encoders and the LLM on disjoint ranks (each island runs its own order).
        disjoint = all(not set(self.grids[e].ranks) & set(llm_grid.ranks) for e in model.encoder_names)
        self.graph = (cfg.schedule or plan.schedule) == "graph_1f1b" and disjoint and bool(model.encoder_names)
        self._leader = {n: _leads(self.grids[n], rank) for n in self.modules}

    def beat(self, phase: str) -> None:
        """This rank enters `phase` of the step in flight (its heartbeat; the tests' stop hook)."""
        if self.heartbeat is not None:
            self.heartbeat.beat(phase, self._step_now)
        self.debug.at_phase(self.rank, self._step_now, phase)

    def _calibration(self) -> dict[str, SampleCost] | None:
        """The dispatcher's per-sample costs timed here, for the modules whose plan carries no profiled one
        (post_balance.dispatch_costs takes the plan's first); the others still run the fixed shapes once,
        untimed. Rank 0 says what it times (one progress line per module)."""
        if not self.cfg.calibrates:
            return None
        todo = modules_to_calibrate(self.plan)  # the same list on every rank: all of them take part, or none
        longest = {n: longest_sample(self.data, self.model, n) for n in self.model.modules}
        costed = [n for n in self.model.modules if n not in todo]
        told = say if self.rank == 0 else None
        calibration = (
            shared_calibration(self.model, self.cfg.torch_dtype, self.device, longest, todo, told) if todo else None
        )
        warm_up(self.model, costed, self.cfg.torch_dtype, self.device)
        return calibration

    def data_position(self, done: int) -> dict[str, object] | None:
        """With a data file, where the sampler stands after `done` steps (None: synthetic data)."""
        files = self.batches.files
        if files is None:
            return None
        seen = self.cfg.data_step(done) * self.data.global_batch
        epoch, at = divmod(seen, len(files))
        return {"source": self.data.source, "index": self.data.manifest, "samples": len(files),
                "seed": self.cfg.seed, "epoch": epoch, "position": at, "steps_done": done}  # fmt: skip

    def _prefetch_samples(self, upcoming: ConversationBatch) -> None:
        """Decode, on the loader's thread, the images and clips this rank will build next step (once the
        dispatcher's tables for it are known: where the samples go, or where they start when loading at the
        origin)."""
        future = self.balancer.pending(upcoming.step)

        def wanted() -> dict[str, list[int]]:
            return self._held(future.result() if future is not None else None, upcoming.size)

        self.prefetcher.start(upcoming, wanted)
        self._upcoming = upcoming

    def _held(self, tables: StepTables | None, size: int) -> dict[str, list[int]]:
        """Per encoder this rank serves, the samples it builds: where the dispatcher puts them when loading at
        the destination, their origin otherwise (and without tables)."""
        router, out = self.ctx.router, {}
        for name in (n for n in self.modules if n != self.model.llm_name):
            if tables is not None:
                out[name] = router.held_samples(name, tables, origin=not router.at_destination)
            else:  # unbalanced: every sample where it starts
                c = self.grids[name].coord(self.rank)
                assert c is not None
                out[name] = [i for i in range(size) if initial_dp_index(i, self.grids[name].dp) == c.dp]
        return out

    def _agree_on_unreadable(self, batch: ConversationBatch, tables: StepTables) -> ConversationBatch:
        """Decode what this rank builds (the loader did most of it), then agree with every rank which samples'
        media failed to decode anywhere (one all-reduce of a flag per sample): those train nothing on every
        rank, so the loss normaliser and the collectives stay the same everywhere."""
        batch.decode(self._held(tables, batch.size))
        flags = torch.zeros(batch.size, dtype=torch.int32)
        for i in batch.decoded.failed():
            flags[i] = 1
        flags = flags.to(self.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return batch.without({i for i, f in enumerate(flags.cpu().tolist()) if f})

    def step(self, k: int) -> StepMetrics:
        from orch.runtime.train.schedules.graph_1f1b import run_graph_1f1b
        from orch.runtime.train.schedules.three_phase import run_three_phase

        t0 = time.perf_counter()
        self._step_now = k
        self.beat("dispatch")
        self.debug.inject(self.rank, k)
        work = self._begin(k)
        t = time.perf_counter()
        self.beat("gather")
        self.data_parallel.begin()  # every module's parameters gathered once for the step
        work.phases["gather"] = time.perf_counter() - t
        with measured_step(self.device, parameter_storages(self.modules)) as meter:
            loss_sum = (run_graph_1f1b if self.graph else run_three_phase)(self.ctx, work)
        gathered = self.data_parallel.gathered_bytes()
        grad_norm, lr = self._update(k, work)
        state = state_parts(self.modules, self.optimizer)
        memory = {"state_bytes": sum(state.values()), "peak_bytes": peak_bytes(self.device, meter, state, gathered)}
        if self.device.type == "cpu":
            memory["activation_bytes"] = meter.peak  # the CPU peak's activation share (memory benches split it)
        batch = work.batch
        balance = {
            "mode": self.balancer.mode.value,
            **self.balancer.record(work.tables, batch, self.ctx.router.at_destination),
        }
        loss, aux_loss = self._global_loss(loss_sum, work.aux_sum)
        return StepMetrics(
            k,
            loss,
            batch.label_tokens,
            time.perf_counter() - t0,
            work.phases,
            work.spans,
            balance,
            work.counter.processed,
            grad_norm,
            lr,
            memory,
            batch.data_counts() if isinstance(batch, ConversationBatch) else None,
            aux_loss,
        )

    def _begin(self, k: int) -> StepWork:
        """Step k's batch (its samples decoded meanwhile when prefetched) and tables (prefetched during the last
        step); the next step's announced to the dispatcher and the loader."""
        upcoming_now, self._upcoming = self._upcoming, None
        if upcoming_now is not None and upcoming_now.step == self.cfg.data_step(k):
            batch = upcoming_now
        else:
            batch = self.batches.build(self.cfg.data_step(k))
        load_wait = self.prefetcher.wait(batch.step)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        t = time.perf_counter()
        tables = self.balancer.tables(batch, self.rank, self.world)
        decoding = time.perf_counter()
        if isinstance(batch, ConversationBatch):  # what the loader did not decode, decoded here: the load phase
            batch = self._agree_on_unreadable(batch, tables)
        decoding = time.perf_counter() - decoding
        if k + 1 < self.cfg.steps:
            upcoming = self.batches.build(self.cfg.data_step(k + 1))
            self.balancer.prefetch(upcoming, self.rank, self.world)
            if isinstance(upcoming, ConversationBatch):
                self._prefetch_samples(upcoming)
        work = StepWork(batch, tables, self.debug.counter(self._leader))
        work.phases["dispatch"] = time.perf_counter() - t - decoding
        if isinstance(batch, ConversationBatch):
            work.phases["load"] = load_wait + decoding  # this step's samples' decoding not hidden (0: all hidden)
        return work

    def _update(self, k: int, work: StepWork) -> tuple[float, float]:
        """Gradients reduced (FSDP2's units, the experts over their EDP groups), the global norm, the clip and the
        optimizer step; returns (gradient norm before clipping, the step's learning rate)."""
        t = time.perf_counter()
        self.beat("grad_sync")
        self.data_parallel.finish()
        work.spans.append(("data_parallel", "grad_sync", t, time.perf_counter()))
        sync_expert_grads(self.modules, self.ep, self.ctx.cp, work.spans)
        work.phases["grad_sync"] = time.perf_counter() - t
        t = time.perf_counter()
        self.beat("optimizer")
        if self.debug.dump_dir is not None and k == 0:
            self._dump("grads", lambda p: p.grad)
        grad_norm = global_grad_norm(self.modules, self.grids, self.ep, self.rank, self.device)
        if self.cfg.clip_norm > 0:
            clip_grads(self.modules, grad_norm, self.cfg.clip_norm)
        lr = lr_at(self.cfg, k)
        if self.optimizer is not None:
            lr = set_lr(self.optimizer, self.cfg, k)
            self.optimizer.step()
            work.spans.append(("optimizer", "optimizer", t, time.perf_counter()))
        work.phases["optimizer"] = time.perf_counter() - t
        return grad_norm, lr

    def _global_loss(self, loss_sum: torch.Tensor, aux_sum: float) -> tuple[float, float | None]:
        """(the LM loss, the router aux loss or None): sums of the LLM's TP-0 ranks' partial losses (TP replicas
        hold copies, counted once; CP ranks hold parts). `loss_sum` holds coef x aux too: taken out of the LM loss."""
        c = self.grids[self.model.llm_name].coord(self.rank)
        both = torch.stack(
            [loss_sum.to(torch.float64), torch.tensor(aux_sum, dtype=torch.float64, device=loss_sum.device)]
        )
        mine = both if c is not None and c.tp == 0 else torch.zeros_like(both)
        dist.all_reduce(mine)
        coef = self.model.llm.aux_loss_coef
        if not coef:
            return float(mine[0].item()), None
        return float(mine[0].item()) - coef * float(mine[1].item()), float(mine[1].item())

    def _router_aux(self, model: ModelSpec, cp: dict[str, CPGroup | None]) -> RouterAux | None:
        """The LLM's router auxiliary loss on this rank where the model asks for it (runtime/train/aux_loss.py)."""
        llm, spec = self.modules.get(model.llm_name), model.llm
        if llm is None or not spec.aux_loss_coef:
            return None
        group = cp.get(model.llm_name)
        return RouterAux.of(
            llm, spec.aux_loss_coef, spec.experts, spec.top_k, group.group if group is not None else None
        )

    def _dump(self, what: str, get: Callable[[nn.Parameter], torch.Tensor | None]) -> None:
        """Full tensors of every served module, written by its (dp 0, cp 0, tp 0) rank; all TP ranks join the gather."""
        out: dict[str, torch.Tensor] = {}
        for name in sorted(self.modules):
            c = self.grids[name].coord(self.rank)
            assert c is not None
            for pname, p in self.modules[name].named_parameters():
                value = get(p)
                if value is None:  # a frozen parameter (or one no sample reached) has no gradient
                    continue
                whole = hasattr(value, "full_tensor")
                full = value.full_tensor() if whole else value
                # Under EP the first EP group's ranks (dp < ep) hold the experts between them (orch's, by name;
                # transformers' stacked ones are a DTensor over the EP group, gathered whole above).
                split = name in self.ep and is_expert_param(pname) and not whole
                writer = c.dp < self.ep[name].ep if split else c.dp == 0
                if writer and c.tp == 0 and c.cp == 0:
                    out[f"{name}.{pname}"] = full.detach().cpu().clone()  # readable on any machine
        assert self.debug.dump_dir is not None
        write_dump(self.debug.dump_dir, what, self.rank, out)

    def finish(self) -> None:
        self.balancer.close()
        self.prefetcher.close()
        if self.debug.dump_dir is not None:
            self._dump("params", lambda p: p.data if not hasattr(p, "full_tensor") else p)


def _leads(grid: Grid, rank: int) -> bool:
    """This rank is its DP index's leader of the grid (tp 0, cp 0): it counts the tokens its samples brought."""
    c = grid.coord(rank)
    return c is not None and c.tp == 0 and c.cp == 0
