"""Qwen2.5-Omni's token rules for the index (torch-free), as `Qwen2_5OmniProcessor` counts and writes them.

* A clip: the processor pads it to its feature extractor's 30 s and counts the clip's own log-mel frames `l`
  from the attention mask (every started 160-sample hop at 16 kHz); the tower's stride-2 conv gives
  (l - 1) // 2 + 1 positions and its stride-2 pool (those - 2) // 2 + 1 LLM tokens (the processor's
  `_get_feat_extract_output_lengths`). The tower runs the whole clip in chunks of 2·n_window frames, so a clip
  past 30 s is counted whole (HF's processor would truncate it to 30 s). Its rows sit between `<|audio_bos|>`
  and `<|audio_eos|>`. A clip under 3 frames (30 ms) gives no token: a ValueError (the index skips the sample).
  The index keeps twice the LLM tokens (the pool merges 2); the input rows are Qwen2-Audio's layout
  (runtime/models/qwen2_audio/media.py): 4 frames a token, the 3 frames after them, and a length row carrying
  the clip's real frames past its token rows, from which the tower takes exactly the clip's `l` frames.
* An image or video: Qwen2.5-VL's grid (runtime/models/qwen_vl/media.py), its rows between `<|vision_bos|>`
  and `<|vision_eos|>`. A video used with its own audio (`use_audio_in_video`, decided per video by the data
  side: runtime/sample.py `MediaItem.sound`): `<|vision_bos|><|audio_bos|>`, then chunk after chunk its video
  rows and its clip's rows, each chunk `seconds_per_chunk` of the thinker's time axis, then
  `<|audio_eos|><|vision_eos|>` (`OmniGrids.sound_chunks`, as the processor's `replace_video_with_audio_token`).
  HF's video processor needs torchvision, which orch does not use: a video's frames and grid follow the published
  algorithm (Qwen2.5-VL's, runtime/models/qwen_vl/media.py), its seconds per temporal step as orch's Qwen2.5-VL.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import fields as fields_of
from typing import TYPE_CHECKING, ClassVar

from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.qwen_vl.media import VisionGrids
from orch.runtime.models.qwen_vl.media import token_rule as qwen_vl_rule
from orch.runtime.sample import MEL_HOP, MEL_RATE

if TYPE_CHECKING:
    from orch.runtime.sample import MediaItem

AUDIO_BOS, AUDIO_EOS = "<|audio_bos|>", "<|audio_eos|>"
VISION_BOS, VISION_EOS = "<|vision_bos|>", "<|vision_eos|>"
CONTEXT_ROWS = 4  # a clip's rows past its tokens' frames: 3 frames after them, 1 length row


def clip_llm_tokens(frames: int) -> int:
    """LLM tokens of a clip of `frames` log-mel frames (the processor's `_get_feat_extract_output_lengths`)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


@dataclass(frozen=True)
class OmniClips:
    """A Qwen2.5-Omni clip's tokens and the text around its rows (module docstring)."""

    wrap: tuple[str, str] = (AUDIO_BOS, AUDIO_EOS)
    context_rows: ClassVar[int] = CONTEXT_ROWS

    def frames(self, num_samples: int, rate: int) -> int:
        """The clip's log-mel frames as the processor counts them: every started hop at 16 kHz."""
        samples = num_samples if rate == MEL_RATE else round(num_samples * MEL_RATE / rate)
        return math.ceil(samples / MEL_HOP)

    def llm_tokens(self, num_samples: int, rate: int) -> int:
        frames = self.frames(num_samples, rate)
        tokens = clip_llm_tokens(frames)
        if tokens < 1:
            raise ValueError(f"a clip of {frames} log-mel frames is too short for one audio token (3 frames, 30 ms)")
        return tokens

    def tokens(self, num_samples: int, rate: int) -> int:
        """The clip's encoder tokens as the index keeps them: two per LLM token (the tower's pool)."""
        return 2 * self.llm_tokens(num_samples, rate)


def chunked(indices: Sequence[float], per_chunk: int) -> list[int]:
    """The sizes of the runs of ascending `indices` falling in successive ranges of `per_chunk` (the processor's
    `get_chunked_index`: a chunk closes at the first index at or past the next multiple; the last one stays)."""
    sizes, start, bound = [], 0, per_chunk
    for i, value in enumerate(indices):
        if value >= bound:
            sizes.append(i - start)
            start, bound = i, bound + per_chunk
    return [*sizes, len(indices) - start]


@dataclass(frozen=True)
class OmniGrids(VisionGrids):
    """Qwen2.5-VL's grids (runtime/models/qwen_vl/media.py) with the thinker's time axis: a video used with its
    own audio (`use_audio_in_video`) has its rows and its clip's interleaved chunk by chunk (`sound_chunks`)."""

    position_id_per_seconds: int = 25
    seconds_per_chunk: float = 2.0

    def sound_chunks(self, item: MediaItem) -> list[tuple[int, int]]:
        """(video rows, audio rows) of each chunk of a video and its sound, in order, as the processor's
        `replace_video_with_audio_token` writes them: each video row at its temporal step's time (step ·
        seconds · position_id_per_seconds), each audio row one position after the last, both cut at every
        `position_id_per_seconds · seconds_per_chunk` positions; the chunks alternate video then audio."""
        sound = item.sound
        if sound is None:
            raise ValueError("a video without its sound has no chunks")
        t, h, w = item.grid
        per_step = (h // self.merge) * (w // self.merge)
        times = [step * item.seconds * self.position_id_per_seconds for step in range(t) for _ in range(per_step)]
        per_chunk = int(self.position_id_per_seconds * self.seconds_per_chunk)
        video, audio = chunked(times, per_chunk), chunked(range(sound.rows), per_chunk)
        n = max(len(video), len(audio))
        return [(video[j] if j < len(video) else 0, audio[j] if j < len(audio) else 0) for j in range(n)]


def token_rule(spec: ModuleSpec, modality: Modality) -> OmniClips | OmniGrids | None:
    """The rule of the thinker's tower `spec` (family.py `QwenOmni.token_rule`)."""
    if spec.hf is None:
        return None
    if modality == Modality.AUDIO:
        return OmniClips()
    rule = qwen_vl_rule(spec, modality, "qwen2_5_vl")
    if rule is None:
        return None
    from orch.planner.hf_config import read_config
    from orch.runtime.models.qwen_omni.config import time_axis

    per_second, per_chunk, _ = time_axis(read_config(spec.hf.path)[1])
    fields = {f.name: getattr(rule, f.name) for f in fields_of(VisionGrids)}
    return OmniGrids(**{**fields, "wrap": (VISION_BOS, VISION_EOS)}, position_id_per_seconds=per_second,
                     seconds_per_chunk=per_chunk)  # fmt: skip
