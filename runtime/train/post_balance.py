"""Post-balancing: per step, where every sample runs in each phase (OrchMLLM), as `StepTables`.

Per step (OrchMLLM; docs/design.md, One primitive):

1. every rank announces its samples' per-phase lengths (`announce`: one all_gather of a few
   integers per sample; lengths, never data);
2. every rank runs the dispatcher (`planner.balance.dispatch.balance_batch`) on that identical
   input and gets identical tables (the dispatcher is deterministic), so nothing is broadcast;
3. the executor moves inputs and activations by the tables (`StepTables.*_table`, all
   `planner.routing.RouteTable`s moved by `transport.move`).

Origins: sample i starts on DP index `initial_dp_index(i, dp)` *of each module's layout* (the
data is replicated per layout today, runtime/data/synthetic.py). So each phase is balanced over its own
module's DP indices from its own origin, and an encoder's outputs go to the LLM by the composed
table Π_llm ∘ B ∘ Π_enc⁻¹, where B is the unbalanced boundary (encoder origin -> LLM origin):
one move, not back-and-forth (`StepTables.boundary_table`).

Cost per sample and phase: the one per-sample cost model, `SampleCost` (planner/sample_cost.py:
constant + linear·len + quadratic·len² for len > 0), per module the first found of (`dispatch_costs`):
1. the plan's (`ModulePlan.sample_cost`): a plan made with `orch plan --profile` records the seconds a
   sample costs a DP index of its layout, from the profile's fits it was priced with
   (planner/costs.py, `profiled_sample_cost`), so the dispatcher starts from `orch profile`'s
   measurements and the module is not timed again;
2. the start-up calibration (runtime/train/calibration.py, `shared_calibration`): the whole module's
   forward+backward timed on every rank before step 0 and fitted, its per-token and per-pair terms split
   over the module's tp ranks here;
3. the planner's FLOP model (planner/costs.py, `forward_coefficients`): linear = every weight a token
   meets, 2 FLOPs per multiply-add (a MoE block's router and its top_k experts; the LLM's head, an
   encoder's stem and projector), quadratic = QK^T and PV, 4 · hidden per layer, x0.5 for the causal
   LLM, no constant (pure tests, `--balance none` without a profiled plan).
Units are seconds in 1 and 2, FLOPs in 3: the dispatcher reads ratios within one phase only.
Bytes a sample moves in a phase (`_bytes`): its inputs, an encoder's tokens x frames per token
(ModelSpec.modality(...).frames_per_token: 2 for audio) x input_dim, the LLM's tokens x hidden,
times the element size.

A phase whose balanced placement the cost model prices above the unbalanced one (lpt and paper
are heuristics; a random placement can beat them) keeps the unbalanced placement.

Encoder phases by item (`encoder_balance: item`, the default): a sample's encoder work is its items
(`data/batch.py encoder_items`: images, runs of a video's temporal patch groups; a sample whole where its
tower's items are unknown), each costing the module's per-sample polynomial on its own tokens (the tower
attends inside items). The dispatcher gives each item a DP index (planner/balance/dispatch.py,
`balance_items`: a sample's items stay together unless cutting it lowers the phase's maximum), and the
phase runs the step's `EncoderPieces` (train/pieces.py): per sample its runs of items on one DP index.
`encoder_balance: sample` balances whole samples, each costing the sum of its items'.

Memory (`max_tokens`): a phase's per-rank token cap is the largest per-rank token count of the
unbalanced placement, so a balanced batch is never larger than the largest unbalanced one
(always feasible: the unbalanced placement meets it).

Overlap: `prefetch` announces step k+1's lengths (a cheap collective on the main thread: a
collective must not run on a second thread) and hands the dispatcher to a one-thread pool while
step k computes; `tables` waits for it. Hidden seconds = dispatcher seconds - seconds waited.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.distributed as dist

from orch.planner.balance.batch import LLM_PHASE, PhaseSpec
from orch.planner.balance.cost import MovedBytes, PhaseArrays, build_phase_arrays, moved_bytes, rank_costs
from orch.planner.balance.dispatch import balance_arrays
from orch.planner.balance.items import Items, group_phase, item_costs, item_lower_bound, whole_groups
from orch.planner.balance.mode import Mode
from orch.planner.costs import forward_coefficients
from orch.planner.plan import Plan
from orch.planner.routing import RouteTable
from orch.planner.sample_cost import SampleCost
from orch.planner.specs import ModelSpec
from orch.runtime.data.batch import EncoderItem, GlobalBatch, encoder_items, encoder_order, initial_dp_index
from orch.runtime.parallel.grid import Grid
from orch.runtime.train.pieces import EncoderPieces, item_pieces, whole_pieces


def dispatch_costs(
    plan: Plan, grids: dict[str, Grid], calibration: dict[str, SampleCost] | None = None
) -> dict[str, SampleCost]:
    """Per module, the per-sample cost its phase is balanced by (module docstring): the plan's profiled
    cost, else the start-up `calibration` (whole-module seconds) with its per-token and per-pair terms
    split over the module's tp ranks, else the planner's FLOP model."""
    model, out = plan.model, {}
    for m in (*encoder_order(model), model.llm_name):
        planned = plan.modules[m].sample_cost
        timed = (calibration or {}).get(m)
        if planned is not None:
            out[m] = planned
        elif timed is not None:
            out[m] = timed.scaled(1.0, tokens=1.0 / grids[m].tp)
        else:
            flops = forward_coefficients(model.modules[m], model.llm)
            out[m] = SampleCost(linear=flops.per_token, quadratic=flops.per_pair)
    return out


def phase_name(model: ModelSpec, module: str) -> str:
    """The dispatcher's phase name of a module: the LLM phase is always 'llm' (LLM_PHASE)."""
    return LLM_PHASE if module == model.llm_name else module


def dp_per_node(grid: Grid, ranks_per_node: int) -> int:
    """DP indices per node, as the dispatcher counts them (DP index d on node d // R), on nodes of
    `ranks_per_node` GPUs (the plan's).

    A DP index lives on the node of its leader. When the nodes do not form equal consecutive
    blocks of DP indices (an island straddling nodes unevenly), the phase is treated as one node:
    balancing stays correct, only the topology preference is lost.
    """
    nodes = [grid.leader(d) // ranks_per_node for d in range(grid.dp)]
    count = len(set(nodes))
    per = grid.dp // count
    blocks = grid.dp % count == 0 and all(nodes[d] == nodes[(d // per) * per] for d in range(grid.dp))
    distinct = len({nodes[d * per] for d in range(count)}) == count if blocks else False
    return per if blocks and distinct else grid.dp


@dataclass(frozen=True)
class StepTables:
    """One step's placement: per module, each sample's origin and destination DP index."""

    step: int
    origin: dict[str, tuple[int, ...]]
    dest: dict[str, tuple[int, ...]]
    dp: dict[str, int]
    llm: str
    stats: dict[str, dict[str, float]] = field(default_factory=dict)  # per phase: max/mean cost, before/after
    seconds: float = 0.0  # dispatcher compute time
    waited: float = 0.0  # of which the step waited for (not hidden)
    pieces: dict[str, EncoderPieces] = field(default_factory=dict)  # per encoder: the units its phase runs

    def held(self, module: str, dp_index: int) -> list[int]:
        """What a DP index of `module` runs: sample ids, or an encoder's piece ids (`pieces`)."""
        if module in self.pieces:
            return self.pieces[module].held(dp_index)
        return [i for i, d in enumerate(self.dest[module]) if d == dp_index]

    def input_table(self, module: str) -> RouteTable:
        """Samples' (an encoder's pieces') inputs from their origin to their balanced DP index, inside one
        module's layout."""
        if module in self.pieces:
            return self.pieces[module].input_table(self.dp[module])
        return RouteTable.build(list(self.origin[module]), list(self.dest[module]), self.dp[module], self.dp[module])

    def input_rows(self, module: str, batch: GlobalBatch) -> tuple[int, ...]:
        """Input rows of each unit of `input_table(module)` (an encoder's)."""
        if module in self.pieces:
            return self.pieces[module].rows
        return tuple(batch.input_rows(module, i) for i in range(batch.size))

    def boundary_rows(self, encoder: str, batch: GlobalBatch) -> tuple[int, ...]:
        """LLM rows of each unit of `boundary_table(encoder)`."""
        if encoder in self.pieces:
            return self.pieces[encoder].projected
        return tuple(batch.projected(encoder, i) for i in range(batch.size))

    def boundary_table(self, encoder: str) -> RouteTable:
        """Encoder outputs straight to the LLM ranks: Π_llm ∘ B ∘ Π_enc⁻¹ (one move); of each piece, from the DP
        index that ran it to its sample's LLM DP index.

        B is today's unbalanced boundary, encoder origin -> LLM origin; both Π start at the origins.
        """
        if encoder in self.pieces:
            return self.pieces[encoder].boundary_table(self.dest[self.llm], self.dp[encoder], self.dp[self.llm])
        unbalanced = RouteTable.build(
            list(self.origin[encoder]), list(self.origin[self.llm]), self.dp[encoder], self.dp[self.llm]
        )
        return self.input_table(encoder).inverse().then(unbalanced).then(self.input_table(self.llm))

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.seconds - self.waited)


def item_columns(model: ModelSpec, batch: GlobalBatch) -> dict[str, list[tuple[EncoderItem, ...]]]:
    """Per encoder, each sample's items (`encoder_items`), known to every rank from the batch's lengths."""
    return {e: [encoder_items(batch, e, i) for i in range(batch.size)] for e in encoder_order(model)}


def lengths_columns(model: ModelSpec, batch: GlobalBatch) -> dict[str, list[int]]:
    """Per module, each sample's tokens in that phase (encoder tokens; the LLM's whole sequence)."""
    encs = encoder_order(model)
    cols = {e: [batch.enc_tokens[i][e] for i in range(batch.size)] for e in encs}
    cols[model.llm_name] = [sum(batch.projected(e, i) for e in encs) + batch.text_tokens[i] for i in range(batch.size)]
    return cols


class PostBalancer:
    """Computes every step's StepTables; one per rank, identical results on every rank."""

    def __init__(
        self,
        plan: Plan,
        grids: dict[str, Grid],
        mode: str | Mode,
        elem_bytes: int,
        calibration: dict[str, SampleCost] | None = None,
        device: torch.device | str = "cpu",
        encoder_balance: str = "item",
    ) -> None:
        """`calibration`: per module the start-up fit from `shared_calibration`, for the modules whose plan
        carries no profiled cost (`dispatch_costs`); None: the FLOP model for those.
        `device`: the rank's device, where the lengths all_gather's buffers live (NCCL: CUDA only).
        `encoder_balance`: item or sample (module docstring)."""
        self.plan, self.grids, self.mode = plan, grids, Mode(mode)
        self.by_item = encoder_balance == "item"
        self.encoder_balance = encoder_balance
        self.device = torch.device(device)
        self.model = plan.model
        self.modules = [*encoder_order(self.model), self.model.llm_name]
        self.elem_bytes = elem_bytes
        self.costs = dispatch_costs(plan, grids, calibration)  # module -> its phase's per-sample cost
        self._specs = {m: PhaseSpec(**c.model_dump()) for m, c in self.costs.items()}
        self.dp_per_node = {m: dp_per_node(grids[m], plan.ranks_per_node) for m in self.modules}
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, tuple[Future[StepTables], float]] = {}

    # -- step 1: announce -------------------------------------------------------------------
    def announce(self, batch: GlobalBatch, rank: int, world: int) -> dict[str, list[int]]:
        """All-gather every sample's per-phase lengths; rank r announces samples i ≡ r (mod world).

        The batch is replicated today, so the gathered table must equal the local one (checked);
        the collective is what keeps the design right once every rank reads its own shard.
        """
        cols = lengths_columns(self.model, batch)
        n, per = batch.size, -(-batch.size // world)
        mine = torch.full((per, len(self.modules)), -1, dtype=torch.int64)
        for k, i in enumerate(range(rank, n, world)):
            mine[k] = torch.tensor([cols[m][i] for m in self.modules])
        mine = mine.to(self.device)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(gathered, mine)
        out: dict[str, list[int]] = {m: [0] * n for m in self.modules}
        for r, rows in enumerate(g.cpu() for g in gathered):  # back on the CPU once: the dispatcher reads ints
            for k, i in enumerate(range(r, n, world)):
                for j, m in enumerate(self.modules):
                    out[m][i] = int(rows[k, j])
        assert out == cols, "announced lengths differ from the replicated batch"
        return out

    # -- step 2: dispatch (pure, runs on the worker thread) ----------------------------------
    def _bytes(self, module: str, lengths: list[int]) -> list[int]:
        spec = self.model.modules[module]
        if module == self.model.llm_name:
            return [n * spec.hidden * self.elem_bytes for n in lengths]
        frames = self.model.modality(module).frames_per_token
        return [n * frames * (spec.input_dim or 1) * self.elem_bytes for n in lengths]

    def _phase(self, module: str, origin: np.ndarray, lengths: list[int]) -> PhaseArrays:
        """One module's phase as the dispatcher reads it: the samples' lengths, origins and bytes, the
        module's cost model, and the unbalanced placement's largest per-rank token count as the cap."""
        dp = self.grids[module].dp
        lens = np.asarray(lengths, dtype=np.int64)
        cap = max(1, int(np.bincount(origin, weights=lens, minlength=dp).max()))
        spec = self._specs[module].model_copy(update={"max_tokens": cap})
        nbytes = np.asarray(self._bytes(module, lengths), dtype=np.int64)
        name = phase_name(self.model, module)
        return build_phase_arrays(name, spec, lens, origin, nbytes, dp, self.dp_per_node[module])

    def _item_phase(
        self, module: str, origin: np.ndarray, items: list[tuple[EncoderItem, ...]]
    ) -> tuple[PhaseArrays, Items]:
        """An encoder's phase of whole samples, each costing the sum of its items', and its items."""
        dp = self.grids[module].dp
        width = (self.model.modules[module].input_dim or 1) * self.elem_bytes
        its = Items.from_lists([[it.tokens for it in x] for x in items], [[it.rows * width for it in x] for x in items])
        tokens = [sum(it.tokens for it in x) for x in items]
        cap = max(1, int(np.bincount(origin, weights=tokens, minlength=dp).max(initial=0)))
        spec = self._specs[module].model_copy(update={"max_tokens": cap})
        name = phase_name(self.model, module)
        ph = group_phase(
            name, spec, its, item_costs(its, spec), whole_groups(its), origin, dp, self.dp_per_node[module]
        )
        return ph, its

    def _by_items(
        self, module: str, origin: tuple[int, ...], items: list[tuple[EncoderItem, ...]]
    ) -> tuple[tuple[int, ...], EncoderPieces, dict[str, float]]:
        """An encoder's phase balanced over its items (or its samples whole): each sample's DP index (its first
        item's), the pieces the phase runs, and its statistics."""
        where = np.asarray(origin, dtype=np.int64)
        ph, its = self._item_phase(module, where, items)
        before = rank_costs(ph, ph.origin)
        dest, pieces, after = origin, whole_pieces(origin, origin, items), before
        floor = item_lower_bound(item_costs(its, ph.spec), ph.num_ranks) if self.by_item else None
        if self.mode != Mode.NONE and ph.num_ranks > 1:
            out = balance_arrays({ph.name: ph}, where, self.mode, {ph.name: its}, self.by_item)[ph.name]
            if out.costs.max(initial=0.0) <= before.max(initial=0.0):  # else stay: a heuristic worse than none
                dest, after = tuple(out.dest.tolist()), out.costs
                assert out.item_dest is not None
                per: list[list[int]] = [[] for _ in items]
                for i, r in zip(its.sample.tolist(), out.item_dest.tolist(), strict=True):
                    per[i].append(r)
                pieces = item_pieces(origin, per, items) if self.by_item else whole_pieces(origin, dest, items)
        stats = {
            "max_cost_before": float(before.max(initial=0.0)),
            "mean_cost_before": float(before.mean()),
            "max_cost": float(after.max(initial=0.0)),
            "mean_cost": float(after.mean()),
            # no placement of whole samples (of items, by item) has a smaller max
            "floor_cost": float(max(after.mean(), ph.costs.max(initial=0.0))) if floor is None else floor,
            "pieces": float(pieces.size),
        }
        return dest, pieces, stats

    def dispatch(
        self, step: int, lengths: dict[str, list[int]], items: dict[str, list[tuple[EncoderItem, ...]]] | None = None
    ) -> StepTables:
        """The step's tables; `items` (`item_columns`): each encoder's items, its phase balanced over them."""
        start = time.perf_counter()
        n = len(lengths[self.model.llm_name])
        origin = {m: tuple(initial_dp_index(i, self.grids[m].dp) for i in range(n)) for m in self.modules}
        dest: dict[str, tuple[int, ...]] = {}
        stats: dict[str, dict[str, float]] = {}
        pieces: dict[str, EncoderPieces] = {}
        for m in self.modules:
            if items is not None and m in items:
                dest[m], pieces[m], stats[phase_name(self.model, m)] = self._by_items(m, origin[m], items[m])
                continue
            where = np.asarray(origin[m], dtype=np.int64)
            ph = self._phase(m, where, lengths[m])
            if self.mode == Mode.NONE or ph.num_ranks == 1:
                dest[m] = origin[m]
            else:
                dest[m] = tuple(balance_arrays({ph.name: ph}, where, self.mode)[ph.name].dest.tolist())
            before = rank_costs(ph, ph.origin)
            after = rank_costs(ph, np.asarray(dest[m], dtype=np.int64)[ph.ids])
            if after.max() > before.max():  # a heuristic (lpt, paper) worse than where samples are: stay
                dest[m], after = origin[m], before
            stats[ph.name] = {
                "max_cost_before": float(before.max()),
                "mean_cost_before": float(before.mean()),
                "max_cost": float(after.max()),
                "mean_cost": float(after.mean()),
                # no placement of whole samples has a smaller max: the mean rank, or the costliest sample
                "floor_cost": float(max(after.mean(), ph.costs.max(initial=0.0))),
            }
        dp = {m: self.grids[m].dp for m in self.modules}
        seconds = time.perf_counter() - start
        return StepTables(step, origin, dest, dp, self.model.llm_name, stats, seconds, pieces=pieces)

    # -- step 6: overlap -----------------------------------------------------------------------
    def prefetch(self, batch: GlobalBatch, rank: int, world: int) -> None:
        """Announce step batch.step's lengths now and dispatch on the worker thread."""
        if self.mode == Mode.NONE:
            return
        lengths = self.announce(batch, rank, world)
        items = item_columns(self.model, batch)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="orch-dispatch")
        future = self._pool.submit(self.dispatch, batch.step, lengths, items)
        self._pending[batch.step] = (future, time.perf_counter())

    def pending(self, step: int) -> Future[StepTables] | None:
        """The tables of a prefetched step, while they are computed (None when not prefetched)."""
        got = self._pending.get(step)
        return got[0] if got is not None else None

    def tables(self, batch: GlobalBatch, rank: int, world: int) -> StepTables:
        """This step's tables: the prefetched ones (waiting for them if needed), else computed now."""
        if self.mode == Mode.NONE:  # only the cost statistics: nothing moves, nothing to hide
            t = self.dispatch(batch.step, lengths_columns(self.model, batch), item_columns(self.model, batch))
            return _with_wait(t, t.seconds)
        if batch.step not in self._pending:
            t = self.dispatch(batch.step, self.announce(batch, rank, world), item_columns(self.model, batch))
            return _with_wait(t, t.seconds)  # nothing hidden: computed on the critical path
        future, _ = self._pending.pop(batch.step)
        t0 = time.perf_counter()
        t = future.result()
        return _with_wait(t, min(t.seconds, time.perf_counter() - t0))

    def record(self, t: StepTables, batch: GlobalBatch, at_destination: bool = False) -> dict[str, object]:
        """The step's metrics: per phase max/mean cost (before and after) and the bytes its inputs
        moved inside and across nodes (forward; the backward moves the same bytes back), and the
        dispatcher's seconds, total and hidden behind the previous step's compute. `at_destination`: the
        ranks loaded their balanced samples themselves, so the inputs moved nothing; what loading at the
        origin would have moved is `input_bytes_avoided` (intra + inter, the encoders' and the text)."""
        gpn, llm = self.plan.ranks_per_node, self.model.llm_name
        balanced = self.mode != Mode.NONE
        out: dict[str, object] = {}
        llm_intra = llm_inter = avoided = 0
        for e in encoder_order(self.model):
            grid = self.grids[e]
            moved = MovedBytes(inter=0, intra=0)
            if balanced:
                width = (self.model.modules[e].input_dim or 1) * self.elem_bytes
                feats = [n * width for n in t.input_rows(e, batch)]
                moved = _leader_bytes(t.input_table(e), grid, grid, feats, gpn)
                if at_destination:
                    avoided += moved.intra + moved.inter
                    moved = MovedBytes(inter=0, intra=0)
            out[phase_name(self.model, e)] = {
                **t.stats[e],
                "intra_node_bytes": moved.intra,
                "inter_node_bytes": moved.inter,
            }
            table = t.boundary_table(e)  # the unbalanced boundary when nothing is balanced
            rows = [n * self.model.prefix_width * self.elem_bytes for n in t.boundary_rows(e, batch)]
            moved = _leader_bytes(table, grid, self.grids[llm], rows, gpn)
            llm_intra, llm_inter = llm_intra + moved.intra, llm_inter + moved.inter
        if balanced:
            text = [2 * n * 8 for n in batch.text_tokens]  # token and label ids, int64
            moved = _leader_bytes(t.input_table(llm), self.grids[llm], self.grids[llm], text, gpn)
            if at_destination:
                avoided += moved.intra + moved.inter
            else:
                llm_intra, llm_inter = llm_intra + moved.intra, llm_inter + moved.inter
        out[LLM_PHASE] = {**t.stats[LLM_PHASE], "intra_node_bytes": llm_intra, "inter_node_bytes": llm_inter}
        out["input_bytes_avoided"] = avoided
        out["encoder_balance"] = self.encoder_balance
        out["dispatcher_s"] = t.seconds
        out["dispatcher_hidden_s"] = t.hidden_s
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _with_wait(t: StepTables, waited: float) -> StepTables:
    return replace(t, waited=waited)


def _leader_bytes(table: RouteTable, src: Grid, dst: Grid, sample_bytes: list[int], gpus_per_node: int) -> MovedBytes:
    """Bytes of one move by link: from the source DP index's leader to the destination's (the
    transport's leader-to-leader move); a rank sending to itself moves nothing."""
    return moved_bytes(
        np.array([src.leader(d) for d in table.src], dtype=np.int64),
        np.array([dst.leader(d) for d in table.dst], dtype=np.int64),
        np.array(sample_bytes, dtype=np.int64),
        gpus_per_node,
    )


__all__ = [
    "PostBalancer",
    "StepTables",
    "dispatch_costs",
    "dp_per_node",
    "item_columns",
    "lengths_columns",
    "phase_name",
]
