"""Run a Plan on torch.distributed: each rank builds the modules it serves and runs the schedule.

One step, every placement (the colocated three-phase schedule; a disaggregated plan runs the
same phases, each island idle in the other's):

1. encoder forwards of the whole step, then one boundary move per edge (encoder -> LLM layout);
2. the LLM over its micro-batches, forward and backward, into detached boundary leaves;
3. boundary backward (inverse move) and encoder backwards, one edge at a time in model order;

then gradient sync (sum over each module's DP group; the loss is already divided by the global
label-token count) and an optimizer step per module.

Post-balancing (`RunConfig.balance`, runtime/orchestrator.py): before phase 1 the orchestrator
gives this step's tables (prefetched on a CPU thread during the previous step); each encoder's
input features move from their origin to the encoder's balanced DP index (one all_to_all_single
per encoder), the text tokens move to the LLM's balanced DP index, and the boundary move uses the
composed table Π_llm ∘ B ∘ Π_enc⁻¹. With `balance="none"` nothing moves before phase 1 and the
boundary table is the unbalanced one: exactly the step without the orchestrator.
Context parallelism (runtime/context_parallel.py): a module with cp > 1 gets its inputs
replicated over each DP index's (cp, tp) ranks and shards every micro-batch's sequences over
its CP group inside the model; gradients are then summed over the flattened (dp, cp) group and
the loss over every TP-0 rank.
TODO(runtime): PP, EP, graph-aware 1F1B for disaggregated plans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from orch.planner.balance.batch import Mode
from orch.planner.errors import OrchError
from orch.planner.plan import Plan
from orch.planner.specs import DataSpec
from orch.runtime.boundary import Boundary
from orch.runtime.compute import build_optimizer, encode, text_loss
from orch.runtime.context_parallel import cp_group
from orch.runtime.data import GlobalBatch, Sample, encoder_order
from orch.runtime.grid import Grid, build_grids, build_meshes
from orch.runtime.model import AUDIO_STEM_STRIDE, build_model, encoder_modality
from orch.runtime.orchestrator import Orchestrator, StepTables, shared_calibration
from orch.runtime.parallelize import apply_tp
from orch.runtime.transport import Route, move


@dataclass(frozen=True)
class RunConfig:
    steps: int = 1
    seed: int = 0
    dtype: str = "float32"
    optimizer: str = "sgd"
    lr: float = 0.1
    dump_dir: str | None = None  # write rank-local grads (step 0) and final params here (tests)
    fail_at: tuple[int, int] | None = None  # (rank, step) that raises: fault injection for launcher tests
    trace: str | None = None  # write a Chrome trace of the measured phases here (runtime/trace.py)
    checkpoint_every: int = 0  # save a checkpoint every this many steps (0: never; runtime/checkpoint.py)
    resume: bool = True  # continue from the newest complete checkpoint of the workdir, if any
    balance: str = "none"  # post-balancing mode: orch | paper | lpt | none (runtime/orchestrator.py)
    count_tokens: bool = False  # record tokens per sample and phase (StepMetrics.processed; tests)
    # time the modules at startup for the dispatcher's cost model (orchestrator.calibrate_module);
    # None: when balancing (a `none` run's cost statistics then use the FLOP model alone)
    calibrate: bool | None = None

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


class UnsupportedPlan(OrchError):
    pass


def check_supported(plan: Plan) -> None:
    """Raise UnsupportedPlan for what this executor cannot run yet (before any process starts)."""
    for name, mp in plan.modules.items():
        for axis in ("pp", "ep"):
            if mp.layout.degree(axis) > 1:
                raise UnsupportedPlan(f"modules.{name}.layout.{axis}: {mp.layout.degree(axis)} is not executed yet")
    for e in plan.model.encoder_names:
        if not any(edge.src == e and edge.dst == plan.model.llm_name for edge in plan.edges):
            raise UnsupportedPlan(f"edges: no edge from {e} to {plan.model.llm_name}")


class Executor:
    """One rank's share of a plan: its modules, their grids, boundaries and optimizer."""

    def __init__(self, plan: Plan, data: DataSpec, cfg: RunConfig, rank: int, world: int) -> None:
        check_supported(plan)
        if world != plan.world_size:
            raise ValueError(f"plan needs {plan.world_size} ranks, launched with {world}")
        self.plan, self.data, self.cfg, self.rank, self.world = plan, data, cfg, rank, world
        self.model = plan.model
        self.grids: dict[str, Grid] = build_grids(plan.modules)
        build_meshes(self.grids)
        self.served = [n for n in self.model.modules if self.grids[n].coord(rank) is not None]
        self.cp = {n: cp_group(self.grids[n], rank) for n in self.served}  # None without CP
        self.modules: dict[str, nn.Module] = build_model(self.model, cfg.seed, cfg.torch_dtype, self.served)
        for name, module in self.modules.items():
            apply_tp(module, tp_mesh=self.grids[name].submesh("tp"))
        params = [p for m in self.modules.values() for p in m.parameters()]
        self.optimizer = build_optimizer(params, cfg.optimizer, cfg.lr) if params else None
        edges = {e.src: e for e in plan.edges}
        self.boundaries = {
            e: Boundary(edges[e], self.grids[e], self.grids[self.model.llm_name]) for e in self.model.encoder_names
        }
        calibrate = cfg.calibrate if cfg.calibrate is not None else Mode(cfg.balance) != Mode.NONE
        calibration = shared_calibration(self.model, cfg.torch_dtype, rank) if calibrate else None
        self.orch = Orchestrator(plan, self.grids, cfg.balance, torch.finfo(cfg.torch_dtype).bits // 8, calibration)

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
            return [batch.sample(i, dtype) for i in self._held(name, tables)] if serves else []
        grid, llm = self.grids[name], name == self.model.llm_name
        if llm:
            rows = batch.text_tokens
            width, pack_dtype = 2, torch.int64
        else:
            audio = encoder_modality(name, self.model.modules[name]) == "audio"
            rows = tuple(t[name] * (AUDIO_STEM_STRIDE if audio else 1) for t in batch.enc_tokens)
            width, pack_dtype = self.model.modules[name].input_dim or 1, dtype
        x = torch.zeros(0, width, dtype=pack_dtype)
        if serves:
            here = [batch.sample(i, dtype) for i in self._held(name, tables, origin=True)]
            parts = [torch.stack([s.text, s.labels], 1) if llm else s.feats[name] for s in here]
            x = torch.cat(parts) if parts else x
        y = move(x, Route(tables.input_table(name), grid, grid, tuple(rows)), self.rank, self.world)
        if not serves:
            return []
        ids = self._held(name, tables)
        empty = torch.zeros(0, dtype=torch.int64)
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

    def _chunks(self, name: str, items: list[Sample]) -> list[list[Sample]]:
        n = min(self.plan.modules[name].num_micro_batches, max(1, len(items)))
        size = -(-len(items) // n) if items else 0
        return [items[k : k + size] for k in range(0, len(items), size)] if items else [[]]

    def step(self, k: int) -> StepMetrics:
        t0 = time.perf_counter()
        if self.cfg.fail_at == (self.rank, k):
            raise RuntimeError(f"injected failure at step {k}")
        phases: dict[str, float] = {}
        spans: list[tuple[str, str, float, float]] = []
        dtype = self.cfg.torch_dtype
        batch = GlobalBatch.build(self.model, self.data, self.cfg.seed, k)
        llm_name = self.model.llm_name
        width = self.model.llm.hidden
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

        # Phase 0: this step's tables (prefetched during the last step), then announce the next step's.
        t = time.perf_counter()
        tables = self.orch.tables(batch, self.rank, self.world)
        if k + 1 < self.cfg.steps:
            self.orch.prefetch(GlobalBatch.build(self.model, self.data, self.cfg.seed, k + 1), self.rank, self.world)
        balanced = self.orch.mode != Mode.NONE
        processed: dict[str, dict[int, int]] = {}
        now = time.perf_counter()
        phases["dispatch"] = now - t
        t = now

        # Phase 1: encoder forwards (inputs moved to their balanced ranks), then the boundary moves.
        moved: dict[str, torch.Tensor] = {}
        outs: dict[str, torch.Tensor] = {}
        for e in encoder_order(self.model):
            samples = self._inputs(e, batch, tables, dtype)
            now = time.perf_counter()
            phases[f"{e}.route"] = now - t
            t = now
            if e in self.modules:
                fpt = 2 if getattr(self.modules[e], "is_audio", False) else 1
                self._count(processed, e, {s.id: s.feats[e].shape[0] // fpt for s in samples})
                out = torch.cat([encode(self.modules[e], e, c, dtype, self.cp[e]) for c in self._chunks(e, samples)])
            else:
                out = torch.zeros(0, width, dtype=dtype)
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

        # Phase 2: the LLM over micro-batches; boundary activations are leaves that collect gradients.
        leaves = {e: moved[e].detach().requires_grad_() for e in moved}
        loss_sum = torch.zeros((), dtype=torch.float64)
        texts = self._inputs(llm_name, batch, tables, dtype)
        now = time.perf_counter()
        phases[f"{llm_name}.route"] = now - t
        t = now
        if llm_name in self.modules:
            ids = self._held(llm_name, tables)
            rows = {e: leaves[e].split([batch.projected(e, i) for i in ids]) for e in leaves}
            pos = {sid: j for j, sid in enumerate(ids)}
            for chunk in self._chunks(llm_name, texts):
                if not chunk:
                    continue
                prefixes = [torch.cat([rows[e][pos[s.id]] for e in encoder_order(self.model)]) for s in chunk]
                lens = {s.id: p.shape[0] + s.text.shape[0] for s, p in zip(chunk, prefixes, strict=True)}
                self._count(processed, llm_name, lens)
                loss = text_loss(self.modules[llm_name], prefixes, chunk, batch.label_tokens, self.cp[llm_name])
                loss.backward()
                loss_sum += loss.detach().to(torch.float64)
            spans.append((llm_name, "forward+backward", t, time.perf_counter()))
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

    def _sync_grads(self, spans: list[tuple[str, str, float, float]]) -> None:
        """Sum each module's gradients over its DP group (no averaging: the loss is globally normalised).

        With CP every rank's gradients are partial (its positions only): the sum is over the
        flattened (dp, cp) group instead.

        Coalesced: per module, the rank-local gradients (TP shards as they are) are flattened into one
        buffer per dtype, summed by one all_reduce over the module's DP group, and copied back. Gloo
        sums element by element whatever the buffer, so this is the per-parameter sum at a fraction
        of the collectives (one per module and dtype instead of one per parameter tensor).
        """
        for name, module in self.modules.items():
            t = time.perf_counter()
            grid = self.grids[name]
            group = grid.submesh("dp").get_group() if grid.dp > 1 else None
            if grid.cp > 1:
                group = grid.flat_group("dp", "cp")
            buckets: dict[torch.dtype, list[torch.Tensor]] = {}
            for p in module.parameters():
                if p.grad is None:  # no tokens of this modality on this rank
                    p.grad = torch.zeros_like(p)
                local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                buckets.setdefault(local.dtype, []).append(local)
            if group is not None:
                for grads in buckets.values():
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
                if c.dp == 0 and c.tp == 0 and c.cp == 0:
                    out[f"{name}.{pname}"] = full.detach().clone()
        assert self.cfg.dump_dir is not None
        torch.save(out, Path(self.cfg.dump_dir) / f"{what}.rank{self.rank}.pt")

    def finish(self) -> None:
        self.orch.close()
        if self.cfg.dump_dir is not None:
            self._dump("params", lambda p: p.data if not hasattr(p, "full_tensor") else p)
