"""Qwen2-Audio's Whisper-style audio tower and its projector as an orch encoder.

orch's encoder contract: packed input rows in (a sample's mel frames, `num_mel_bins` wide, two frames
per encoder token), packed LLM-width tokens out. The tower runs fixed 30 s windows as transformers runs
them: a sample's frames are cut into clips of at most `2 x max_source_positions` frames, each clip
zero-padded to that length, its padded positions masked out of the encoder's attention (the mask
transformers' Qwen2AudioModel builds), and of its pooled output only the clip's own tokens kept
((frames / 2 - 2) // 2 + 1 of them: half its encoder tokens, as orch's data gives every audio sample an
even token count) before the projector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from orch.runtime.models.hf.module import HFModule, layer_plan

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.parallel.context import CPShard


class HFAudioEncoder(HFModule):
    is_audio = True

    def __init__(self, tower: nn.Module, projector: nn.Module, config: Any) -> None:
        super().__init__()
        self.audio_tower = tower
        self.multi_modal_projector = projector
        self.clip_frames = 2 * int(config.audio_config.max_source_positions)
        self.output_dim = int(config.text_config.hidden_size)

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

    def clips(self, feats_TF: torch.Tensor, seqlens: list[int]) -> list[torch.Tensor]:
        """Each sample's frames cut into clips of at most `clip_frames`, in sample order."""
        out = []
        for sample in feats_TF.split([2 * n for n in seqlens]):
            out += list(sample.split(self.clip_frames)) if sample.shape[0] else []
        return out

    def forward(self, feats_TF: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        if cp is not None:
            raise ValueError("an audio tower of fixed clips takes no context parallelism")
        from transformers.masking_utils import create_bidirectional_mask

        clips = self.clips(feats_TF, seqlens)
        frames = torch.stack([F.pad(c.t(), (0, self.clip_frames - c.shape[0])) for c in clips])
        positions = self.clip_frames // 2
        real = torch.tensor([(c.shape[0] - 1) // 2 + 1 for c in clips], device=feats_TF.device)
        mask_2d = (torch.arange(positions, device=feats_TF.device)[None, :] < real[:, None]).long()
        dummy = feats_TF.new_zeros(len(clips), positions, 1)
        mask = create_bidirectional_mask(config=self.audio_tower.config, inputs_embeds=dummy, attention_mask=mask_2d)
        hidden = self.audio_tower(frames, attention_mask=mask).last_hidden_state
        projected = self.multi_modal_projector(hidden)
        keep = ((real - 2) // 2 + 1).tolist()
        return torch.cat([projected[i, :k] for i, k in enumerate(keep)])


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

    def forward(self, feats_TF: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        if cp is not None:
            raise ValueError("an audio tower of fixed clips takes no context parallelism")
        clips = self.clips(feats_TF, seqlens)
        frames = torch.stack([F.pad(c.t(), (0, self.clip_frames - c.shape[0])) for c in clips])
        hidden = self.audio_tower(frames).last_hidden_state  # [clips, clip_frames / 2, d]
        ds = self.downsample
        merged = hidden.reshape(hidden.shape[0], -1, ds * hidden.shape[-1])
        projected = self.multi_modal_projector(merged)
        return torch.cat([projected[i, : c.shape[0] // (2 * ds)] for i, c in enumerate(clips)])
