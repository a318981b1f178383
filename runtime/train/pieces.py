"""An encoder phase's units of one step (`EncoderPieces`): each sample whole, or, balanced by item, each maximal
run of its items the dispatcher put on one DP index.

The encoder phase runs pieces as it ran samples: a piece's inputs move from its sample's origin to its DP
index (`input_table`), the tower runs it as a sample of its own (its rows and media, `piece_sample`: its
tower attends inside items only, so the rows it gives are the sample's rows of those items), and its projected
rows go straight to its sample's LLM DP index (`boundary_table`). Pieces are numbered sample by sample, each
sample's in the order of its items, and every move delivers ascending ids: so an LLM rank receives each
sample's encoder rows whole and in order, where it received them whole before. When nothing is cut, piece i
is sample i (with its rows, zero for a sample without the modality).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orch.planner.routing import RouteTable
from orch.runtime.data.batch import EncoderItem, Sample

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EncoderPieces:
    """Per piece: its sample, its items (first, count) of the sample's `encoder_items`, where it starts and runs,
    and its input and projected rows."""

    sample: tuple[int, ...]
    first: tuple[int, ...]
    count: tuple[int, ...]
    origin: tuple[int, ...]  # its sample's origin DP index
    dest: tuple[int, ...]  # the DP index that runs it
    rows: tuple[int, ...]
    projected: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.sample)

    @property
    def cut(self) -> bool:
        """Some sample runs on more than one DP index."""
        return self.size != len(set(self.sample))

    def held(self, dp_index: int, *, origin: bool = False) -> list[int]:
        where = self.origin if origin else self.dest
        return [p for p, d in enumerate(where) if d == dp_index]

    def samples(self, pieces: list[int]) -> list[int]:
        """The samples of these pieces, ascending, each once."""
        return sorted({self.sample[p] for p in pieces})

    def input_table(self, dp: int) -> RouteTable:
        return RouteTable.build(list(self.origin), list(self.dest), dp, dp)

    def boundary_table(self, llm_dest: tuple[int, ...], dp: int, llm_dp: int) -> RouteTable:
        """Each piece from the DP index that ran it to its sample's LLM DP index."""
        return RouteTable.build(list(self.dest), [llm_dest[i] for i in self.sample], dp, llm_dp)

    def of_samples(self, samples: frozenset[int]) -> frozenset[int]:
        """The pieces of these samples."""
        return frozenset(p for p, i in enumerate(self.sample) if i in samples)


def whole_pieces(origin: tuple[int, ...], dest: tuple[int, ...], items: list[tuple[EncoderItem, ...]]) -> EncoderPieces:
    """Every sample one piece (`encoder_balance: sample`, or nothing cut)."""
    return EncoderPieces(
        sample=tuple(range(len(origin))),
        first=(0,) * len(origin),
        count=tuple(len(x) for x in items),
        origin=origin,
        dest=dest,
        rows=tuple(sum(it.rows for it in x) for x in items),
        projected=tuple(sum(it.projected for it in x) for x in items),
    )


def item_pieces(
    origin: tuple[int, ...], item_dest: list[list[int]], items: list[tuple[EncoderItem, ...]]
) -> EncoderPieces:
    """Per sample, its maximal runs of consecutive items on one DP index (item_dest[i][k]: item k's), in order; a
    sample without items one empty piece at its origin."""
    sample, first, count, where, dest, rows, proj = [], [], [], [], [], [], []
    for i, (its, ranks) in enumerate(zip(items, item_dest, strict=True)):
        k = 0
        while True:
            end = k + 1
            while end < len(its) and ranks[end] == ranks[k]:
                end += 1
            sample.append(i)
            first.append(k)
            count.append(end - k if its else 0)
            where.append(origin[i])
            dest.append(ranks[k] if its else origin[i])
            rows.append(sum(it.rows for it in its[k:end]))
            proj.append(sum(it.projected for it in its[k:end]))
            k = end
            if k >= len(its):
                break
    return EncoderPieces(*(tuple(x) for x in (sample, first, count, where, dest, rows, proj)))


def piece_sample(
    whole: Sample, piece: int, pieces: EncoderPieces, encoder: str, items: tuple[EncoderItem, ...]
) -> Sample:
    """The piece as a sample of its own: its items' rows of the sample's and their media."""
    a, n = pieces.first[piece], pieces.count[piece]
    if a == 0 and n == len(items):
        return Sample(piece, whole.feats, whole.text, whole.labels, whole.items)
    start = sum(it.rows for it in items[:a])
    feats: torch.Tensor = whole.feats[encoder][start : start + pieces.rows[piece]]
    media = tuple(m for it in items[a : a + n] for m in it.media)
    return Sample(piece, {encoder: feats}, whole.text[:0], whole.labels[:0], {encoder: media} if media else {})


__all__ = ["EncoderPieces", "item_pieces", "piece_sample", "whole_pieces"]
