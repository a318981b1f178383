"""Encoder phases balanced by item: an image, a run of a video's frame groups, an audio window.

The towers orch trains never attend across their items (Qwen-VL within each temporal patch group,
LLaVA within each image, Whisper within each window), so a sample's encoder work may run on several
ranks and be gathered back to its LLM rank with the same result. Balancing by item lifts the
whole-sample ceiling: one long video no longer sets the phase's slowest rank.

A phase balanced by item is dispatched over units, each a sample's items or a contiguous run of them
(`group_phase`; dispatch.balance_items): first every sample whole. That stands when it reaches the
item-level cap (the lower bound at item granularity × (1 + SLACK)), so items of one sample stay
together whenever splitting would not lower the phase's maximum, and no bytes move for nothing. Else
the samples costlier than a threshold are cut into contiguous runs (`chunk_groups`): those over the
cap into runs of about half the bound, then, if that ends more than 3% over the cap, those over a
quarter of it into eighths, each dispatched again; the lowest maximum wins, ties to fewer
cuts. The runs keep their sample's origin, so the topology-first dispatcher keeps them on their node
where it can.

A padded phase runs every item padded to the rank's longest, so its units are always single items.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orch.planner.balance.batch import PhaseSpec
from orch.planner.balance.cost import FloatArray, IntArray, PhaseArrays
from orch.planner.balance.topology import run_starts, segment_first

VIDEO_RUNS = 16  # a video's temporal patch groups are cut into at most this many contiguous runs (its items)


def temporal_runs(t: int) -> list[int]:
    """A video's `t` temporal patch groups cut into at most VIDEO_RUNS contiguous runs of near-equal length, in
    order (the longer ones first): each run's group count. The runtime's items (runtime/data/batch.py) and the
    planner's (planner/data.py, a manifest's items) cut them alike."""
    runs = max(1, min(t, VIDEO_RUNS))
    base, extra = divmod(t, runs)
    return [base + (k < extra) for k in range(runs)]


def grid_item_tokens(grids: list[tuple[int, int, int]]) -> list[int]:
    """The item tokens (patches) of a sample's images and videos, each (t, h, w): an image one item, a video
    its temporal runs."""
    return [n * h * w for t, h, w in grids for n in temporal_runs(t)]


@dataclass(frozen=True)
class Items:
    """One encoder phase's items: item k of the phase belongs to batch sample `sample[k]`.

    `sample` is non-decreasing and a sample's items are in their order in the sample (the order
    its encoder rows take in its LLM sequence). Only items of length > 0 are here.
    """

    sample: IntArray
    lengths: IntArray
    bytes: IntArray

    @property
    def n(self) -> int:
        return int(self.sample.size)

    @property
    def several(self) -> bool:
        """Some sample has more than one item (else a unit is a sample: the sample-level dispatcher)."""
        return bool(self.n > 1 and (self.sample[1:] == self.sample[:-1]).any())

    @staticmethod
    def whole(lengths: IntArray, bytes_: IntArray) -> Items:
        """One item per sample of length > 0 (a phase whose samples each are one item)."""
        ids = np.flatnonzero(lengths > 0).astype(np.int64)
        return Items(ids, lengths[ids].astype(np.int64), bytes_[ids].astype(np.int64))

    @staticmethod
    def from_lists(lengths: list[list[int]], bytes_: list[list[int]]) -> Items:
        """From per-sample lists of item lengths and bytes (items of length 0 dropped)."""
        counts = np.fromiter((len(x) for x in lengths), dtype=np.int64, count=len(lengths))
        sample = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
        lens = np.fromiter((v for x in lengths for v in x), dtype=np.int64, count=int(counts.sum()))
        nbytes = np.fromiter((v for x in bytes_ for v in x), dtype=np.int64, count=int(counts.sum()))
        keep = lens > 0
        return Items(sample[keep], lens[keep], nbytes[keep])


def item_costs(items: Items, spec: PhaseSpec) -> FloatArray:
    """Every item's cost(len): a tower's per-sample polynomial runs per item (attention inside it)."""
    return spec.per_sample(items.lengths.astype(np.float64))


def item_lower_bound(costs: FloatArray, num_ranks: int) -> float:
    """max(total / N, costliest item): no placement of items does better."""
    if costs.size == 0:
        return 0.0
    return float(max(costs.sum() / num_ranks, costs.max()))


def whole_groups(items: Items) -> IntArray:
    """Each item's unit when every sample is one unit: the index of its sample among the phase's."""
    if items.n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[True], items.sample[1:] != items.sample[:-1]])
    return (np.cumsum(starts) - 1).astype(np.int64)


def chunk_groups(items: Items, costs: FloatArray, cut: np.ndarray, run: float) -> IntArray:
    """Each item's unit: its sample whole, or where cut[k] (per item, the same over a sample) a
    contiguous run of its sample's items; a run starts where the items before it in the sample reach
    the next multiple of `run` (so a run costs at most `run` plus its last item)."""
    if items.n == 0:
        return np.zeros(0, dtype=np.int64)
    start = run_starts(items.sample)
    csum = np.cumsum(costs)
    before = csum - costs - (csum[start] - costs[start])  # cost of the sample's items before each
    chunk = np.where(cut, np.floor(before / max(run, 1e-300)), 0).astype(np.int64)
    new = np.concatenate([[True], (items.sample[1:] != items.sample[:-1]) | (chunk[1:] != chunk[:-1])])
    return (np.cumsum(new) - 1).astype(np.int64)


def group_phase(
    name: str, spec: PhaseSpec, items: Items, costs: FloatArray, group: IntArray, origin: IntArray,
    num_ranks: int, dp_per_node: int,
) -> PhaseArrays:  # fmt: skip
    """The units of `group` (per item, non-decreasing) as a phase: a unit costs, holds and moves the sum
    of its items' costs, tokens and bytes, and starts on its sample's origin (origin: per batch sample)."""
    if items.n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return PhaseArrays(name, spec, empty, empty, np.zeros(0), empty, empty, num_ranks, dp_per_node)
    first = segment_first(group)
    sample = items.sample[first]
    return PhaseArrays(
        name=name,
        spec=spec,
        ids=sample,
        lengths=np.add.reduceat(items.lengths, first).astype(np.int64),
        costs=np.add.reduceat(costs, first).astype(np.float64),
        origin=origin[sample].astype(np.int64),
        bytes=np.add.reduceat(items.bytes, first).astype(np.int64),
        num_ranks=num_ranks,
        dp_per_node=dp_per_node,
        monotone=first.size == items.n,
    )
