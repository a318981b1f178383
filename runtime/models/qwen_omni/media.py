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
  and `<|vision_eos|>`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.qwen_vl.media import VisionGrids
from orch.runtime.models.qwen_vl.media import token_rule as qwen_vl_rule
from orch.runtime.sample import MEL_HOP, MEL_RATE

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


def token_rule(spec: ModuleSpec, modality: Modality) -> OmniClips | VisionGrids | None:
    """The rule of the thinker's tower `spec` (family.py `QwenOmni.token_rule`)."""
    if spec.hf is None:
        return None
    if modality == Modality.AUDIO:
        return OmniClips()
    rule = qwen_vl_rule(spec, modality, "qwen2_5_vl")
    return replace(rule, wrap=(VISION_BOS, VISION_EOS)) if rule is not None else None
