"""A sample's M-RoPE positions (temporal, height, width) from its layout and its images' and videos' grids, as
transformers 5.24's `get_rope_index` computes them for the Qwen-VL family:

* a run of text takes 1-D positions (the same on all three axes), continuing from the position before it;
* an image or video of grid (t, h, w) patches takes, over its t x (h/merge) x (w/merge) rows in that order,
  temporal `start + floor(i·interval)`, height `start + row`, width `start + column` (`interval`: Qwen2.5-VL's
  `tokens_per_second` x the video's seconds per temporal grid, else 1); the text after it starts at
  `start + max(h, w) / merge`.

Every rank computes the positions of every sample from the batch's lengths, layouts and items, so a pipeline
stage or a CP rank needs nothing sent (its share: `positions[:, mine]`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from orch.runtime.sample import MediaItem, SequenceLayout


def item_positions(start: int, item: MediaItem, merge: int, interval: float) -> torch.Tensor:
    """[3, t·(h/merge)·(w/merge)] positions of one image or video starting at `start`."""
    t, h, w = item.grid
    hm, wm = h // merge, w // merge
    temporal = (torch.arange(t, dtype=torch.float64) * interval).long()
    tt, hh, ww = torch.meshgrid(temporal, torch.arange(hm), torch.arange(wm), indexing="ij")
    return torch.stack([tt, hh, ww]).reshape(3, -1) + start


def mrope_positions(
    layout: SequenceLayout, items: Sequence[MediaItem], merge: int, tokens_per_second: float | None = None
) -> torch.Tensor:
    """[3, layout.length] positions of a sample whose prefix is `items`' rows, item after item (module
    docstring); `tokens_per_second` scales a video's temporal axis (Qwen2.5-VL), None: 1 per grid step."""
    rows = [it.patches // (merge * merge) for it in items]
    if sum(rows) != layout.prefix:
        raise ValueError(f"items give {sum(rows)} rows of a {layout.prefix}-row prefix")
    n = layout.length
    where = torch.empty(n, dtype=torch.int64)  # position of each row of cat([prefix, text])
    where[layout.source if layout.source is not None else torch.arange(n)] = torch.arange(n)
    out = torch.empty(3, n, dtype=torch.int64)
    pos = cur = first = 0
    for item, k in zip(items, rows, strict=True):  # prefix order is position order: items in text order
        at = int(where[first])
        out[:, pos:at] = torch.arange(cur, cur + at - pos)
        cur += at - pos
        interval = tokens_per_second * item.seconds if (tokens_per_second and item.is_video) else 1.0
        out[:, at : at + k] = item_positions(cur, item, merge, interval)
        cur += max(item.grid[1], item.grid[2]) // merge
        pos, first = at + k, first + k
    out[:, pos:] = torch.arange(cur, cur + n - pos)
    return out
