"""Qwen3-Omni's audio encoder as an orch encoder: transformers' own `Qwen3OmniMoeAudioEncoder` over the packed
clips of many samples, and the clips' input rows (`PackedWhisperFeatures`).

The encoder takes each clip's real log-mel frames only, with their counts (`feature_lens`): it cuts each clip
into chunks of 2·n_window frames, convolves each chunk into its tokens and attends within windows of the clip's
tokens (n_window_infer / (2·n_window) full chunks). HF pads every chunk of a call to the call's longest, and its
convs read that padding at a short chunk's last positions (a conv's output of zeros is its bias, not zero): a
clip under 2·n_window frames gives other values alone than beside a longer one. orch pads every chunk to
2·n_window frames, as HF does in any call holding a full chunk (the common case, and a 1 s clip's alone), by
handing the encoder its chunks, their valid positions and windows (`chunked_call`), so a clip gives the same
wherever it runs: on any rank, beside any clips.

A clip's rows (qwen3_media.py) are its frames 4 a row, 2 rows a token, and a length row holding its real frames
`l`: the clip's frames are the first `l` of its unpacked rows. Without items (synthetic samples, the start-up
calibration) a sample of n tokens is one clip of the fewest frames that give n tokens, its first unpacked rows
(qwen3_config.py `frames_for`). The LLM takes Qwen3-VL's deepstack features beside each vision row: an audio row
gets zeros there (runtime/models/qwen_vl/language.py), as HF adds them at the vision rows alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from orch.runtime.models.hf.module import HFModule
from orch.runtime.models.qwen2_audio.processing import WhisperFeatures
from orch.runtime.models.qwen2_audio.whisper import length_row, sample_clips
from orch.runtime.models.qwen_omni.audio import OmniAudioTower
from orch.runtime.models.qwen_omni.qwen3_config import (
    CHUNK_TOKENS,
    FRAMES_PER_ROW,
    clip_tokens,
    conv_tokens,
    frames_for,
    window_tokens,
)
from orch.runtime.models.qwen_omni.qwen3_media import CONTEXT_ROWS, ROWS_PER_TOKEN
from orch.runtime.sample import MEL_RATE, EncoderRule, audio_tokens, soundfile_frames, waveform_16k

if TYPE_CHECKING:
    from orch.runtime.sample import MediaItem


class Omni3AudioTower(OmniAudioTower):
    def __init__(self, tower: nn.Module, config: Any) -> None:
        HFModule.__init__(self)
        self.audio_tower = tower
        self.width = int(config.text_config.hidden_size)
        self.deepstack = len(config.vision_config.deepstack_visual_indexes or ())
        self.output_dim = self.width * (1 + self.deepstack)  # zeros where a vision row has its deepstack features
        self.mels = int(config.audio_config.num_mel_bins)
        self.n_window = int(tower.n_window)
        self.window = window_tokens(self.n_window, int(tower.n_window_infer))  # the tokens a block attends within

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]:
        """The shortest clip, one token's rows, as a sample without items has them (`HasPlaceholder`)."""
        return torch.zeros(ROWS_PER_TOKEN, width, dtype=dtype, device=device), [1], [()]

    def clips(
        self, feats_TF: torch.Tensor, seqlens: list[int], items: Sequence[Sequence[MediaItem]] | None
    ) -> list[torch.Tensor]:
        """Each clip's real frames, [l, n_mels], in sample order (module docstring)."""
        out = []
        for (sample, clips), n in zip(sample_clips(feats_TF, seqlens, items, ROWS_PER_TOKEN), seqlens, strict=True):
            if clips is None:
                out += [sample.reshape(-1, self.mels)[: frames_for(n, self.n_window)]] if n else []
                continue
            for clip in clips:
                frames = length_row(clip)  # the clip's real frames
                out.append(clip[:-CONTEXT_ROWS].reshape(-1, self.mels)[:frames])
        return out

    def encode(self, clips: list[torch.Tensor]) -> torch.Tensor:
        """The encoder's tokens of `clips`, each chunk padded to 2·n_window frames (module docstring), zeros at the
        deepstack columns."""
        out = self.audio_tower(**chunked_call(clips, self.n_window, self.window)).last_hidden_state
        return F.pad(out, (0, self.output_dim - out.shape[-1]))


def chunked_call(clips: list[torch.Tensor], n_window: int, window: int) -> dict[str, Any]:
    """The encoder's arguments for `clips` ([l, n_mels] each) with every chunk padded to 2·n_window frames (module
    docstring): what its forward would compute from `feature_lens` in a call holding a full chunk."""
    size = 2 * n_window
    device = clips[0].device
    chunks = [piece for clip in clips for piece in clip.split(size)]
    padded = torch.stack([F.pad(p, (0, 0, 0, size - p.shape[0])) for p in chunks]).transpose(1, 2)
    kept = [conv_tokens(p.shape[0]) for p in chunks]
    valid = torch.cat([torch.arange(i * CHUNK_TOKENS, i * CHUNK_TOKENS + n) for i, n in enumerate(kept)])
    windows = []
    for clip in clips:
        n = clip_tokens(clip.shape[0], n_window)
        windows += [min(window, n - start) for start in range(0, n, window)]
    return dict(
        input_features=None,
        feature_lens=torch.tensor([c.shape[0] for c in clips], device=device),
        padded_feature=padded,
        chunk_lengths=torch.tensor([p.shape[0] for p in chunks], device=device),
        valid_indices=valid.to(device),
        cu_seqlens=torch.tensor([0, *windows], device=device).cumsum(0, dtype=torch.int32),
    )


class PackedWhisperFeatures(WhisperFeatures):
    """Each clip's log-mel frames by the directory's feature extractor, as Qwen3OmniMoeProcessor computes them for
    a conversation: its clips zero-padded to the longest of them (the processor's `padding=True`; a clip's last
    frames read past its end), packed 4 frames a row, 2 rows a token, then its length row (module docstring)."""

    def inputs(self, files: tuple[str, ...], rule: EncoderRule, max_image_tokens: int) -> list[torch.Tensor]:
        waves = [waveform_16k(f) for f in files]
        longest = max((w.shape[0] for w in waves), default=0)
        out = []
        for f, wave in zip(files, waves, strict=True):
            samples, rate = soundfile_frames(f)
            rows = audio_tokens(rule, samples, rate) * ROWS_PER_TOKEN
            mel = self.extractor(wave.numpy(), sampling_rate=MEL_RATE, padding="max_length", max_length=longest,
                                 truncation=False, return_tensors="pt")  # fmt: skip
            got = mel["input_features"][0].T.to(torch.float32)
            need = rows * FRAMES_PER_ROW  # at least the clip's frames (8 a token): the rest its quietest value
            got = torch.cat([got, got.min().expand(need - got.shape[0], got.shape[1])]) if got.shape[0] < need else got
            real = float(rule.clips.frames(samples, rate))
            packed = got[:need].reshape(rows, self.width)
            out.append(torch.cat([packed, packed.new_full((CONTEXT_ROWS, self.width), real)]))
        return out
