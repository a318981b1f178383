"""Qwen2.5-Omni's audio tower as an orch encoder: transformers' own `Qwen2_5OmniAudioEncoder` over the packed
clips of many samples.

The tower takes each clip's real log-mel frames only, concatenated, with their counts (`feature_lens`, HF's
from the processor's `feature_attention_mask`): it cuts each clip into chunks of 2·n_window frames, each
chunk attending within itself, pools pairs of the clip's positions and projects them to the LLM's width. No
padded frame reaches it, so many clips of many samples run in one call give each clip what it alone gives.

A sample's clips come as its `items` (runtime/models/contract.py: one `MediaItem` a clip, grid (1, 1, input
rows)); a clip's rows are its tokens' frames (4 a token), the 3 frames after them and a length row holding its
real frames past its token rows (media.py): the clip's frames are the first `l` of its frame rows. Without items
(synthetic samples, the start-up calibration) a sample's rows are one clip of 2 frames a token, every one real.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from orch.runtime.models.qwen2_audio.whisper import WhisperLayersModule, length_row, sample_clips
from orch.runtime.models.qwen_omni.media import CONTEXT_ROWS

if TYPE_CHECKING:
    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import MediaItem


class OmniAudioTower(WhisperLayersModule):
    is_audio = True
    takes_items = True  # called with each sample's clips (runtime/models/contract.py)

    def __init__(self, tower: nn.Module, config: Any) -> None:
        super().__init__()
        self.audio_tower = tower
        self.output_dim = int(config.text_config.hidden_size)
        self.window = int(tower.n_window)  # the tokens a block attends within: a chunk's
        # Its bos/eos embedding is for generation only (the forward never reads it): held, exported, not trained,
        # so DDP finds no parameter without a gradient.
        tower.audio_bos_eos_token.requires_grad_(False)

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]:
        """The shortest clip, 4 frames (one LLM token), as a sample without items has them (`HasPlaceholder`)."""
        return torch.zeros(4, width, dtype=dtype, device=device), [2], [()]

    def run_layer(self, x_TD: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
        """The tower's first block as it runs in training over samples of `seqlens` tokens, each one clip: its
        attention within each `window` of tokens (`orch profile`'s block case, runtime/models/hf/parts.py)."""
        w = self.window
        chunks = [min(w, n - start) for n in seqlens for start in range(0, n, w)]
        cu = torch.tensor([0, *chunks], device=x_TD.device).cumsum(0).to(torch.int32)
        return self.audio_tower.layers[0](x_TD, cu_seqlens=cu)[0]  # type: ignore[no-any-return]

    def clips(
        self, feats_TF: torch.Tensor, seqlens: list[int], items: Sequence[Sequence[MediaItem]] | None
    ) -> list[torch.Tensor]:
        """Each clip's real frames, [l, n_mels], in sample order (module docstring)."""
        out = []
        for sample, clips in sample_clips(feats_TF, seqlens, items, 2):
            if clips is None:
                out += [sample] if sample.shape[0] else []
                continue
            for clip in clips:
                tokens = clip.shape[0] - CONTEXT_ROWS
                frames = tokens + length_row(clip)  # the length row: real frames past the token rows
                out.append(clip[:-1][:frames])
        return out

    def forward(
        self,
        feats_TF: torch.Tensor,
        seqlens: list[int],
        cp: CPShard | None = None,
        items: Sequence[Sequence[MediaItem]] | None = None,
    ) -> torch.Tensor:
        if cp is not None:
            raise ValueError("an audio tower of chunked clips takes no context parallelism")
        clips = self.clips(feats_TF, seqlens, items)
        if not clips:
            return feats_TF.new_zeros(0, self.output_dim)
        return self.encode(clips)

    def encode(self, clips: list[torch.Tensor]) -> torch.Tensor:
        """The tower's tokens of `clips` (their real frames, [l, n_mels] each; at least one), in clip order."""
        lengths = torch.tensor([c.shape[0] for c in clips], dtype=torch.long, device=clips[0].device)
        out = self.audio_tower(torch.cat(clips).t(), feature_lens=lengths)
        return out.last_hidden_state  # type: ignore[no-any-return]
