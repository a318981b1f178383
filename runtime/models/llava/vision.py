"""A LLaVA vision tower (CLIP or SigLIP) and its projector as an orch encoder.

orch's encoder contract: packed input rows in, packed LLM-width tokens out. A vision sample's rows are
its images' patches, `image_tokens` per image in row-major order, each row one patch's pixels in the
layout of the tower's patch convolution (channel, row, column): the images are reassembled and run as
transformers runs them, a batch of whole images through the tower's own embeddings and layers (its
attention sees one image, so no mask is needed and the tower keeps its configured attention).

As LLaVA does: the hidden states after `vision_feature_layer` layers (a list: concatenated), CLIP's
class token dropped ("default"), then the multi-modal projector. Layers past the deepest selected one,
the post-layernorm and SigLIP's pooling head never run: they are kept (export returns them) but frozen.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from orch.runtime.models.hf.module import HFModule, layer_plan

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import MediaItem


def _selected(feature_layer: int | list[int], layers: int) -> list[int]:
    picks = feature_layer if isinstance(feature_layer, list) else [feature_layer]
    return [k if k >= 0 else layers + 1 + k for k in picks]


class HFVisionEncoder(HFModule):
    is_audio = False

    def __init__(self, tower: nn.Module, projector: nn.Module, config: Any) -> None:
        super().__init__()
        self.vision_tower = tower
        self.multi_modal_projector = projector
        core = getattr(tower, "vision_model", tower)
        vc = config.vision_config
        self.patch, self.channels = int(vc.patch_size), int(vc.num_channels)
        self.grid = int(vc.image_size) // self.patch
        self.image_tokens = self.grid * self.grid
        self.picks = _selected(config.vision_feature_layer, len(core.encoder.layers))
        self.drop_cls = config.vision_feature_select_strategy == "default"
        self.output_dim = int(config.text_config.hidden_size)
        self._core_path = "vision_tower.vision_model" if core is not tower else "vision_tower"
        run = max(self.picks)
        for i, layer in enumerate(core.encoder.layers):
            if i >= run:
                layer.requires_grad_(False)
        for unused in ("post_layernorm", "head"):
            part = getattr(core, unused, None)
            if isinstance(part, nn.Module):
                part.requires_grad_(False)

    def layer_stack(self) -> nn.Module:
        return self.core.encoder.layers  # type: ignore[no-any-return]

    def keep_first_layers(self, keep: int) -> None:
        super().keep_first_layers(keep)
        self.picks = [min(k, keep) for k in self.picks]

    @property
    def core(self) -> nn.Module:
        return getattr(self.vision_tower, "vision_model", self.vision_tower)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        plan: dict[str, ParallelStyle] = {}
        for i in range(max(self.picks)):
            plan |= layer_plan(
                f"{self._core_path}.encoder.layers.{i}", ("self_attn.out_proj",), ("mlp.fc1",), ("mlp.fc2",)
            )
        return plan

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]:
        """One black image (`HasPlaceholder`: HF's attention cannot run on an empty batch)."""
        return torch.zeros(self.image_tokens, width, dtype=dtype, device=device), [self.image_tokens], [()]

    def images(self, feats_TF: torch.Tensor) -> torch.Tensor:
        """Packed patch rows [n·g², C·p·p] -> images [n, C, g·p, g·p]."""
        g, p, c = self.grid, self.patch, self.channels
        n = feats_TF.shape[0] // self.image_tokens
        return feats_TF.reshape(n, g, g, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(n, c, g * p, g * p)

    def forward(self, feats_TF: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        if cp is not None:
            raise ValueError("a vision tower of whole images takes no context parallelism")
        core = self.core
        hidden = core.embeddings(self.images(feats_TF))
        pre = getattr(core, "pre_layrnorm", None)
        if pre is not None:
            hidden = pre(hidden)
        states = [hidden]
        for layer in list(core.encoder.layers)[: max(self.picks)]:
            hidden = layer(hidden, None)
            states.append(hidden)
        chosen = [states[k][:, 1:] if self.drop_cls else states[k] for k in self.picks]
        # rows flattened before the projector, so the output is its own tensor, not a view (FSDP2 hooks it)
        return self.multi_modal_projector(torch.cat(chosen, dim=-1).flatten(0, 1))
