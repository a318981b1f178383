"""One rank's share of a plan, built once; `TrainStep.step(k)` runs training step k on it.

A step: this step's post-balancing tables (runtime/train/orchestrator.py, prefetched during the last
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
from typing import cast

import torch
import torch.distributed as dist
from torch import nn

from orch.planner.balance.mode import Mode
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.data.prefetch import SamplePrefetcher
from orch.runtime.data.source import BatchSource, ConversationBatch
from orch.runtime.data.synthetic import GlobalBatch, Sample, encoder_order, initial_dp_index
from orch.runtime.memory import measured_step, parameter_storages, peak_bytes, state_parts
from orch.runtime.models.build import build_modules
from orch.runtime.models.hf.module import HFModule
from orch.runtime.models.reference import LLM
from orch.runtime.models.sequence import scored_labels
from orch.runtime.parallel.boundary import Boundary
from orch.runtime.parallel.context import CPShard, cp_group
from orch.runtime.parallel.data import DataParallelSteps, master_dtype, shard_module
from orch.runtime.parallel.expert import build_expert_parallel, is_expert_param
from orch.runtime.parallel.grid import Grid, build_grids, build_meshes
from orch.runtime.parallel.pipeline import MicroBatch, PipelineStage
from orch.runtime.parallel.tensor import apply_tp
from orch.runtime.train.compute import join_prefix, label_loss
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.debug import DebugConfig, TokenCounter, write_dump
from orch.runtime.train.grad_sync import sync_expert_grads
from orch.runtime.train.inputs import InputRouter
from orch.runtime.train.optim import build_optimizer, clip_grads, global_grad_norm, lr_at, set_lr
from orch.runtime.train.orchestrator import (
    Orchestrator,
    StepTables,
    longest_sample,
    modules_to_calibrate,
    shared_calibration,
    warm_up,
)
from orch.runtime.train.recompute import apply_recompute
from orch.runtime.train.support import UnsupportedPlan, check_supported
from orch.runtime.train.trace import Span


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


@dataclass
class StepWork:
    """The state of the step in flight, handed to the schedule."""

    batch: GlobalBatch
    tables: StepTables
    counter: TokenCounter
    phases: dict[str, float] = field(default_factory=dict)
    spans: list[Span] = field(default_factory=list)


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
    ) -> None:
        """`device`: this rank's device, matching the process group's backend (runtime/device.py `rank_device`)."""
        check_supported(plan)
        if world != plan.world_size:
            raise ValueError(f"plan needs {plan.world_size} ranks, launched with {world}")
        self.plan, self.data, self.cfg, self.rank, self.world = plan, data, cfg, rank, world
        self.debug = debug or DebugConfig()
        self.device = torch.device(device)
        self.model = plan.model
        self.batches = BatchSource(plan.model, data, cfg.seed)  # synthetic, or the user's data file
        self.prefetcher = SamplePrefetcher(cfg.torch_dtype, cfg.loader_workers, (plan.model, data))
        self._upcoming: GlobalBatch | None = None
        self.grids: dict[str, Grid] = build_grids(plan.modules, self.device.type)
        build_meshes(self.grids)
        self.served = [n for n in self.model.modules if self.grids[n].coord(rank) is not None]
        self.cp = {n: cp_group(self.grids[n], rank, self.device) for n in self.served}  # None without CP
        params_dtype = master_dtype(cfg.torch_dtype)  # fp32 masters under bf16 compute (runtime/parallel/data.py)
        self.modules: dict[str, nn.Module] = build_modules(
            self.model, cfg.seed, params_dtype, cfg.model_factory, self.served
        )
        llm_grid = self.grids[self.model.llm_name]
        self.stage: PipelineStage | None = None
        if self.model.llm_name in self.modules:
            llm = self.modules[self.model.llm_name]
            coord = llm_grid.coord(rank)
            assert coord is not None
            if llm_grid.pp > 1:
                if not hasattr(llm, "keep_stage"):
                    raise UnsupportedPlan(f"modules.{self.model.llm_name}: a pipeline needs the LLM's keep_stage")
                llm.keep_stage(coord.pp, llm_grid.pp)  # after init: every stage's weights come from the full model's
            llm_cp = self.cp[self.model.llm_name]
            self.stage = PipelineStage(
                cast(LLM, llm), llm_grid, rank, self.model.llm.hidden, cfg.torch_dtype, llm_cp, self.device
            )
        # EP/EDP groups on every rank (world collective), then only the local experts are kept.
        ep = {n: mp.layout.ep for n, mp in plan.modules.items()}
        self.ep = build_expert_parallel(self.grids, ep, self.modules, rank)
        for name, module in self.modules.items():
            tp_mesh = self.grids[name].submesh("tp")
            if isinstance(module, HFModule):  # on meta until here: sharded, then this rank's share read or drawn
                module.place(self.device, tp_mesh, cfg.seed, name, params_dtype)
            else:
                module.to(self.device)  # initialised on the CPU from the seed (pruned to the stage/experts), moved
                apply_tp(module, tp_mesh=tp_mesh)
        for name, module in self.modules.items():
            apply_recompute(module, plan.modules[name].recompute)
        shards = {}
        for name, module in sorted(self.modules.items()):
            ignored = None
            if name in self.ep:  # experts differ between the DP ranks: summed over their EDP group instead
                ignored = {p for pn, p in module.named_parameters() if is_expert_param(pn)}
            mode = plan.modules[name].data_parallel
            shards[name] = shard_module(name, module, self.grids[name].dp_mesh, mode, cfg.torch_dtype, ignored)
        self.data_parallel = DataParallelSteps(shards)
        self.optimizer = build_optimizer(self.modules, cfg)
        edges = {e.src: e for e in plan.edges}
        self.boundaries = {
            e: Boundary(edges[e], self.grids[e], self.grids[self.model.llm_name]) for e in self.model.encoder_names
        }
        # the dispatcher's per-sample costs: the plan's profiled ones, else timed here (orchestrator.dispatch_costs)
        calibration = None
        if cfg.calibrates:
            todo = modules_to_calibrate(plan)  # the same list on every rank: all of them take part, or none
            longest = {n: longest_sample(data, self.model, n) for n in self.model.modules}
            if todo:
                calibration = shared_calibration(self.model, cfg.torch_dtype, self.device, longest, todo)
            costed = [n for n in self.model.modules if n not in todo]
            warm_up(self.model, costed, cfg.torch_dtype, self.device, longest)  # the heap the calibration grew
        # The graph-aware 1F1B needs the encoders and the LLM on disjoint ranks (each island runs its own order).
        llm_ranks = set(llm_grid.ranks)
        disjoint = all(not set(self.grids[e].ranks) & llm_ranks for e in self.model.encoder_names)
        schedule = cfg.schedule or plan.schedule
        self.graph = schedule == "graph_1f1b" and disjoint and bool(self.model.encoder_names)
        self.orch = Orchestrator(
            plan, self.grids, cfg.balance, torch.finfo(cfg.torch_dtype).bits // 8, calibration, self.device
        )
        self.router = InputRouter(
            plan, self.grids, rank, world, self.device, balanced=self.orch.mode != Mode.NONE,
            at_destination=cfg.loads_at_destination(data.source is not None),
        )  # fmt: skip
        leader = {}
        for name in self.served:
            c = self.grids[name].coord(rank)
            leader[name] = c is not None and c.tp == 0 and c.cp == 0
        self._leader = leader

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
        future = self.orch.pending(upcoming.step)
        router, encoders = self.router, [n for n in self.served if n != self.model.llm_name]

        def wanted() -> dict[str, list[int]]:
            tables = future.result() if future is not None else None
            out = {}
            for name in encoders:
                if tables is not None:
                    out[name] = router.held(name, tables, origin=not router.at_destination)
                else:  # unbalanced: every sample where it starts
                    c = self.grids[name].coord(self.rank)
                    assert c is not None
                    out[name] = [i for i in range(upcoming.size) if initial_dp_index(i, self.grids[name].dp) == c.dp]
            return out

        self.prefetcher.start(upcoming, wanted)
        self._upcoming = upcoming

    def inputs(self, name: str, work: StepWork) -> list[Sample]:
        return self.router.inputs(name, work.batch, work.tables, self.cfg.torch_dtype, serves=name in self.modules)

    def count_encoder(self, counter: TokenCounter, name: str, samples: list[Sample]) -> None:
        """The token count of an encoder: its tokens per sample (input rows / frames per token)."""
        fpt = self.model.modality(name).frames_per_token
        counter.add(name, {s.id: s.feats[name].shape[0] // fpt for s in samples})

    def step(self, k: int) -> StepMetrics:
        from orch.runtime.train.schedules.graph_1f1b import run_graph_1f1b
        from orch.runtime.train.schedules.three_phase import run_three_phase

        t0 = time.perf_counter()
        self.debug.inject(self.rank, k)
        upcoming_now = self._upcoming
        if upcoming_now is not None and upcoming_now.step == self.cfg.data_step(k):
            batch = upcoming_now  # its samples decoded meanwhile (runtime/data/prefetch.py)
        else:
            batch = self.batches.build(self.cfg.data_step(k))
        self._upcoming = None
        load_wait = self.prefetcher.wait(batch.step)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

        # This step's tables (prefetched during the last step), then announce the next step's.
        t = time.perf_counter()
        tables = self.orch.tables(batch, self.rank, self.world)
        if k + 1 < self.cfg.steps:
            upcoming = self.batches.build(self.cfg.data_step(k + 1))
            self.orch.prefetch(upcoming, self.rank, self.world)
            if isinstance(upcoming, ConversationBatch):
                self._prefetch_samples(upcoming)
        work = StepWork(batch, tables, self.debug.counter(self._leader))
        work.phases["dispatch"] = time.perf_counter() - t
        if isinstance(batch, ConversationBatch):
            work.phases["load"] = load_wait  # waiting for this step's samples to be decoded (0: hidden)

        t = time.perf_counter()
        self.data_parallel.begin()  # every module's parameters gathered once for the step
        work.phases["gather"] = time.perf_counter() - t
        with measured_step(self.device, parameter_storages(self.modules)) as meter:
            loss_sum = (run_graph_1f1b if self.graph else run_three_phase)(self, work)
        gathered = self.data_parallel.gathered_bytes()
        t = time.perf_counter()
        self.data_parallel.finish()
        work.spans.append(("data_parallel", "grad_sync", t, time.perf_counter()))
        sync_expert_grads(self.modules, self.ep, self.cp, work.spans)
        work.phases["grad_sync"] = time.perf_counter() - t
        t = time.perf_counter()
        if self.debug.dump_dir is not None and k == 0:
            self._dump("grads", lambda p: p.grad)
        grad_norm = global_grad_norm(self.modules, self.grids, self.ep, self.rank, self.device)
        if self.cfg.clip_norm > 0:
            clip_grads(self.modules, grad_norm, self.cfg.clip_norm)
        lr = 0.0
        if self.optimizer is not None:
            lr = set_lr(self.optimizer, self.cfg, k)
            self.optimizer.step()
            work.spans.append(("optimizer", "optimizer", t, time.perf_counter()))
        work.phases["optimizer"] = time.perf_counter() - t

        state = state_parts(self.modules, self.optimizer)
        memory = {"state_bytes": sum(state.values()), "peak_bytes": peak_bytes(self.device, meter, state, gathered)}
        loss_total = self._global_loss(loss_sum)
        balance = {"mode": self.orch.mode.value, **self.orch.record(tables, batch, self.router.at_destination)}
        return StepMetrics(
            k,
            loss_total,
            batch.label_tokens,
            time.perf_counter() - t0,
            work.phases,
            work.spans,
            balance,
            work.counter.processed,
            grad_norm,
            lr_at(self.cfg, k) if self.optimizer is None else lr,
            memory,
            batch.data_counts() if isinstance(batch, ConversationBatch) else None,
        )

    def run_llm(
        self,
        work: StepWork,
        texts: dict[int, Sample],
        encoder_rows: Callable[[MicroBatch], dict[str, list[torch.Tensor]]],
        after_backward: Callable[[MicroBatch], None] | None = None,
    ) -> torch.Tensor:
        """This rank's LLM stage over its micro-batches (1F1B); `encoder_rows` gives the first stage each
        micro-batch's encoder rows per sample, `after_backward` runs after each B (PipelineStage.run).
        Returns the summed loss (last stage; zero elsewhere)."""
        assert self.stage is not None
        batch, llm_name = work.batch, self.model.llm_name
        micro = self.router.micro_batches(llm_name, self.router.held(llm_name, work.tables), batch)

        def first_inputs(mb: MicroBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            per_encoder = encoder_rows(mb)
            order, width, dtype = encoder_order(self.model), self.model.llm.hidden, self.cfg.torch_dtype
            prefixes = [
                join_prefix([per_encoder[e][j] for e in order], width, dtype, self.device) for j in range(len(mb.ids))
            ]
            work.counter.add(llm_name, dict(zip(mb.ids, mb.seqlens, strict=True)))
            return prefixes, [texts[i].text for i in mb.ids]

        def loss_of(mb: MicroBatch, logits: torch.Tensor, shard: CPShard | None) -> torch.Tensor:
            labels = [texts[i].labels for i in mb.ids]
            layouts = list(mb.layouts)
            # the scored positions' labels (under CP, of this rank's positions only)
            labels = shard.scored_labels(labels, layouts) if shard is not None else scored_labels(labels, layouts)
            empty = torch.zeros(0, dtype=torch.int64, device=logits.device)
            return label_loss(logits, torch.cat(labels or [empty]), batch.label_tokens)

        run = self.stage.run(micro, first_inputs, loss_of, after_backward)
        work.spans += [(llm_name, op, a, b) for op, a, b in run.spans]
        return run.loss_sum

    def _global_loss(self, loss_sum: torch.Tensor) -> float:
        """Sum of the LLM's TP-0 ranks' partial losses (TP replicas hold copies, counted once; CP ranks hold parts)."""
        c = self.grids[self.model.llm_name].coord(self.rank)
        mine = loss_sum if c is not None and c.tp == 0 else torch.zeros_like(loss_sum)
        dist.all_reduce(mine)
        return float(mine.item())

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
                full = value.full_tensor() if hasattr(value, "full_tensor") else value
                # Under EP the first EP group's ranks (dp < ep) hold the experts between them.
                writer = c.dp < self.ep[name].ep if name in self.ep and is_expert_param(pname) else c.dp == 0
                if writer and c.tp == 0 and c.cp == 0:
                    out[f"{name}.{pname}"] = full.detach().cpu().clone()  # readable on any machine
        assert self.debug.dump_dir is not None
        write_dump(self.debug.dump_dir, what, self.rank, out)

    def finish(self) -> None:
        self.orch.close()
        self.prefetcher.close()
        if self.debug.dump_dir is not None:
            self._dump("params", lambda p: p.data if not hasattr(p, "full_tensor") else p)
