"""The dispatcher's entry point: every phase of one global batch balanced, and the encoder→LLM routes.

`balance_batch` is what `orch balance` calls; `balance_arrays` is the same on numpy columns (the
runtime and the benchmark use it, skipping pydantic for 40,960 samples). A sample whose length is 0
in a phase takes no part in it: its destination is its origin and it moves no bytes. An encoder phase
whose samples list their items (an image, a run of a video's frame groups, an audio window) is
balanced by item (`balance_items`, items.py): each item gets a rank, and a sample's items stay
together unless cutting it lowers the phase's maximum.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from orch.planner.balance.batch import LLM_PHASE, BalanceResult, Batch, PhaseResult, PhaseSpec
from orch.planner.balance.cost import (
    IntArray,
    PhaseArrays,
    batch_columns,
    build_phase_arrays,
    lower_bound,
    moved_bytes,
    rank_costs,
    rank_tokens,
)
from orch.planner.balance.greedy import exchange_under_cap, improve, lpt
from orch.planner.balance.items import Items, chunk_groups, group_phase, item_costs, item_lower_bound, whole_groups
from orch.planner.balance.mode import Mode
from orch.planner.balance.orch_padded import orch_padded
from orch.planner.balance.orch_unpadded import orch_unpadded
from orch.planner.balance.padded import optimal_cap, padded_runs
from orch.planner.balance.paper import paper
from orch.planner.balance.topology import SLACK, segment_first
from orch.planner.errors import InfeasibleError, SpecError

# (cut the samples costlier than this fraction of the item-level cap, into runs of about this fraction
# of the item-level bound), tried in turn: the long samples into halves of a rank, then more into eighths
_CUTS = ((1.0, 0.5), (0.25, 0.125))
_CLOSE = 1.03  # cuts within this of the item-level cap stand: finer ones gain little for another dispatch


@dataclass(frozen=True)
class PhaseOutcome:
    """One phase's destinations (one per batch sample) and their numbers, as numpy."""

    dest: IntArray
    costs: np.ndarray  # per rank
    lower_bound: float
    inter_node_bytes: int
    intra_node_bytes: int
    seconds: float
    items: Items | None = None  # a phase balanced by item: its items
    item_dest: IntArray | None = None  # and each item's rank (dest: the rank of each sample's first item)
    cuts: int = 0  # samples whose items run on more than one rank

    def listed_dest(self, listed: np.ndarray) -> list[int | list[int]]:
        """dest per sample, where listed[i] (the sample gave a list of item lengths) a list of its items' ranks."""
        out: list[int | list[int]] = list(self.dest.tolist())
        if self.items is None or self.item_dest is None or not listed.any():
            return out
        per: dict[int, list[int]] = {int(i): [] for i in np.flatnonzero(listed)}
        for i, r in zip(self.items.sample.tolist(), self.item_dest.tolist(), strict=True):
            if i in per:
                per[i].append(r)
        for i, ranks in per.items():
            out[i] = ranks
        return out

    def to_result(self, listed: np.ndarray | None = None) -> PhaseResult:
        return PhaseResult(
            dest=self.listed_dest(listed) if listed is not None else self.dest.tolist(),
            max_cost=float(self.costs.max(initial=0.0)),
            mean_cost=float(self.costs.mean()) if self.costs.size else 0.0,
            lower_bound=self.lower_bound,
            inter_node_bytes=self.inter_node_bytes,
            intra_node_bytes=self.intra_node_bytes,
            seconds=self.seconds,
        )


def dispatch_phase(ph: PhaseArrays, mode: Mode) -> IntArray:
    """Rank of each of the phase's samples (indexed like ph.ids) under `mode`.

    A token cap that the drawn placement meets can still dead-end the constructive heuristics
    (packing under a cap is bin packing: with 16 tokens of room in all, a greedy order runs out).
    Such a phase is balanced from where its samples are, by moves and swaps that keep every rank
    under the cap (greedy.improve, then greedy.exchange_under_cap: one long sample against several
    short ones); a padded one stays where it is. A cap the drawn placement does not meet either is
    the caller's error, raised as before.
    """
    if mode == Mode.NONE or ph.n == 0:
        return ph.origin.copy()
    try:
        return _heuristic(ph, mode)
    except InfeasibleError:
        cap = ph.spec.max_tokens
        if cap is None or rank_tokens(ph, ph.origin).max(initial=0) > cap:
            raise
        if ph.spec.padded:
            return ph.origin.copy()
        moved = improve(ph.costs, ph.origin, ph.num_ranks, ph.dp_per_node, lower_bound(ph), lengths=ph.lengths, cap=cap)
        return exchange_under_cap(ph.costs, ph.lengths, moved, ph.num_ranks, cap)


def _heuristic(ph: PhaseArrays, mode: Mode) -> IntArray:
    if mode == Mode.ORCH:
        return orch_padded(ph) if ph.spec.padded else orch_unpadded(ph)
    if mode == Mode.PAPER:
        return paper(ph)
    if ph.spec.padded:  # lpt on a padded phase: the binary-search runs, run k on rank k
        return padded_runs(ph.costs, ph.lengths, ph.num_ranks, ph.spec.max_tokens)
    return lpt(ph.costs, ph.num_ranks, ph.lengths, ph.spec.max_tokens)


def check_token_caps(ph: PhaseArrays, source: str) -> None:
    """Fail when no assignment at all can meet the phase's max_tokens."""
    cap = ph.spec.max_tokens
    if cap is None or ph.n == 0:
        return
    field = f"phases.{ph.name}.max_tokens"
    k = int(np.argmax(ph.lengths))
    if ph.lengths[k] > cap:
        raise SpecError(
            source,
            f"samples.{int(ph.ids[k])}.lengths.{ph.name}",
            f"{int(ph.lengths[k])} tokens exceed {field} ({cap}): no rank can hold this sample",
        )
    total = int(ph.lengths.sum())
    if not ph.spec.padded and total > ph.num_ranks * cap:
        raise SpecError(
            source, field, f"expected at least {-(-total // ph.num_ranks)}: {total} tokens over {ph.num_ranks} ranks"
        )
    if ph.spec.padded:
        order = np.lexsort((np.arange(ph.n), -ph.lengths))
        try:
            optimal_cap(ph.costs[order], ph.lengths[order], ph.num_ranks, cap)
        except InfeasibleError:
            raise SpecError(
                source, field, f"too small: padded samples need more than {ph.num_ranks} ranks of {cap} tokens"
            ) from None


def outcome(ph: PhaseArrays, local_dest: IntArray, origin: IntArray, seconds: float) -> PhaseOutcome:
    dest = origin.copy()
    dest[ph.ids] = local_dest
    moved = moved_bytes(ph.origin, local_dest, ph.bytes, ph.dp_per_node)
    return PhaseOutcome(dest, rank_costs(ph, local_dest), lower_bound(ph), moved.inter, moved.intra, seconds)


def item_outcome(placed: ItemPlacement, items: Items, origin: IntArray, seconds: float) -> PhaseOutcome:
    ph, dest = placed.units, origin.copy()
    first = segment_first(items.sample)
    dest[items.sample[first]] = placed.item_dest[first]
    moved = moved_bytes(ph.origin, placed.unit_dest, ph.bytes, ph.dp_per_node)
    return PhaseOutcome(
        dest, rank_costs(ph, placed.unit_dest), placed.lower_bound, moved.inter, moved.intra, seconds,
        items=items, item_dest=placed.item_dest, cuts=placed.cuts,
    )  # fmt: skip


def balance_arrays(
    phases: dict[str, PhaseArrays], origin: IntArray, mode: Mode, items: Mapping[str, Items] | None = None,
    by_item: bool = True,
) -> dict[str, PhaseOutcome]:  # fmt: skip
    """Every phase balanced; a phase in `items` by item (`by_item=False`: its samples whole, costed as
    the sum of their items')."""
    out = {}
    for name, ph in phases.items():
        start = time.perf_counter()
        its = (items or {}).get(name)
        if its is None:
            out[name] = outcome(ph, dispatch_phase(ph, mode), origin, time.perf_counter() - start)
            continue
        placed = balance_items(name, ph.spec, its, origin, ph.num_ranks, ph.dp_per_node, mode, by_item)
        out[name] = item_outcome(placed, its, origin, time.perf_counter() - start)
    return out


@dataclass(frozen=True)
class ItemPlacement:
    """Where one phase's items run: each item's rank, and the units they were dispatched as."""

    item_dest: IntArray  # per item of the phase
    units: PhaseArrays
    unit_dest: IntArray
    lower_bound: float  # at item granularity (by_item), else at sample granularity
    cuts: int  # samples cut into runs of items


def balance_items(
    name: str, spec: PhaseSpec, items: Items, origin: IntArray, num_ranks: int, dp_per_node: int, mode: Mode,
    by_item: bool = True,
) -> ItemPlacement:  # fmt: skip
    """Each item's rank for one phase (items.py): every sample whole first, kept when it reaches the
    item-level cap; else the samples costlier than a threshold cut into runs, and the lowest maximum
    wins, ties to fewer cuts. `by_item=False` keeps every sample whole. origin: per batch sample."""
    costs = item_costs(items, spec)
    lb = item_lower_bound(costs, num_ranks)

    def place(group: IntArray, cuts: int) -> tuple[float, ItemPlacement] | None:
        ph = group_phase(name, spec, items, costs, group, origin, num_ranks, dp_per_node)
        try:
            dest = dispatch_phase(ph, mode)
        except InfeasibleError:
            return None  # a whole sample over max_tokens: its runs may fit
        bound = lb if by_item else lower_bound(ph)
        return float(rank_costs(ph, dest).max(initial=0.0)), ItemPlacement(dest[group], ph, dest, bound, cuts)

    def settled(tried: list[tuple[float, ItemPlacement] | None]) -> ItemPlacement:
        done = [t for t in tried if t is not None]
        if not done:
            raise InfeasibleError(f"{name}: no placement of its items meets max_tokens")
        best = min(t[0] for t in done)
        return min((t for t in done if t[0] <= best * (1 + 1e-9)), key=lambda t: t[1].cuts)[1]

    if spec.padded and by_item:  # a padded rank pads every item to its longest: items are the units
        return settled([place(np.arange(items.n, dtype=np.int64), 0)])
    whole = whole_groups(items)
    if not by_item or mode == Mode.NONE or not items.several:
        return settled([place(whole, 0)])
    cap = lb * (1 + SLACK) * (1 + 1e-9)
    sample_costs = np.bincount(whole, weights=costs)
    several = np.bincount(whole) > 1
    whole_bound = max(float(sample_costs.sum()) / num_ranks, float(sample_costs.max()))
    tried: list[tuple[float, ItemPlacement] | None] = []
    if whole_bound <= cap:  # whole samples may reach the cap: they stand if they do
        tried.append(place(whole, 0))
        if tried[0] is not None and tried[0][0] <= cap:
            return tried[0][1]
    last_cuts = 0
    for frac, run in _CUTS:
        cut = several & (sample_costs > frac * lb * (1 + SLACK))
        if int(cut.sum()) == 0 or (int(cut.sum()) == last_cuts and run >= _CUTS[0][1]):
            continue
        last_cuts = int(cut.sum())
        tried.append(place(chunk_groups(items, costs, cut[whole], run * lb), last_cuts))
        if tried[-1] is not None and tried[-1][0] <= cap * _CLOSE:
            break
    if whole_bound > cap:  # whole samples not tried: their bound may still be as good as the cuts
        done = [t[0] for t in tried if t is not None]
        if not done or min(done) >= whole_bound * (1 - 1e-9):
            tried.append(place(whole, 0))
    return settled(tried)


def routes(outcomes: dict[str, PhaseOutcome]) -> dict[str, np.ndarray]:
    """Per encoder phase, (encoder rank, LLM rank) of every sample: Π_llm ∘ Π_enc⁻¹ as two columns.

    routing.RouteTable(origin→enc).inverse().then(RouteTable(origin→llm)) is the same table
    (tests/unit/test_balance_props.py checks it); here it stays numpy.
    """
    if LLM_PHASE not in outcomes:
        return {}
    llm = outcomes[LLM_PHASE].dest
    return {name: np.stack([o.dest, llm], axis=1) for name, o in outcomes.items() if name != LLM_PHASE}


def batch_phase_arrays(batch: Batch) -> tuple[dict[str, PhaseArrays], IntArray]:
    phases = {}
    origin = np.zeros(0, dtype=np.int64)
    items = batch_items(batch)
    for name, spec in batch.phases.items():
        lengths, origin, bytes_ = batch_columns(batch, name)
        its = items.get(name)
        if its is None:
            phases[name] = build_phase_arrays(name, spec, lengths, origin, bytes_, batch.num_ranks, batch.dp_per_node)
        else:  # every sample whole, costing the sum of its items'
            costs = item_costs(its, spec)
            phases[name] = group_phase(
                name, spec, its, costs, whole_groups(its), origin, batch.num_ranks, batch.dp_per_node
            )
    if not batch.phases:
        origin = np.array([s.origin for s in batch.samples], dtype=np.int64)
    return phases, origin


def listed(batch: Batch, phase: str) -> np.ndarray:
    """Per sample: its lengths list the phase's items."""
    return np.fromiter(
        (isinstance(s.lengths.get(phase), list) for s in batch.samples), dtype=bool, count=len(batch.samples)
    )


def batch_items(batch: Batch) -> dict[str, Items]:
    """The items of every phase some sample lists items for (a number: one item)."""
    out = {}
    for name in batch.phases:
        if listed(batch, name).any():
            out[name] = Items.from_lists(
                [s.items(name) for s in batch.samples], [s.item_bytes(name) for s in batch.samples]
            )
    return out


def _item_phase(name: str, ph: PhaseArrays, items: Items) -> PhaseArrays:
    """Every item a unit: what the token caps check (a sample cut into items fits where its items do)."""
    every = np.arange(items.n, dtype=np.int64)
    anywhere = np.zeros(int(items.sample.max(initial=-1)) + 1, dtype=np.int64)
    return group_phase(name, ph.spec, items, item_costs(items, ph.spec), every, anywhere, ph.num_ranks, ph.dp_per_node)


def balance_batch(batch: Batch, mode: Mode = Mode.ORCH, source: str = "batch", by_item: bool = True) -> BalanceResult:
    """Every phase of one batch; the phases whose samples list items balanced by item (`by_item`)."""
    phases, origin = batch_phase_arrays(batch)
    items = batch_items(batch)
    for name, ph in phases.items():
        check_token_caps(_item_phase(name, ph, items[name]) if by_item and name in items else ph, source)
    outcomes = balance_arrays(phases, origin, mode, items, by_item)
    listing = {name: listed(batch, name) for name in items}
    llm = outcomes[LLM_PHASE].dest.tolist() if LLM_PHASE in outcomes else None
    return BalanceResult(
        phases={name: o.to_result(listing.get(name)) for name, o in outcomes.items()},
        routes={
            name: list(zip(o.listed_dest(listing[name]) if name in listing else o.dest.tolist(), llm, strict=True))
            for name, o in outcomes.items()
            if name != LLM_PHASE and llm is not None
        },
    )
