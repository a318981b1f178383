"""A Qwen2.5-Omni sample's TMRoPE positions (temporal, height, width) from its layout and its images' and
videos' grids, as transformers 5.24's `Qwen2_5OmniPreTrainedModelForConditionalGeneration.get_rope_index`
computes them:

* text and audio rows take 1-D positions (the same on all three axes), one a row, continuing from the position
  before them (an audio clip's rows advance as text does; `<|audio_bos|>` and `<|audio_eos|>` are text);
* an image or video of grid (t, h, w) patches takes, over its t x (h/merge) x (w/merge) rows in that order,
  temporal `start + int(step · seconds · position_id_per_seconds)` (float32, as HF computes it; an image's
  single step is 0), height `start + row`, width `start + column`; what follows it starts at the largest of
  its positions + 1 (over all three axes: a long video's time axis can pass its height and width);
* a video used with its own audio (its first item's `sound`, runtime/sample.py; decided per video): its
  `<|vision_bos|><|audio_bos|>` share one position, its video rows take the video's positions from the next and
  its clip's rows 1-D positions from that same next, wherever the chunks put them (the rows are interleaved chunk
  by chunk, media.py `OmniGrids.sound_chunks`), and `<|audio_eos|><|vision_eos|>` share one position past the
  largest of the last chunk (HF's `get_rope_index` with `use_audio_in_video`).

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
    source = layout.source if layout.source is not None else torch.arange(n)  # row of cat([prefix, text]) per position
    where = torch.empty(n, dtype=torch.int64)  # position of each row
    where[source] = torch.arange(n)
    out = torch.empty(3, n, dtype=torch.int64)
    pos = cur = 0
    for item, k in zip(items, rows, strict=True):
        at = int(where[first])
        sound = getattr(item, "sound", None)
        lead = 2 if sound is not None else 0  # <|vision_bos|><|audio_bos|>: one position for both
        out[:, pos : at - lead] = torch.arange(cur, cur + at - lead - pos)
        cur += at - lead - pos
        if lead:
            out[:, at - lead : at] = cur
            cur += 1
        got = vision_positions(cur, item, merge, per_second)
        if sound is None:
            out[:, at : at + k] = got
            cur = int(got.max()) + 1
            pos = at + k
        else:
            pos, cur = sounding_video(out, source[at : at + k + sound.rows], at, first, got, cur)
        first += k
    out[:, pos:] = torch.arange(cur, cur + n - pos)
    return out


def sounding_video(
    out: torch.Tensor, span_rows: torch.Tensor, at: int, first: int, video: torch.Tensor, start: int
) -> tuple[int, int]:
    """Fill a video's and its sound's interleaved rows from position `at` (`span_rows`: their rows of cat([prefix,
    text]); the video's are `first`..): video rows at their `video` positions, audio rows `start`, `start + 1`, ...
    in order; `<|audio_eos|><|vision_eos|>` both one past the largest position of the last chunk (HF's rule: the
    last run of video or audio rows). Returns (the next position, the next position id)."""
    span = span_rows.numel()
    is_video = (span_rows >= first) & (span_rows < first + video.shape[1])
    here = out[:, at : at + span]
    here[:, is_video] = video[:, span_rows[is_video] - first]
    audio = int((~is_video).sum())
    here[:, ~is_video] = torch.arange(start, start + audio)
    kinds = is_video.tolist()
    last = span - 1
    while last > 0 and kinds[last - 1] == kinds[span - 1]:
        last -= 1
    end = int(here[:, last:].max()) + 1
    out[:, at + span : at + span + 2] = end
    return at + span + 2, end + 1
