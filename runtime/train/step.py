"""Run a Plan on torch.distributed: each rank builds the modules it serves and runs the schedule.

One step of a homogeneous or colocated plan (the three-phase schedule; a disaggregated plan runs
the graph-aware 1F1B below instead):

1. encoder forwards of the whole step, then one boundary move per edge (encoder -> LLM layout);
2. the LLM over its micro-batches, forward and backward, into detached boundary leaves;
3. boundary backward (inverse move) and encoder backwards, one edge at a time in model order;

then gradient sync (sum over each module's DP group; the loss is already divided by the global
label-token count) and an optimizer step per module.

Post-balancing (`RunConfig.balance`, runtime/train/orchestrator.py): before phase 1 the orchestrator
gives this step's tables (prefetched on a CPU thread during the previous step); each encoder's
input features move from their origin to the encoder's balanced DP index (one all_to_all_single
per encoder), the text tokens move to the LLM's balanced DP index, and the boundary move uses the
composed table Π_llm ∘ B ∘ Π_enc⁻¹. With `balance="none"` nothing moves before phase 1 and the
boundary table is the unbalanced one: exactly the step without the orchestrator.

Pipeline parallelism (LLM only, runtime/parallel/pipeline.py): phase 2 is the stage's 1F1B order; the
boundary delivers encoder outputs to the first stage, the LLM's token ids go to the first stage
and its labels to the last. With pp == 1 the same code runs one stage (F0 B0 F1 B1 ...).
A disaggregated plan whose schedule is graph_1f1b runs `_graph_phases` instead: the encoder
islands are one more pipeline stage in front of the LLM's first (its docstring).

Context parallelism (runtime/parallel/context.py): a module with cp > 1 gets its inputs
replicated over each DP index's (cp, tp) ranks and shards every micro-batch's sequences over
its CP group inside the model; gradients are then summed over the flattened (dp, cp) group and
the loss over every TP-0 rank.

Expert parallelism (runtime/parallel/expert.py): the LLM's MoE experts are split over EP groups
of consecutive DP indices; tokens reach their experts by all_to_all inside each MoE layer, so
every rank of an EP group runs every micro-batch, empty ones included.

Device (runtime/device.py): `Executor.device` is this rank's device (`cuda:{local_rank}` under
NCCL, else the CPU under gloo). Parameters move there after initialisation (before TP sharding),
samples are generated on the CPU from the seed and then moved, and every buffer, leaf and tensor
handed to a collective is created there. The planner's tables and split sizes stay on the CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn

from orch.planner.balance.batch import Mode
from orch.planner.errors import OrchError
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.planner.trace import one_f_one_b_order
from orch.runtime.data.synthetic import GlobalBatch, Sample, encoder_order
from orch.runtime.models.factory import build_from_factory
from orch.runtime.models.reference import AUDIO_STEM_STRIDE, LLM, build_model, encoder_modality
from orch.runtime.parallel.boundary import Boundary
from orch.runtime.parallel.context import CPShard, cp_group
from orch.runtime.parallel.expert import build_expert_parallel, is_expert_param, unsupported_ep
from orch.runtime.parallel.grid import Grid, build_grids, build_meshes
from orch.runtime.parallel.pipeline import MicroBatch, PipelineStage
from orch.runtime.parallel.tensor import apply_tp
from orch.runtime.parallel.transport import P2P, Route, move
from orch.runtime.train.compute import build_optimizer, encode, label_loss
from orch.runtime.train.orchestrator import Orchestrator, StepTables, longest_sample, shared_calibration


@dataclass(frozen=True)
class RunConfig:
    steps: int = 1
    seed: int = 0
    dtype: str = "float32"
    optimizer: str = "sgd"
    lr: float = 0.1
    dump_dir: str | None = None  # write rank-local grads (step 0) and final params here (tests)
    fail_at: tuple[int, int] | None = None  # (rank, step) that raises: fault injection for launcher tests
    # (rank, step, MiB): that rank allocates and touches MiB of memory at that step and holds it (fault injection:
    # an out-of-memory; `inject_oom`)
    oom_at: tuple[int, int, int] | None = None
    trace: str | None = None  # write a Chrome trace of the measured phases here (runtime/train/trace.py)
    checkpoint_every: int = 0  # save a checkpoint every this many steps (0: never; runtime/checkpoint.py)
    resume: bool = True  # continue from the newest complete checkpoint of the workdir, if any
    balance: str = "none"  # post-balancing mode: orch | paper | lpt | none (runtime/train/orchestrator.py)
    count_tokens: bool = False  # record tokens per sample and phase (StepMetrics.processed; tests)
    # time the modules at startup for the dispatcher's cost model (orchestrator.calibrate_module);
    # None: when balancing (a `none` run's cost statistics then use the FLOP model alone)
    calibrate: bool | None = None
    # "three_phase" runs a disaggregated plan's islands one after the other instead of its graph-aware
    # 1F1B (benchmarks compare the two); None: the plan's schedule
    schedule: str | None = None
    model_factory: str | None = None  # "package.module:function" building the modules (runtime/models/factory.py)
    # "auto" | "cpu" | "cuda": where the ranks compute (runtime/device.py; run_local resolves "auto" before starting)
    device: str = "auto"

    @property
    def torch_dtype(self) -> torch.dtype:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[self.dtype]


@dataclass
class StepMetrics:
    step: int
    loss: float
    tokens: int
    step_time_s: float
    phases: dict[str, float] = field(default_factory=dict)
    spans: list[tuple[str, str, float, float]] = field(
        default_factory=list
    )  # (module, phase, start, end), perf_counter
    balance: dict[str, object] = field(default_factory=dict)  # per phase costs and bytes, dispatcher seconds
    processed: dict[str, dict[int, int]] = field(default_factory=dict)  # module -> sample id -> tokens (DP leaders)


T = TypeVar("T")


def inject_oom(mib: int, chunk_mib: int = 64, pause_s: float = 0.02) -> None:
    """Fault injection: allocate `mib` MiB the way a rank that runs out of memory does; never returns normally.

    A request larger than this machine's memory is one allocation, which the allocator refuses at once (a
    RuntimeError from torch's CPU allocator, as a CUDA out-of-memory is refused by the caching allocator): the
    in-rank path. A smaller one is touched chunk by chunk, so that a memory limit enforced from outside (Slurm's
    --mem) sees the resident size grow and kills the rank. If nothing stopped it, it raises an error that is not
    an out-of-memory, so a test expecting one fails.
    """
    total = mib << 20
    if total > _physical_memory():
        big = torch.empty(total, dtype=torch.uint8)  # raises: more than the machine has
        del big
        raise RuntimeError(f"fault injection: allocating {mib} MiB succeeded (memory overcommit?)")
    held = []
    while total > 0:
        n = min(chunk_mib << 20, total)
        held.append(torch.ones(n, dtype=torch.uint8))  # ones: the pages are touched, so they are resident
        total -= n
        time.sleep(pause_s)
    raise RuntimeError(f"fault injection: {mib} MiB allocated and no memory limit stopped this rank")


def _physical_memory() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class UnsupportedPlan(OrchError):
    pass


def check_supported(plan: Plan) -> None:
    """Raise UnsupportedPlan for what this executor cannot run yet (before any process starts)."""
    for name, mp in plan.modules.items():
        if mp.layout.pp > 1 and name != plan.model.llm_name:
            raise UnsupportedPlan(f"modules.{name}.layout.pp: {mp.layout.pp}: only the LLM runs pipeline stages")
        layers = plan.model.modules[name].layers
        if mp.layout.pp > layers:
            raise UnsupportedPlan(f"modules.{name}.layout.pp: {mp.layout.pp} stages for {layers} layers")
        why = unsupported_ep(name, mp, plan.model.modules[name].experts, name == plan.model.llm_name)
        if why is not None:
            raise UnsupportedPlan(why)
    for e in plan.model.encoder_names:
        if not any(edge.src == e and edge.dst == plan.model.llm_name for edge in plan.edges):
            raise UnsupportedPlan(f"edges: no edge from {e} to {plan.model.llm_name}")


class Executor:
    """One rank's share of a plan: its modules, their grids, boundaries and optimizer."""

    def __init__(
        self,
        plan: Plan,
        data: DataSpec,
        cfg: RunConfig,
        rank: int,
        world: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """`device`: this rank's device, matching the process group's backend (runtime/device.py `rank_device`)."""
        check_supported(plan)
        if world != plan.world_size:
            raise ValueError(f"plan needs {plan.world_size} ranks, launched with {world}")
        self.plan, self.data, self.cfg, self.rank, self.world = plan, data, cfg, rank, world
        self.device = torch.device(device)
        self.model = plan.model
        self.grids: dict[str, Grid] = build_grids(plan.modules, self.device.type)
        build_meshes(self.grids)
        self.served = [n for n in self.model.modules if self.grids[n].coord(rank) is not None]
        self.cp = {n: cp_group(self.grids[n], rank, self.device) for n in self.served}  # None without CP
        self.modules: dict[str, nn.Module] = (
            build_from_factory(cfg.model_factory, self.model, cfg.seed, cfg.torch_dtype, self.served)
            if cfg.model_factory
            else build_model(self.model, cfg.seed, cfg.torch_dtype, self.served)
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
            module.to(self.device)  # initialised on the CPU from the seed (and pruned to the stage/experts), then moved
            apply_tp(module, tp_mesh=self.grids[name].submesh("tp"))
        params = [p for m in self.modules.values() for p in m.parameters()]
        self.optimizer = build_optimizer(params, cfg.optimizer, cfg.lr) if params else None
        edges = {e.src: e for e in plan.edges}
        self.boundaries = {
            e: Boundary(edges[e], self.grids[e], self.grids[self.model.llm_name]) for e in self.model.encoder_names
        }
        calibrate = cfg.calibrate if cfg.calibrate is not None else Mode(cfg.balance) != Mode.NONE
        calibration = None
        if calibrate:
            longest = {n: longest_sample(data, self.model, n) for n in self.model.modules}
            calibration = shared_calibration(self.model, cfg.torch_dtype, self.device, longest)
        # The graph-aware 1F1B needs the encoders and the LLM on disjoint ranks (each island runs its own order).
        llm_ranks = set(llm_grid.ranks)
        disjoint = all(not set(self.grids[e].ranks) & llm_ranks for e in self.model.encoder_names)
        schedule = cfg.schedule or plan.schedule
        self.graph = schedule == "graph_1f1b" and disjoint and bool(self.model.encoder_names)
        self.orch = Orchestrator(
            plan, self.grids, cfg.balance, torch.finfo(cfg.torch_dtype).bits // 8, calibration, self.device
        )

    def _held(self, name: str, tables: StepTables, *, origin: bool = False) -> list[int]:
        c = self.grids[name].coord(self.rank)
        assert c is not None
        where = tables.origin[name] if origin else tables.dest[name]
        return [i for i, d in enumerate(where) if d == c.dp]

    def _inputs(self, name: str, batch: GlobalBatch, tables: StepTables, dtype: torch.dtype) -> list[Sample]:
        """The samples this rank runs for `name` (ascending ids), their inputs moved from their origin.

        Unbalanced: built locally (today's step). Balanced: every world rank joins one
        all_to_all_single per module (encoder features; the LLM's text and label ids).
        """
        serves = name in self.modules
        if self.orch.mode == Mode.NONE:
            return [batch.sample(i, dtype, self.device) for i in self._held(name, tables)] if serves else []
        grid, llm = self.grids[name], name == self.model.llm_name
        if llm:
            rows = batch.text_tokens
            width, pack_dtype = 2, torch.int64
        else:
            audio = encoder_modality(name, self.model.modules[name]) == "audio"
            rows = tuple(t[name] * (AUDIO_STEM_STRIDE if audio else 1) for t in batch.enc_tokens)
            width, pack_dtype = self.model.modules[name].input_dim or 1, dtype
        empty_x = torch.zeros(0, width, dtype=pack_dtype, device=self.device)
        # The LLM's token ids go to its first pipeline stage and its labels to its last: one move per stage.
        stages = sorted({0, grid.pp - 1}) if llm else [0]
        coord = grid.coord(self.rank)
        y = empty_x
        for stage in stages:
            x = empty_x
            if coord is not None and coord.pp == stage:
                here = [batch.sample(i, dtype, self.device) for i in self._held(name, tables, origin=True)]
                parts = [torch.stack([s.text, s.labels], 1) if llm else s.feats[name] for s in here]
                x = torch.cat(parts) if parts else x
            route = Route(tables.input_table(name), grid, grid, tuple(rows), src_stage=stage, dst_stage=stage)
            got = move(x, route, self.rank, self.world)
            if coord is not None and coord.pp == stage:
                y = got
        if not serves or (coord is not None and coord.pp not in stages):
            return []
        ids = self._held(name, tables)
        empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        out = []
        for i, part in zip(ids, y.split([rows[i] for i in ids]), strict=True):
            out.append(Sample(i, {}, part[:, 0], part[:, 1]) if llm else Sample(i, {name: part}, empty, empty))
        return out

    def _count(self, processed: dict[str, dict[int, int]], name: str, counts: dict[int, int]) -> None:
        """Token-count hook: tokens each sample brought into `name` on this rank (DP leaders only)."""
        c = self.grids[name].coord(self.rank)
        if self.cfg.count_tokens and c is not None and c.tp == 0 and c.cp == 0:
            mine = processed.setdefault(name, {})
            for sid, n in counts.items():
                mine[sid] = mine.get(sid, 0) + n

    def _count_encoder(self, processed: dict[str, dict[int, int]], name: str, samples: list[Sample]) -> None:
        """The token-count hook for an encoder: its tokens per sample (audio: frames / stem stride)."""
        fpt = AUDIO_STEM_STRIDE if getattr(self.modules[name], "is_audio", False) else 1
        self._count(processed, name, {s.id: s.feats[name].shape[0] // fpt for s in samples})

    def _chunks(self, name: str, items: list[T]) -> list[list[T]]:
        n = min(self.plan.modules[name].num_micro_batches, max(1, len(items)))
        size = -(-len(items) // n) if items else 0
        chunks = [items[k : k + size] for k in range(0, len(items), size)] if items else [[]]
        if self.plan.modules[name].layout.ep > 1:  # EP all_to_alls: every rank runs num_micro_batches, empty or not
            chunks += [[] for _ in range(self.plan.modules[name].num_micro_batches - len(chunks))]
        return chunks

    def _micro_batches(self, name: str, ids: list[int], batch: GlobalBatch) -> list[MicroBatch]:
        """This DP index's LLM micro-batches (the same on every stage: from the global lengths)."""
        out = []
        keep_empty = self.plan.modules[name].layout.ep > 1  # EP: every rank runs every micro-batch
        for m, chunk in enumerate(c for c in self._chunks(name, ids) if c or keep_empty):
            projected = [sum(batch.projected(e, i) for e in encoder_order(self.model)) for i in chunk]
            text = [batch.text_tokens[i] for i in chunk]
            seqlens = tuple(p + n for p, n in zip(projected, text, strict=True))
            out.append(MicroBatch(m, tuple(chunk), seqlens, tuple(text)))
        return out

    def step(self, k: int) -> StepMetrics:
        t0 = time.perf_counter()
        if self.cfg.fail_at == (self.rank, k):
            raise RuntimeError(f"injected failure at step {k}")
        if self.cfg.oom_at is not None and self.cfg.oom_at[:2] == (self.rank, k):
            inject_oom(self.cfg.oom_at[2])
        phases: dict[str, float] = {}
        spans: list[tuple[str, str, float, float]] = []
        batch = GlobalBatch.build(self.model, self.data, self.cfg.seed, k)
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

        # Phase 0: this step's tables (prefetched during the last step), then announce the next step's.
        t = time.perf_counter()
        tables = self.orch.tables(batch, self.rank, self.world)
        if k + 1 < self.cfg.steps:
            self.orch.prefetch(GlobalBatch.build(self.model, self.data, self.cfg.seed, k + 1), self.rank, self.world)
        processed: dict[str, dict[int, int]] = {}
        phases["dispatch"] = time.perf_counter() - t

        schedule = self._graph_phases if self.graph else self._three_phases
        loss_sum = schedule(batch, tables, phases, spans, processed)
        t = time.perf_counter()
        self._sync_grads(spans)
        phases["grad_sync"] = time.perf_counter() - t
        t = time.perf_counter()
        if self.cfg.dump_dir is not None and k == 0:
            self._dump("grads", lambda p: p.grad)
        if self.optimizer is not None:
            self.optimizer.step()
            spans.append(("optimizer", "optimizer", t, time.perf_counter()))
        phases["optimizer"] = time.perf_counter() - t

        loss_total = self._global_loss(loss_sum)
        balance = {"mode": self.orch.mode.value, **self.orch.record(tables, batch)}
        return StepMetrics(
            k, loss_total, batch.label_tokens, time.perf_counter() - t0, phases, spans, balance, processed
        )

    def _run_llm(
        self,
        batch: GlobalBatch,
        tables: StepTables,
        texts: dict[int, Sample],
        encoder_rows: Callable[[MicroBatch], dict[str, list[torch.Tensor]]],
        spans: list[tuple[str, str, float, float]],
        processed: dict[str, dict[int, int]],
        after_backward: Callable[[MicroBatch], None] | None = None,
    ) -> torch.Tensor:
        """This rank's LLM stage over its micro-batches (1F1B); `encoder_rows` gives the first stage each
        micro-batch's encoder rows per sample, `after_backward` runs after each B (PipelineStage.run).
        Returns the summed loss (last stage; zero elsewhere)."""
        assert self.stage is not None
        llm_name = self.model.llm_name
        micro = self._micro_batches(llm_name, self._held(llm_name, tables), batch)

        def first_inputs(mb: MicroBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            per_encoder = encoder_rows(mb)
            prefixes = [torch.cat([per_encoder[e][j] for e in encoder_order(self.model)]) for j in range(len(mb.ids))]
            self._count(processed, llm_name, dict(zip(mb.ids, mb.seqlens, strict=True)))
            return prefixes, [texts[i].text for i in mb.ids]

        def loss_of(mb: MicroBatch, logits: torch.Tensor, shard: CPShard | None) -> torch.Tensor:
            labels = [texts[i].labels for i in mb.ids]
            if shard is not None:  # this CP rank's text positions only
                prefix = [n - t for n, t in zip(mb.seqlens, mb.text_lens, strict=True)]
                labels = [y[shard.text_index(j, p)] for j, (y, p) in enumerate(zip(labels, prefix, strict=True))]
            empty = torch.zeros(0, dtype=torch.int64, device=logits.device)
            return label_loss(logits, torch.cat(labels or [empty]), batch.label_tokens)

        run = self.stage.run(micro, first_inputs, loss_of, after_backward)
        spans += [(llm_name, op, a, b) for op, a, b in run.spans]
        return run.loss_sum

    def _graph_phases(
        self,
        batch: GlobalBatch,
        tables: StepTables,
        phases: dict[str, float],
        spans: list[tuple[str, str, float, float]],
        processed: dict[str, dict[int, int]],
    ) -> torch.Tensor:
        """The graph-aware 1F1B of a disaggregated plan: the encoder islands are one more pipeline stage.

        Encoder work is cut into the LLM's micro-batches (micro-batch m of every LLM DP index at once).
        An encoder island runs the first stage's order of a (pp + 1)-stage 1F1B: forward of chunk m,
        then its rows go point to point to the LLM's first stage (`transport.P2P`, tag per edge and
        micro-batch), which takes them as its F(m) starts; the boundary gradient of m comes back when
        the LLM's first stage has run B(m), and the encoder backward of m follows. So the encoders of
        m + 1 run while the LLM computes m, and neither island waits for the other's whole step.
        """
        dtype, llm_name, width = self.cfg.torch_dtype, self.model.llm_name, self.model.llm.hidden
        balanced = self.orch.mode != Mode.NONE
        encs = encoder_order(self.model)
        t = time.perf_counter()
        inputs = {e: self._inputs(e, batch, tables, dtype) for e in encs}  # world collectives first, same order
        texts = {s.id: s for s in self._inputs(llm_name, batch, tables, dtype)}
        phases["route"] = time.perf_counter() - t
        micro_of: dict[int, int] = {}
        llm_dp = self.grids[llm_name].dp
        for j in range(llm_dp):
            for mb in self._micro_batches(llm_name, tables.held(llm_name, j), batch):
                micro_of.update(dict.fromkeys(mb.ids, mb.index))
        count = max(len(self._micro_batches(llm_name, tables.held(llm_name, j), batch)) for j in range(llm_dp))
        members = [frozenset(i for i, m in micro_of.items() if m == k) for k in range(count)]
        table = {e: tables.boundary_table(e) if balanced else None for e in encs}
        pending: list[Any] = []

        def p2p(e: str, m: int) -> P2P:
            return P2P(tag=2 * (encs.index(e) * count + m), pending=pending)

        t = time.perf_counter()
        if self.stage is not None:
            # The moved rows enter the LLM as leaves; after B(m) their gradients go back edge by edge in
            # reversed encoder order, the order the encoder islands receive them (NCCL has no tags).
            arrived: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}

            def encoder_rows(mb: MicroBatch) -> dict[str, list[torch.Tensor]]:
                out = {}
                for e in encs:
                    leaf = torch.zeros(0, width, dtype=dtype, device=self.device, requires_grad=True)
                    got = self.boundaries[e].forward(
                        leaf, batch, self.rank, self.world, table[e], only=members[mb.index], p2p=p2p(e, mb.index)
                    )
                    rows = got.detach().requires_grad_()
                    arrived[(e, mb.index)] = (got, rows)
                    out[e] = list(rows.split([batch.projected(e, i) for i in mb.ids]))
                return out

            def send_back(mb: MicroBatch) -> None:
                for e in reversed(encs):
                    got, rows = arrived.pop((e, mb.index), (None, None))
                    if got is not None and rows is not None:
                        torch.autograd.backward(got, rows.grad if rows.grad is not None else torch.zeros_like(rows))

            loss_sum = self._run_llm(batch, tables, texts, encoder_rows, spans, processed, send_back)
            phases[f"{llm_name}.fwd_bwd"] = time.perf_counter() - t
        else:
            loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
            served = [e for e in encs if e in self.modules]
            moved: dict[tuple[str, int], torch.Tensor] = {}
            for kind, m in one_f_one_b_order(self.grids[llm_name].pp + 1, count)[0]:
                for e in served if kind == "F" else reversed(served):
                    t_op = time.perf_counter()
                    if kind == "F":
                        chunk = [s for s in inputs[e] if micro_of[s.id] == m]
                        self._count_encoder(processed, e, chunk)
                        out = encode(self.modules[e], e, chunk, dtype, self.cp[e])
                        moved[(e, m)] = self.boundaries[e].forward(
                            out, batch, self.rank, self.world, table[e], only=members[m], p2p=p2p(e, m)
                        )
                    else:
                        done = moved.pop((e, m))
                        torch.autograd.backward(done, torch.zeros_like(done))
                    now = time.perf_counter()
                    key = f"{e}.fwd" if kind == "F" else f"{e}.bwd"
                    phases[key] = phases.get(key, 0.0) + now - t_op
                    spans.append((e, f"{kind}{m}", t_op, now))
        for work in pending:
            work.wait()
        return loss_sum

    def _three_phases(
        self,
        batch: GlobalBatch,
        tables: StepTables,
        phases: dict[str, float],
        spans: list[tuple[str, str, float, float]],
        processed: dict[str, dict[int, int]],
    ) -> torch.Tensor:
        """Encoder forwards of the whole step, the LLM's 1F1B, encoder backwards (module docstring)."""
        dtype, llm_name, width = self.cfg.torch_dtype, self.model.llm_name, self.model.llm.hidden
        balanced = self.orch.mode != Mode.NONE
        t = time.perf_counter()
        # Phase 1: encoder forwards (inputs moved to their balanced ranks), then the boundary moves.
        moved: dict[str, torch.Tensor] = {}
        outs: dict[str, torch.Tensor] = {}
        for e in encoder_order(self.model):
            samples = self._inputs(e, batch, tables, dtype)
            now = time.perf_counter()
            phases[f"{e}.route"] = now - t
            t = now
            if e in self.modules:
                self._count_encoder(processed, e, samples)
                out = torch.cat([encode(self.modules[e], e, c, dtype, self.cp[e]) for c in self._chunks(e, samples)])
            else:
                out = torch.zeros(0, width, dtype=dtype, device=self.device)
            outs[e] = out
            now = time.perf_counter()
            phases[f"{e}.fwd"] = now - t
            if e in self.modules:
                spans.append((e, "forward", t, now))
            t = now
            table = tables.boundary_table(e) if balanced else None
            moved[e] = self.boundaries[e].forward(out, batch, self.rank, self.world, table)
            now = time.perf_counter()
            phases[f"{e}.boundary"] = now - t
            spans.append((e, "boundary", t, now))
            t = now

        # Phase 2: the LLM's 1F1B over micro-batches (one stage when pp == 1); boundary activations
        # are leaves on the first stage that collect the gradients.
        leaves = {e: moved[e].detach().requires_grad_() for e in moved}
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        texts = {s.id: s for s in self._inputs(llm_name, batch, tables, dtype)}
        now = time.perf_counter()
        phases[f"{llm_name}.route"] = now - t
        t = now
        if self.stage is not None:
            ids = self._held(llm_name, tables)
            rows: dict[str, tuple[torch.Tensor, ...]] = {}
            if self.stage.is_first:
                rows = {e: leaves[e].split([batch.projected(e, i) for i in ids]) for e in leaves}
            pos = {sid: j for j, sid in enumerate(ids)}

            def encoder_rows(mb: MicroBatch) -> dict[str, list[torch.Tensor]]:
                return {e: [rows[e][pos[i]] for i in mb.ids] for e in rows}

            loss_sum += self._run_llm(batch, tables, texts, encoder_rows, spans, processed)
        phases[f"{llm_name}.fwd_bwd"] = time.perf_counter() - t
        t = time.perf_counter()

        # Phase 3: boundary backwards and encoder backwards, one edge at a time (a fixed collective order).
        # A hook on the encoder output marks where the boundary backward ends and the encoder's begins.
        for e in reversed(encoder_order(self.model)):
            t_e = time.perf_counter()
            arrived = [t_e]
            if outs[e].requires_grad:
                outs[e].register_hook(lambda g, a=arrived: a.__setitem__(0, time.perf_counter()))
            grad = leaves[e].grad if leaves[e].grad is not None else torch.zeros_like(leaves[e])
            torch.autograd.backward(moved[e], grad)
            now = time.perf_counter()
            phases[f"{e}.boundary_bwd"] = arrived[0] - t_e
            phases[f"{e}.bwd"] = now - arrived[0]
            spans.append((e, "backward", t_e, now))
        phases["encoders.bwd"] = time.perf_counter() - t
        t = time.perf_counter()

        return loss_sum

    def _sync_grads(self, spans: list[tuple[str, str, float, float]]) -> None:
        """Sum each module's gradients over its DP group (no averaging: the loss is globally normalised).

        With CP every rank's gradients are partial (its positions only): the sum is over the
        flattened (dp, cp) group instead.

        Coalesced: per module, the rank-local gradients (TP shards as they are) are flattened into one
        buffer per dtype, summed by one all_reduce over the module's DP group, and copied back (under
        EP, the local experts' gradients form their own buffer, summed over the EDP group). Gloo
        sums element by element whatever the buffer, so this is the per-parameter sum at a fraction
        of the collectives (one per module and dtype instead of one per parameter tensor).
        """
        for name, module in self.modules.items():
            t = time.perf_counter()
            grid = self.grids[name]
            dp_group = grid.submesh("dp").get_group() if grid.dp > 1 else None
            if grid.cp > 1:
                dp_group = grid.flat_group("dp", "cp")
            ep = self.ep.get(name)
            buckets: dict[tuple[bool, torch.dtype], list[torch.Tensor]] = {}
            for pname, p in module.named_parameters():
                if p.grad is None:  # no tokens of this modality on this rank
                    p.grad = torch.zeros_like(p)
                local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                buckets.setdefault((ep is not None and is_expert_param(pname), local.dtype), []).append(local)
            # Under EP, expert gradients (local experts only) sum over the expert-data-parallel group.
            # Under CP the local experts' gradients are partial over the CP group too (each CP rank
            # routes its own positions' tokens inside its EP group): summed there after the EDP sum.
            cp = self.cp.get(name)
            for (expert, _), grads in buckets.items():
                groups = [ep.edp_group, cp.group if cp is not None else None] if ep and expert else [dp_group]
                for group in (g for g in groups if g is not None):
                    flat = torch.cat([g.reshape(-1) for g in grads])
                    dist.all_reduce(flat, group=group)
                    for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                        g.copy_(part.view_as(g))
            spans.append((name, "grad_sync", t, time.perf_counter()))

    def _global_loss(self, loss_sum: torch.Tensor) -> float:
        """Sum of the LLM's TP-0 ranks' partial losses (TP replicas hold copies, counted once; CP ranks hold parts)."""
        c = self.grids[self.model.llm_name].coord(self.rank)
        mine = loss_sum if c is not None and c.tp == 0 else torch.zeros_like(loss_sum)
        dist.all_reduce(mine)
        return float(mine.item())

    def _dump(self, what: str, get: object) -> None:
        """Full tensors of every served module, written by its (dp 0, cp 0, tp 0) rank; all TP ranks join the gather."""
        out: dict[str, torch.Tensor] = {}
        for name in sorted(self.modules):
            c = self.grids[name].coord(self.rank)
            assert c is not None
            for pname, p in self.modules[name].named_parameters():
                value = get(p)  # type: ignore[operator]
                full = value.full_tensor() if hasattr(value, "full_tensor") else value
                # Under EP the first EP group's ranks (dp < ep) hold the experts between them.
                writer = c.dp < self.ep[name].ep if name in self.ep and is_expert_param(pname) else c.dp == 0
                if writer and c.tp == 0 and c.cp == 0:
                    out[f"{name}.{pname}"] = full.detach().cpu().clone()  # readable on any machine
        assert self.cfg.dump_dir is not None
        torch.save(out, Path(self.cfg.dump_dir) / f"{what}.rank{self.rank}.pt")

    def finish(self) -> None:
        self.orch.close()
        if self.cfg.dump_dir is not None:
            self._dump("params", lambda p: p.data if not hasattr(p, "full_tensor") else p)
