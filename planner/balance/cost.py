"""Per-phase arrays of one batch, rank costs, lower bounds and bytes moved (numpy, no loops over samples)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from orch.planner.balance.batch import Batch, PhaseSpec

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class PhaseArrays:
    """The samples that take part in one phase (length > 0), as arrays indexed 0..n-1.

    `ids` maps back to the batch's sample index; samples of length 0 are not here: they never move.
    A phase balanced by item (items.py) holds units instead: a sample whole, or a run of its items,
    each unit's `ids` entry its sample. `monotone`: cost is non-decreasing in length (one sort by
    length orders by cost); a unit of several items costs the sum of its items', so not there.
    """

    name: str
    spec: PhaseSpec
    ids: IntArray
    lengths: IntArray
    costs: FloatArray
    origin: IntArray
    bytes: IntArray
    num_ranks: int
    dp_per_node: int
    monotone: bool = True

    @property
    def n(self) -> int:
        return int(self.ids.size)

    @property
    def num_nodes(self) -> int:
        return self.num_ranks // self.dp_per_node


def sample_costs(lengths: npt.NDArray[np.int64], spec: PhaseSpec) -> FloatArray:
    """Every sample's cost(len) (SampleCost.per_sample: 0 where len == 0, no part in the phase)."""
    return spec.per_sample(lengths.astype(np.float64))


def build_phase_arrays(
    name: str,
    spec: PhaseSpec,
    lengths: IntArray,
    origin: IntArray,
    bytes_: IntArray,
    num_ranks: int,
    dp_per_node: int,
) -> PhaseArrays:
    """From full-batch columns (one entry per sample) keep the samples present in the phase."""
    ids = np.flatnonzero(lengths > 0).astype(np.int64)
    lens = lengths[ids].astype(np.int64)
    return PhaseArrays(
        name=name,
        spec=spec,
        ids=ids,
        lengths=lens,
        costs=sample_costs(lens, spec),
        origin=origin[ids].astype(np.int64),
        bytes=bytes_[ids].astype(np.int64),
        num_ranks=num_ranks,
        dp_per_node=dp_per_node,
    )


def batch_columns(batch: Batch, phase: str) -> tuple[IntArray, IntArray, IntArray]:
    """(lengths, origin, bytes) of every sample for one phase (a sample's items summed); missing bytes
    default to the length."""
    n = len(batch.samples)
    lengths = np.fromiter((sum(s.items(phase)) for s in batch.samples), dtype=np.int64, count=n)
    origin = np.fromiter((s.origin for s in batch.samples), dtype=np.int64, count=n)
    bytes_ = np.fromiter((sum(s.item_bytes(phase)) for s in batch.samples), dtype=np.int64, count=n)
    return lengths, origin, bytes_


def rank_costs(ph: PhaseArrays, dest: IntArray) -> FloatArray:
    """Cost of every rank when sample k of the phase runs on dest[k]."""
    if not ph.spec.padded:
        return np.bincount(dest, weights=ph.costs, minlength=ph.num_ranks).astype(np.float64)
    count = np.bincount(dest, minlength=ph.num_ranks)
    longest = np.zeros(ph.num_ranks, dtype=np.int64)
    np.maximum.at(longest, dest, ph.lengths)
    return count * sample_costs(longest, ph.spec)


def rank_tokens(ph: PhaseArrays, dest: IntArray) -> IntArray:
    """Tokens a rank holds, as max_tokens counts them: a sum, or samples × longest when padded."""
    if not ph.spec.padded:
        return np.bincount(dest, weights=ph.lengths, minlength=ph.num_ranks).astype(np.int64)
    count = np.bincount(dest, minlength=ph.num_ranks)
    longest = np.zeros(ph.num_ranks, dtype=np.int64)
    np.maximum.at(longest, dest, ph.lengths)
    return (count * longest).astype(np.int64)


def lower_bound(ph: PhaseArrays) -> float:
    """max(total / N, largest sample): no assignment does better.

    Also valid when padded: a rank's padded cost is at least the sum of its samples' own costs,
    because cost is non-decreasing in length (for len > 0; the per-sample constant included).
    The exact padded optimum is padded.optimal_cap.
    """
    if ph.n == 0:
        return 0.0
    return float(max(ph.costs.sum() / ph.num_ranks, ph.costs.max()))


class MovedBytes(NamedTuple):
    """Bytes of the samples that change rank, by the link they take. Read them by name.

    As a tuple, inter-node bytes come first: comparing two MovedBytes prefers fewer bytes across
    nodes (the slow link), then fewer inside a node (refill_padded keeps the one that moves fewer).
    """

    inter: int  # samples that change node
    intra: int  # samples that change rank inside their node


def moved_bytes(src: IntArray, dst: IntArray, nbytes: IntArray, per_node: int) -> MovedBytes:
    """Bytes of the samples whose rank changes from src[i] to dst[i]; rank r is on node r // per_node.

    The dispatcher passes a phase's DP indices (ph.origin, its dest, ph.bytes, ph.dp_per_node);
    the runtime passes the global ranks of the DP leaders that send and receive, and GPUs per node.
    """
    moved = dst != src
    cross = moved & (dst // per_node != src // per_node)
    return MovedBytes(inter=int(nbytes[cross].sum()), intra=int(nbytes[moved & ~cross].sum()))
