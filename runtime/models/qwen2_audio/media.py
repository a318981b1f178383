"""Qwen2-Audio's token rule for the index (torch-free): a clip's LLM tokens and the text around them, as
transformers' `Qwen2AudioProcessor` and LLaMA-Factory's `qwen2_audio` plugin make them.

* Count: the processor pads each clip to its feature extractor's 30 s and counts the clip's own log-mel
  frames `l` from the attention mask (every started 160-sample hop at 16 kHz: ceil(samples / 160)); the tower's
  stride-2 conv gives (l - 1) // 2 + 1 positions and its stride-2 pool (those - 2) // 2 + 1 LLM tokens, which is
  (l + 1) // 4. A clip longer than the tower's window (2·max_source_positions frames) is cut into windows, each
  counted so (orch's tower runs them one after another; HF's processor would truncate the clip to 30 s).
* Text: each clip's rows between `<|audio_bos|>` and `<|audio_eos|>` (the processor config's
  `audio_bos_token` / `audio_eos_token` where it names them), text tokens the index counts as text.

The index keeps a clip's encoder tokens (twice its LLM tokens: the pool merges 2). A clip's input rows are its
4·tokens frames and `CONTEXT_ROWS` more (processing.py): the 3 frames after them, which the tower's stem reads
at the clip's last positions (HF's tower reads the feature extractor's padded frames there), and a length row
carrying the clip's real frames past its token rows, so the tower attends over as many positions as HF's
(runtime/models/qwen2_audio/audio.py). A composed spec's bare Whisper encoder keeps the common rule
(runtime/data/index.py `audio_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.hf.processor import processor_keys
from orch.runtime.sample import MEL_HOP, MEL_RATE

BOS, EOS = "<|audio_bos|>", "<|audio_eos|>"
CONTEXT_ROWS = 4  # a clip's rows past its tokens' frames: 3 frames the stem reads past them, 1 length row


@dataclass(frozen=True)
class ClipTokens:
    """A Qwen2-Audio clip's tokens and the text around its rows (module docstring)."""

    window_frames: int  # the tower's window: 2·max_source_positions log-mel frames
    wrap: tuple[str, str] = (BOS, EOS)
    context_rows: ClassVar[int] = CONTEXT_ROWS  # input rows a clip has past its tokens' (module docstring)

    def frames(self, num_samples: int, rate: int) -> int:
        """The clip's log-mel frames as the processor counts them (its `feature_attention_mask`): every started
        hop at 16 kHz."""
        samples = num_samples if rate == MEL_RATE else round(num_samples * MEL_RATE / rate)
        return math.ceil(samples / MEL_HOP)

    def llm_tokens(self, num_samples: int, rate: int) -> int:
        """LLM tokens of a clip of `num_samples` at `rate` Hz: (l + 1) // 4 per window of its l frames."""
        whole, rest = divmod(self.frames(num_samples, rate), self.window_frames)
        return max(1, whole * ((self.window_frames + 1) // 4) + (rest + 1) // 4)

    def tokens(self, num_samples: int, rate: int) -> int:
        """The clip's encoder tokens as the index keeps them: two per LLM token (the tower's pool)."""
        return 2 * self.llm_tokens(num_samples, rate)


def token_rule(spec: ModuleSpec, modality: Modality) -> ClipTokens | None:
    """Qwen2-Audio's rule for the index (runtime/data/index.py; family.py `Qwen2Audio.token_rule`): its clips
    (module docstring)."""
    if modality != Modality.AUDIO or spec.hf is None or spec.clip_tokens is None:
        return None
    keys = processor_keys(spec.hf.path)
    bos, eos = keys.get("audio_bos_token"), keys.get("audio_eos_token")
    wrap = (bos if isinstance(bos, str) else BOS, eos if isinstance(eos, str) else EOS)
    return ClipTokens(2 * spec.clip_tokens, wrap)
