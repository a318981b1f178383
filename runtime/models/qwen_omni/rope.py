"""A Qwen2.5-Omni sample's TMRoPE positions (temporal, height, width) from its layout and its images' and
videos' grids, as transformers 5.24's `Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index`
computes them:

* text and audio rows take 1-D positions (the same on all three axes), one a row, continuing from the position
  before them (an audio clip's rows advance as text does; `<|audio_bos|>` and `<|audio_eos|>` are text);
* an image or video of grid (t, h, w) patches takes, over its t x (h/merge) x (w/merge) rows in that order,
  temporal `start + int(step · seconds · position_id_per_seconds)` (float32, as HF computes it; an image's
  single step is 0), height `start + row`, width `start + column`; what follows it starts at the largest of
  its positions + 1 (over all three axes: a long video's time axis can pass its height and width).

The sample's prefix is its encoders' rows, encoder after encoder by name (runtime/data/batch.py
`encoder_order`): the thinker's `audio` rows, then its `vision` rows, item after item in text order; `items`
are the vision items, so the vision rows are the prefix's last.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from orch.runtime.sample import MediaItem, SequenceLayout


def vision_positions(start: int, item: MediaItem, merge: int, per_second: float) -> torch.Tensor:
    """[3, t·(h/merge)·(w/merge)] positions of one image or video starting at `start`."""
    t, h, w = item.grid
    hm, wm = h // merge, w // merge
    step = torch.tensor(item.seconds if item.is_video else 1.0, dtype=torch.float32)
    temporal = (torch.arange(t) * step * per_second).long()
    tt, hh, ww = torch.meshgrid(temporal, torch.arange(hm), torch.arange(wm), indexing="ij")
    return torch.stack([tt, hh, ww]).reshape(3, -1) + start


def omni_positions(layout: SequenceLayout, items: Sequence[MediaItem], merge: int, per_second: float) -> torch.Tensor:
    """[3, layout.length] positions of a sample whose prefix ends with `items`' rows (module docstring)."""
    rows = [it.patches // (merge * merge) for it in items]
    first = layout.prefix - sum(rows)
    if first < 0:
        raise ValueError(f"items give {sum(rows)} rows of a {layout.prefix}-row prefix")
    n = layout.length
    where = torch.empty(n, dtype=torch.int64)  # position of each row of cat([prefix, text])
    where[layout.source if layout.source is not None else torch.arange(n)] = torch.arange(n)
    out = torch.empty(3, n, dtype=torch.int64)
    pos = cur = 0
    for item, k in zip(items, rows, strict=True):
        at = int(where[first])
        out[:, pos:at] = torch.arange(cur, cur + at - pos)
        cur += at - pos
        got = vision_positions(cur, item, merge, per_second)
        out[:, at : at + k] = got
        cur = int(got.max()) + 1
        pos, first = at + k, first + k
    out[:, pos:] = torch.arange(cur, cur + n - pos)
    return out
