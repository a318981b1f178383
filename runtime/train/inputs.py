"""Which samples a rank runs for each module this step, their inputs moved to it, and its micro-batches.

Unbalanced (`balance == none`), or loading at the destination: every rank builds (decodes) the inputs of
the samples it runs itself, from the seeded batch or the data file every rank can read; nothing moves.
Balanced and loading at the origin: every world rank joins one all_to_all_single per module (an encoder's
features; the LLM's text and label ids, to its first and last pipeline stage), from each sample's origin
DP index to the dispatcher's.
The profile (runtime/profile/per_step.py) times the same routes through this class.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from orch.planner.plan import Plan
from orch.runtime.data.batch import GlobalBatch, MediaItem, Sample, encoder_items, item_map
from orch.runtime.parallel.grid import Grid
from orch.runtime.parallel.pipeline import MicroBatch
from orch.runtime.parallel.transport import Route, move
from orch.runtime.train.pieces import piece_sample
from orch.runtime.train.post_balance import StepTables

T = TypeVar("T")


class InputRouter:
    """One rank's view of where the step's samples are, per module (read-only over the step's tables)."""

    def __init__(
        self,
        plan: Plan,
        grids: dict[str, Grid],
        rank: int,
        world: int,
        device: torch.device,
        *,
        balanced: bool,
        at_destination: bool = False,
    ) -> None:
        self.plan, self.model, self.grids = plan, plan.model, grids
        self.rank, self.world, self.device, self.balanced = rank, world, device, balanced
        self.at_destination = at_destination

    def held(self, name: str, tables: StepTables, *, origin: bool = False) -> list[int]:
        """Sample ids (an encoder's piece ids, train/pieces.py) this rank's DP index of `name` holds (at the
        origin, or after balancing)."""
        c = self.grids[name].coord(self.rank)
        assert c is not None
        if name in tables.pieces:
            return tables.pieces[name].held(c.dp, origin=origin)
        where = tables.origin[name] if origin else tables.dest[name]
        return [i for i, d in enumerate(where) if d == c.dp]

    def held_samples(self, name: str, tables: StepTables, *, origin: bool = False) -> list[int]:
        """The samples whose inputs of `name` this rank builds (of its held pieces, for an encoder)."""
        held = self.held(name, tables, origin=origin)
        return tables.pieces[name].samples(held) if name in tables.pieces else held

    def _built(
        self, name: str, batch: GlobalBatch, tables: StepTables, ids: list[int], dtype: torch.dtype
    ) -> list[Sample]:
        """The samples (pieces) `ids` of `name`, built on this rank from the batch."""
        needs = () if name == self.model.llm_name else (name,)  # the LLM takes text only: no media decoded for it
        if name not in tables.pieces:
            return [batch.sample(i, dtype, self.device, needs) for i in ids]
        pieces, whole = tables.pieces[name], {}
        for i in pieces.samples(ids):
            whole[i] = batch.sample(i, dtype, self.device, needs)
        return [
            piece_sample(whole[pieces.sample[p]], p, pieces, name, encoder_items(batch, name, pieces.sample[p]))
            for p in ids
        ]

    def inputs(
        self, name: str, batch: GlobalBatch, tables: StepTables, dtype: torch.dtype, *, serves: bool
    ) -> list[Sample]:
        """The samples this rank runs for `name` (ascending ids), their inputs moved from their origin.

        Collective when balanced: every world rank calls it for every module, in the same order.
        """
        grid, llm = self.grids[name], name == self.model.llm_name
        if not self.balanced or self.at_destination:
            return self._built(name, batch, tables, self.held(name, tables), dtype) if serves else []
        if llm:
            rows = batch.text_tokens
            width, pack_dtype = 2, torch.int64
        else:
            rows = tables.input_rows(name, batch)
            width, pack_dtype = self.model.modules[name].input_dim or 1, dtype
        empty_x = torch.zeros(0, width, dtype=pack_dtype, device=self.device)
        # The LLM's token ids go to its first pipeline stage and its labels to its last: one move per stage.
        stages = sorted({0, grid.pp - 1}) if llm else [0]
        coord = grid.coord(self.rank)
        y = empty_x
        for stage in stages:
            x = empty_x
            if coord is not None and coord.pp == stage:
                here = self._built(name, batch, tables, self.held(name, tables, origin=True), dtype)
                parts = [torch.stack([s.text, s.labels], 1) if llm else s.feats[name] for s in here]
                x = torch.cat(parts).to(pack_dtype) if parts else x
            route = Route(tables.input_table(name), grid, grid, tuple(rows), src_stage=stage, dst_stage=stage)
            got = move(x, route, self.rank, self.world)
            if coord is not None and coord.pp == stage:
                y = got
        if not serves or (coord is not None and coord.pp not in stages):
            return []
        ids = self.held(name, tables)
        empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        out = []
        for i, part in zip(ids, y.split([rows[i] for i in ids]), strict=True):
            out.append(
                Sample(i, {}, part[:, 0], part[:, 1]) if llm else Sample(i, {name: part}, empty, empty, self._media(
                    name, batch, tables, i))
            )  # fmt: skip
        return out

    @staticmethod
    def _media(name: str, batch: GlobalBatch, tables: StepTables, unit: int) -> dict[str, tuple[MediaItem, ...]]:
        """A moved sample's (piece's) grids or clips, from the batch every rank knows."""
        pieces = tables.pieces.get(name)
        if pieces is None:
            return item_map(batch, unit, [name])
        i, a, n = pieces.sample[unit], pieces.first[unit], pieces.count[unit]
        items = encoder_items(batch, name, i)
        if a == 0 and n == len(items):
            return item_map(batch, i, [name])
        media = tuple(m for it in items[a : a + n] for m in it.media)
        return {name: media} if media else {}

    def calls(self, name: str, tables: StepTables) -> int:
        """How many micro-batches (encoder chunks) every rank of `name` runs this step, empty ones included; 0: each
        rank its own count. Collectives inside the module's calls need the same count on all its DP ranks: under
        EP (all_to_alls in every MoE layer) num_micro_batches, under reshard (FSDP2 gathers per block call) the
        most any DP index needs this step, from the tables every rank holds (no collective)."""
        mp = self.plan.modules[name]
        if mp.layout.ep > 1:
            return mp.num_micro_batches
        if mp.reshards and mp.layout.dp * mp.layout.cp > 1:
            return max(len(self._split(mp.num_micro_batches, tables.held(name, j))) for j in range(mp.layout.dp))
        return 0

    @staticmethod
    def _split(num_micro_batches: int, items: list[T]) -> list[list[T]]:
        """`items` cut into at most `num_micro_batches` near-equal chunks, in order ([[]] when there are none)."""
        n = min(num_micro_batches, max(1, len(items)))
        size = -(-len(items) // n) if items else 0
        return [items[k : k + size] for k in range(0, len(items), size)] if items else [[]]

    def chunks(self, name: str, items: list[T], calls: int = 0) -> list[list[T]]:
        """`items` cut into the module's micro-batches, padded with empty ones up to `calls` (`self.calls`)."""
        chunks = self._split(self.plan.modules[name].num_micro_batches, items)
        return chunks + [[] for _ in range(calls - len(chunks))]

    def micro_batches(self, name: str, ids: list[int], batch: GlobalBatch, calls: int = 0) -> list[MicroBatch]:
        """A DP index's LLM micro-batches (the same on every stage: from the global lengths); with `calls`
        (`self.calls`) exactly that many, empty ones included, else only the non-empty ones."""
        out = []
        for m, chunk in enumerate(c for c in self.chunks(name, ids, calls) if c or calls):
            layouts = tuple(batch.layout(i) for i in chunk)
            out.append(MicroBatch(m, tuple(chunk), tuple(lay.length for lay in layouts), layouts))
        return out
