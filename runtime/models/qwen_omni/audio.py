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

from orch.runtime.models.hf.module import HFModule, layer_plan
from orch.runtime.models.qwen_omni.media import CONTEXT_ROWS

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import MediaItem


class OmniAudioTower(HFModule):
    is_audio = True
    takes_items = True  # called with each sample's clips (runtime/models/contract.py)

    def __init__(self, tower: nn.Module, config: Any) -> None:
        super().__init__()
        self.audio_tower = tower
        self.output_dim = int(config.text_config.hidden_size)
        # Its bos/eos embedding is for generation only (the forward never reads it): held, exported, not trained,
        # so DDP finds no parameter without a gradient.
        tower.audio_bos_eos_token.requires_grad_(False)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        plan: dict[str, ParallelStyle] = {}
        for i in range(len(self.audio_tower.layers)):
            plan |= layer_plan(f"audio_tower.layers.{i}", ("self_attn.out_proj",), ("fc1",), ("fc2",))
        return plan

    def layer_stack(self) -> nn.Module:
        return self.audio_tower.layers  # type: ignore[no-any-return]

    def after_tp(self, tp: int) -> None:
        # The attention reshapes by its head count: a TP rank holds num_heads / tp of them.
        for layer in self.audio_tower.layers:
            layer.self_attn.num_heads //= tp

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]:
        """The shortest clip, 4 frames (one LLM token), as a sample without items has them (`HasPlaceholder`)."""
        return torch.zeros(4, width, dtype=dtype, device=device), [2], [()]

    def run_layer(self, x_TD: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
        """The tower's first block as it runs in training over samples of `seqlens` tokens, each one clip: its
        attention within each chunk of `n_window` tokens (`orch profile`'s block case, runtime/models/hf/parts.py)."""
        window = int(self.audio_tower.n_window)
        chunks = [min(window, n - start) for n in seqlens for start in range(0, n, window)]
        cu = torch.tensor([0, *chunks], device=x_TD.device).cumsum(0).to(torch.int32)
        return self.audio_tower.layers[0](x_TD, cu_seqlens=cu)[0]  # type: ignore[no-any-return]

    def clips(
        self, feats_TF: torch.Tensor, seqlens: list[int], items: Sequence[Sequence[MediaItem]] | None
    ) -> list[torch.Tensor]:
        """Each clip's real frames, [l, n_mels], in sample order (module docstring)."""
        per = [[it.patches for it in got] if got else None for got in (items or [None] * len(seqlens))]
        sizes = [sum(c) if c is not None else 2 * n for c, n in zip(per, seqlens, strict=True)]
        out = []
        for sample, rows in zip(feats_TF.split(sizes), per, strict=True):
            if rows is None:
                out += [sample] if sample.shape[0] else []
                continue
            for clip in sample.split(rows):
                tokens = clip.shape[0] - CONTEXT_ROWS
                frames = tokens + int(clip[-1, 0].item())  # the length row: real frames past the token rows
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
        lengths = torch.tensor([c.shape[0] for c in clips], dtype=torch.long, device=feats_TF.device)
        out = self.audio_tower(torch.cat(clips).t(), feature_lens=lengths)
        return out.last_hidden_state  # type: ignore[no-any-return]
