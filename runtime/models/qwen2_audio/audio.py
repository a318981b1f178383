"""Qwen2-Audio's Whisper-style audio tower and its projector as an orch encoder.

orch's encoder contract: packed input rows in (a sample's mel frames, `num_mel_bins` wide), packed LLM-width
tokens out. The tower runs fixed 30 s windows as transformers runs them: each clip on its own, cut into windows
of at most `2 x max_source_positions` frames, each window zero-padded to that length, the positions past its
real frames masked out of the encoder's attention (the mask transformers' Qwen2AudioModel builds from the
processor's `feature_attention_mask`: (l - 1) // 2 + 1 positions of l frames), and of its pooled output only
the clip's own tokens kept before the projector.

A sample's clips come as its `items` (runtime/models/contract.py: one `MediaItem` a clip, its grid (1, 1,
input rows)); a clip's rows are its tokens' frames (4 a token), the 3 frames after them (the stem reads them at
the last positions) and a length row (its real frames past the token rows: media.py `CONTEXT_ROWS`). Without
items (synthetic samples, the start-up calibration) a sample's rows are 2 frames a token, windows of them, and
every frame real.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from orch.runtime.models.qwen2_audio.media import CONTEXT_ROWS
from orch.runtime.models.qwen2_audio.whisper import WhisperLayersModule, length_row, sample_clips

if TYPE_CHECKING:
    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import MediaItem


class HFAudioEncoder(WhisperLayersModule):
    is_audio = True
    takes_items = True  # called with each sample's clips (runtime/models/contract.py)

    def __init__(self, tower: nn.Module, projector: nn.Module, config: Any) -> None:
        super().__init__()
        self.audio_tower = tower
        self.multi_modal_projector = projector
        self.clip_frames = 2 * int(config.audio_config.max_source_positions)
        self.output_dim = int(config.text_config.hidden_size)

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]:
        """A silent clip of 2 frames, one encoder token's as a sample without items has them (`HasPlaceholder`:
        the tower stacks its windows, of which there must be one)."""
        return torch.zeros(2, width, dtype=dtype, device=device), [1], [()]

    def clips(self, feats_TF: torch.Tensor, seqlens: list[int]) -> list[torch.Tensor]:
        """Each sample's frames cut into clips of at most `clip_frames`, in sample order."""
        out = []
        for sample in feats_TF.split([2 * n for n in seqlens]):
            out += list(sample.split(self.clip_frames)) if sample.shape[0] else []
        return out

    def windows(
        self, feats_TF: torch.Tensor, seqlens: list[int], items: Sequence[Sequence[MediaItem]] | None
    ) -> list[tuple[torch.Tensor, int, int]]:
        """Each window the tower runs, in sample order: (its rows, at most `clip_frames`; its real frames; the
        LLM tokens kept of it). A sample with items: each clip's (module docstring); without: its rows cut."""
        w, out = self.clip_frames, []
        for sample, clips in sample_clips(feats_TF, seqlens, items, 2):
            if clips is None:
                for c in sample.split(w) if sample.shape[0] else []:
                    real = (c.shape[0] - 1) // 2 + 1
                    out.append((c, c.shape[0], (real - 2) // 2 + 1))
                continue
            for clip in clips:
                tokens, after = clip[:-CONTEXT_ROWS], clip[-CONTEXT_ROWS:-1]
                frames = tokens.shape[0] + length_row(clip)  # the length row: real frames past the tokens'
                for start in range(0, tokens.shape[0], w):
                    rows = tokens[start : start + w]
                    if start + w >= tokens.shape[0]:  # the clip's last window: the frames after its tokens too
                        rows = torch.cat([rows, after])[:w]
                    out.append((rows, min(w, frames - start), min(w, tokens.shape[0] - start) // 4))
        return out

    def forward(
        self,
        feats_TF: torch.Tensor,
        seqlens: list[int],
        cp: CPShard | None = None,
        items: Sequence[Sequence[MediaItem]] | None = None,
    ) -> torch.Tensor:
        if cp is not None:
            raise ValueError("an audio tower of fixed clips takes no context parallelism")
        from transformers.masking_utils import create_bidirectional_mask

        windows = self.windows(feats_TF, seqlens, items)
        frames = torch.stack([F.pad(c.t(), (0, self.clip_frames - c.shape[0])) for c, _, _ in windows])
        positions = self.clip_frames // 2
        real = torch.tensor([(n - 1) // 2 + 1 for _, n, _ in windows], device=feats_TF.device)
        mask_2d = (torch.arange(positions, device=feats_TF.device)[None, :] < real[:, None]).long()
        dummy = feats_TF.new_zeros(len(windows), positions, 1)
        mask = create_bidirectional_mask(config=self.audio_tower.config, inputs_embeds=dummy, attention_mask=mask_2d)
        hidden = self.audio_tower(frames, attention_mask=mask).last_hidden_state
        projected = self.multi_modal_projector(hidden)
        return torch.cat([projected[i, :k] for i, (_, _, k) in enumerate(windows)])


class HFWhisperEncoder(HFAudioEncoder):
    """A composed spec's Whisper encoder with a projector of orch's: every clip padded to 30 s and run whole
    (Whisper's encoder takes no mask: it was trained on padded clips), each clip's own tokens kept, and
    `downsample` consecutive tokens concatenated into one projector input (runtime/models/qwen2_audio/__init__.py)."""

    def __init__(self, encoder: nn.Module, projector: nn.Module, clip_tokens: int, downsample: int, llm_hidden: int):
        nn.Module.__init__(self)
        self.audio_tower = encoder
        self.multi_modal_projector = projector
        self.clip_frames = 2 * clip_tokens
        self.downsample = downsample
        self.output_dim = llm_hidden

    def forward(
        self,
        feats_TF: torch.Tensor,
        seqlens: list[int],
        cp: CPShard | None = None,
        items: Sequence[Sequence[MediaItem]] | None = None,
    ) -> torch.Tensor:
        """A sample's rows cut into windows (its clips, `items`, are not told apart: no context rows)."""
        if cp is not None:
            raise ValueError("an audio tower of fixed clips takes no context parallelism")
        clips = self.clips(feats_TF, seqlens)
        frames = torch.stack([F.pad(c.t(), (0, self.clip_frames - c.shape[0])) for c in clips])
        hidden = self.audio_tower(frames).last_hidden_state  # [clips, clip_frames / 2, d]
        ds = self.downsample
        merged = hidden.reshape(hidden.shape[0], -1, ds * hidden.shape[-1])
        projected = self.multi_modal_projector(merged)
        return torch.cat([projected[i, : c.shape[0] // (2 * ds)] for i, c in enumerate(clips)])
