"""What the Whisper-style audio towers share (Qwen2-Audio's here, Qwen2.5-Omni's and Qwen3-Omni's in qwen_omni/):
the TP plan, layer stack and after-TP step of an encoder whose `audio_tower.layers` are Whisper encoder layers,
and the cutting of a sample's rows into its clips.

A sample's clips come as its `items` (runtime/models/contract.py: one `MediaItem` a clip, its `patches` the clip's
input rows); each clip's rows end in its length row, whose first value counts the clip's real frames (each family's
media.py says past what). A sample without items (synthetic samples, the start-up calibration) has
`rows_per_token` rows a token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from orch.runtime.models.hf.module import HFModule, layer_plan

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.sample import MediaItem


class WhisperLayersModule(HFModule):
    """An encoder module holding a Whisper-style tower as `audio_tower` (its blocks: `audio_tower.layers`)."""

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


def sample_clips(
    feats_TF: torch.Tensor, seqlens: list[int], items: Sequence[Sequence[MediaItem]] | None, rows_per_token: int
) -> list[tuple[torch.Tensor, list[torch.Tensor] | None]]:
    """Each sample's rows in sample order, with its clips' rows (each ending in its length row), or None for a
    sample without items (module docstring)."""
    per = [[it.patches for it in got] if got else None for got in (items or [None] * len(seqlens))]
    sizes = [sum(c) if c is not None else rows_per_token * n for c, n in zip(per, seqlens, strict=True)]
    return [
        (sample, None if rows is None else list(sample.split(rows)))
        for sample, rows in zip(feats_TF.split(sizes), per, strict=True)
    ]


def length_row(clip: torch.Tensor) -> int:
    """The value of a clip's length row, its last (module docstring)."""
    return int(clip[-1, 0].item())
