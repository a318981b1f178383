"""What a sample is, as runtime/data makes it and runtime/models take it: the one module of data types both
import (neither imports the other for them). Torch-free at import (the index reads it).

* `SequenceLayout`: where a sample's rows sit in its LLM sequence, and which positions' logits its loss scores;
* `MediaItem`: one image, video or clip of a sample as a tower takes it (its grid);
* `EncoderRule`, `GridRule`, `ClipRule`: how an encoder's tokens are counted (runtime/data/index.py; a family's
  `token_rule` gives the last two);
* `MediaProcessor`: an encoder's input rows from its files (runtime/data/media.py; a family's `media_processor`).

The layout:

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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

IMAGE, VIDEO, AUDIO = "<image>", "<video>", "<audio>"  # a sample's placeholders (LLaMA-Factory's, ms-swift's)
# A video with its own audio (`use_audio_in_video`) where it stood: a mark of the text, never a user's placeholder;
# its vision encoder takes its video, its audio encoder its sound (runtime/data/expansion.py).
SOUNDING_VIDEO = "<video+audio>"
MEL_RATE, MEL_HOP = 16000, 160  # Whisper's and orch's reference log-mel: 16 kHz, a 10 ms hop


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
        import torch

        return cls(prefix, text, None, torch.arange(prefix, prefix + text))

    @classmethod
    def interleaved(cls, prefix: int, text: int, inserts: Sequence[tuple[int, int, int]]) -> SequenceLayout:
        """The text with prefix rows inserted: `inserts` are (before text token, first prefix row, rows) in
        text order (an offset past the text appends); each text token scored at the position before it."""
        import torch

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
        import torch

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
    import torch

    parts, off = [], 0
    for n, layout in zip(seqlens, layouts, strict=True):
        parts.append(layout.scored[0] + off)
        off += n
    return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).to(device)


def scored_labels(labels: Sequence[torch.Tensor], layouts: Sequence[SequenceLayout]) -> list[torch.Tensor]:
    """Each sample's labels in the order of its scored rows (`score_rows`)."""
    return [y[layout.scored[1].to(y.device)] for y, layout in zip(labels, layouts, strict=True)]


@dataclass(frozen=True)
class Sound:
    """A video's own audio, used with it (`use_audio_in_video`): the clip its audio encoder takes and the LLM rows
    it gives, which its family interleaves with the video's rows (`GridRule`'s optional `sound_chunks`)."""

    clip: int  # its place among the sample's clips of the audio encoder (placeholder order: runtime/data/expansion.py)
    rows: int  # the clip's projected (LLM) rows


@dataclass(frozen=True)
class MediaItem:
    """One image or video of a sample as a native-resolution tower takes it: its patch grid (temporal, height,
    width: patches before the merger; `t·h·w` input rows) and, for a video, the seconds one temporal grid step
    spans (0 for an image); a Qwen3-VL video is one item per temporal step, its seconds the step's timestamp
    (the `<t seconds>` of its text). Or one clip of a windowed audio tower (`takes_clips`): grid (1, 1, its input
    rows). Known to every rank from the index, as lengths are (docs/qwen_vl.md). `sound`: a video whose own audio
    is used with it (`use_audio_in_video`, docs/data.md), on its first item; None for every other item."""

    grid: tuple[int, int, int]
    seconds: float = 0.0
    sound: Sound | None = None

    @property
    def patches(self) -> int:
        t, h, w = self.grid
        return t * h * w

    @property
    def is_video(self) -> bool:
        return self.seconds > 0


def grid_items(patches: int, downsample: int) -> tuple[MediaItem, ...]:
    """One image of `patches` patches (a multiple of `downsample` = merge²), as near square as its factors allow:
    the grid a synthetic or profiled sample of a native-resolution tower takes (none for no patches)."""
    if patches <= 0:
        return ()
    merge = math.isqrt(downsample)
    units = patches // downsample
    if merge * merge != downsample or units * downsample != patches:
        raise ValueError(f"{patches} patches are not whole {merge}x{merge} merge windows")
    rows = max(d for d in range(1, math.isqrt(units) + 1) if units % d == 0)
    return (MediaItem((1, merge * rows, merge * (units // rows))),)


@dataclass(frozen=True)
class EncoderRule:
    """How one encoder's tokens are counted (runtime/data/index.py `TokenRules`), as its media processor reads it."""

    name: str
    modality: str  # vision or audio
    downsample: int
    image_tokens: int | None = None
    patch: int | None = None  # a reference vision encoder's patch side
    clip_tokens: int | None = None
    frames_per_token: int = 1
    grids: Any = None  # a native-resolution family's rule (`GridRule`): per image or video its patch grid
    clips: Any = None  # an audio family's rule (`ClipRule`): a clip's tokens from its length


class GridRule(Protocol):
    """A native-resolution family's token rule (its `Family.token_rule`, e.g. Qwen-VL's): each image's or video's
    items (patch grids) from the file's header, the text around each item's rows, and whether its tower takes
    videos. A frozen dataclass of JSON values (it keys the index).

    An image is one item; a video one or more, each its own group of rows in the text (Qwen3-VL: one per
    temporal step, after its timestamp): the k-th `<video>` renders as, per item, `video_prefix(item, j)` (j: the
    item's place in its video, from 0), then
    `wrap[0]`, the item's rows, `wrap[1]` (`video_texts`, `TextCounter.render`).

    A video with its own audio (`use_audio_in_video`, docs/data.md): its first item's rows and its clip's rows stand
    between `wrap[0]` + the audio rule's `wrap[0]` and the audio rule's `wrap[1]` + `wrap[1]` (Qwen-Omni's
    `<|vision_bos|><|audio_bos|>` ... `<|audio_eos|><|vision_eos|>`), video rows first, then audio rows, unless the
    rule has the optional method `sound_chunks(item: MediaItem) -> list[tuple[int, int]]`: the (video rows, audio
    rows) of each chunk in order, summing to the item's projected rows and `item.sound.rows` (Qwen-Omni: chunk by
    chunk of `seconds_per_chunk`), by which runtime/data/expansion.py places them."""

    wrap: tuple[str, str]  # text before and after each item's rows ("" where none)
    no_video: str  # why the tower takes no video ("" where it does)

    def image_item(self, path: str) -> tuple[int, int, int, float]:
        """(t, h, w, seconds) of an image: OSError where it cannot be read, ValueError (its processor's error)."""
        ...

    def video_items(self, path: str) -> tuple[tuple[int, int, int, float], ...]:
        """The items (t, h, w, seconds) a video becomes, in order; ValueError saying what is wrong."""
        ...

    def video_prefix(self, item: tuple[int, int, int, float], index: int) -> str:
        """The text before a video's `index`-th item's `wrap` (its timestamp, its frame number and the separator
        from the item before; "" where none)."""
        ...


class ClipRule(Protocol):
    """An audio family's token rule (its `Family.token_rule`, e.g. Qwen2-Audio's): a clip's encoder
    tokens from its length, and the text around its rows. A frozen dataclass of JSON values (it keys the index)."""

    wrap: tuple[str, str]  # text before and after each clip's rows ("" where none)

    def tokens(self, num_samples: int, rate: int) -> int:
        """Encoder tokens of a clip of `num_samples` at `rate` Hz."""
        ...


class MediaProcessor(Protocol):
    """An encoder's input rows from its media files (runtime/data/media.py; a family's `media_processor`)."""

    width: int  # values per input row

    def inputs(self, files: tuple[str, ...], rule: EncoderRule, max_image_tokens: int) -> list[torch.Tensor]:
        """One tensor of input rows per file (raises OSError/ValueError on a file that cannot be read)."""
        ...


def mel_frames(num_samples: int, rate: int) -> int:
    """Log-mel frames of a clip of `num_samples` at `rate` Hz: 16 kHz, a 160-sample hop, the last
    (partial) frame dropped as Whisper's feature extractor does; at least one."""
    return max(1, round(num_samples * MEL_RATE / rate) // MEL_HOP)


def audio_tokens(rule: EncoderRule, num_samples: int, rate: int) -> int:
    """Encoder tokens of one clip (module docstring; its family's rule where it has one)."""
    if rule.clips is not None:
        return int(rule.clips.tokens(num_samples, rate))
    tokens = max(1, mel_frames(num_samples, rate) // rule.frames_per_token)
    if rule.clip_tokens is not None:  # whole LLM tokens: a multiple of the pooling (ModuleSpec.round_length)
        return max(1, round(tokens / rule.downsample)) * rule.downsample
    return tokens


def soundfile_frames(path: str) -> tuple[int, int]:
    """(samples, rate) of the clip at `path`, from its header: an audio file's (soundfile), or a container's first
    audio stream (a video's own track: runtime/sound.py `clip_frames`)."""
    from orch.runtime.sound import clip_frames

    return clip_frames(path)


def waveform_16k(path: str) -> torch.Tensor:
    """The clip at `path`, mono, at 16 kHz: an audio file soundfile reads (linear resampling from another rate), or
    a container's audio track (a video's own) decoded and resampled by PyAV (runtime/sound.py `track_waveform`)."""
    import numpy as np
    import soundfile
    import torch

    from orch.runtime.sound import soundfile_reads, track_waveform

    if not soundfile_reads(path):
        return torch.from_numpy(track_waveform(path, MEL_RATE))
    wave, rate = soundfile.read(path, dtype="float32", always_2d=True)
    audio = torch.from_numpy(np.ascontiguousarray(wave.mean(axis=1)))
    if rate != MEL_RATE:
        size = max(1, round(audio.numel() * MEL_RATE / rate))
        audio = torch.nn.functional.interpolate(audio[None, None], size=size, mode="linear", align_corners=False)[0, 0]
    return audio
