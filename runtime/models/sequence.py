"""Where a sample's rows sit in its LLM sequence, and which positions' logits its loss scores.

A sample's LLM input is its encoders' projected rows (the prefix, encoder after encoder and each encoder's
images or clips in order, as `train/compute.join_prefix` makes it) and its text tokens. A `SequenceLayout`
says where each of them goes:

* synthetic batches put the prefix first and score every text position against its own label (the label is
  the next-token target of that position);
* a conversation puts each image's or clip's rows where its placeholder stood in the text, as the model's
  own processor expands `<image>` / `<audio>` (LLaVA, Qwen2-Audio), and scores each text token at the
  position before it (labels in Hugging Face's aligned convention: token j's label is predicted by the row
  that precedes it, an encoder row included).

`source` maps each position to its row of `cat([prefix rows, text rows])` (None when that is the order
itself); `score[j]` is the position whose logit text token j's label is scored at (-1: none, the sequence's
first row). `positions`: the rotary positions of a family whose positions are not 0..n-1 (Qwen-VL's M-RoPE:
temporal, height, width per position; runtime/models/qwen_vl/rope.py). Every rank builds the same layouts
from the batch's lengths, text and media grids, so a pipeline's last stage and every CP rank find their rows
and positions without being sent anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

_EMPTY = torch.zeros(0, dtype=torch.int64)


@dataclass(frozen=True)
class SequenceLayout:
    prefix: int  # encoder rows
    text: int  # text tokens
    source: torch.Tensor | None  # [prefix + text] row of cat([prefix, text]) per position; None: that order
    score: torch.Tensor  # [text] position scoring text token j's label, -1 for none
    positions: torch.Tensor | None = None  # [3, length] M-RoPE positions (Qwen-VL); None: 0..length-1

    @property
    def length(self) -> int:
        return self.prefix + self.text

    @classmethod
    def prefix_first(cls, prefix: int, text: int) -> SequenceLayout:
        """The prefix, then the text; every text position scored against its own label."""
        return cls(prefix, text, None, torch.arange(prefix, prefix + text))

    @classmethod
    def interleaved(cls, prefix: int, text: int, inserts: Sequence[tuple[int, int, int]]) -> SequenceLayout:
        """The text with prefix rows inserted: `inserts` are (before text token, first prefix row, rows) in
        text order (an offset past the text appends); each text token scored at the position before it."""
        offsets = torch.tensor([min(o, text) for o, _, _ in inserts], dtype=torch.int64)
        rows = torch.tensor([n for _, _, n in inserts], dtype=torch.int64)
        if int(rows.sum()) != prefix:
            raise ValueError(f"inserts place {int(rows.sum())} rows of a {prefix}-row prefix")
        shift = torch.zeros(text + 1, dtype=torch.int64).index_add_(0, offsets, rows)
        before = torch.cumsum(shift, 0)  # prefix rows ahead of text token j (and of the end)
        text_pos = torch.arange(text) + before[:text]
        source = torch.empty(prefix + text, dtype=torch.int64)
        source[text_pos] = prefix + torch.arange(text)
        starts = offsets + torch.cumsum(rows, 0) - rows  # each insert's first position
        for at, (_, first, n) in zip(starts.tolist(), inserts, strict=True):
            source[at : at + n] = torch.arange(first, first + n)
        in_order = bool((source == torch.arange(prefix + text)).all())
        return cls(prefix, text, None if in_order else source, text_pos - 1)

    @cached_property
    def scored(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, text indices) of the labels scored: ascending positions, each with its token."""
        keep = torch.nonzero(self.score >= 0).flatten()
        return self.score[keep], keep

    def sources(self, positions: torch.Tensor) -> torch.Tensor:
        """Rows of cat([prefix, text]) at `positions`."""
        return positions if self.source is None else self.source[positions]


def layouts_or_prefix_first(
    layouts: Sequence[SequenceLayout] | None, prefixes: Sequence[torch.Tensor], texts: Sequence[torch.Tensor]
) -> list[SequenceLayout]:
    if layouts is not None:
        return list(layouts)
    return [SequenceLayout.prefix_first(p.shape[0], t.shape[0]) for p, t in zip(prefixes, texts, strict=True)]


def score_rows(seqlens: Sequence[int], layouts: Sequence[SequenceLayout], device: torch.device) -> torch.Tensor:
    """Rows of a packed micro-batch whose logits are scored, sample after sample (text order within one)."""
    parts, off = [], 0
    for n, layout in zip(seqlens, layouts, strict=True):
        parts.append(layout.scored[0] + off)
        off += n
    return (torch.cat(parts) if parts else _EMPTY).to(device)


def scored_labels(labels: Sequence[torch.Tensor], layouts: Sequence[SequenceLayout]) -> list[torch.Tensor]:
    """Each sample's labels in the order of its scored rows (`score_rows`)."""
    return [y[layout.scored[1].to(y.device)] for y, layout in zip(labels, layouts, strict=True)]
