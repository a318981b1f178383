"""A Qwen-VL vision tower (Qwen2-VL, Qwen2.5-VL) and its merger as an orch encoder: transformers' own
`...VisionTransformerPretrainedModel` over the packed images and videos of many samples.

A sample's input rows are its items' patches (each `3·temporal_patch·patch²` values, in the order of HF's
`pixel_values`: merge windows contiguous), item after item; the items' grids come with the call (`items`, one
list per sample, every rank knows them from the index). The tower is called once on all of them with their
`grid_thw`, as HF's `get_image_features` calls it: its attention stays inside each item (Qwen2.5-VL's windowed
blocks inside each window of an item), so many samples packed give each sample's rows exactly what it alone
gives, and the result is the merger's rows, `patches / merge²` per item, in the LLM's width. Qwen3-VL's tower
also merges the outputs of its deepstack blocks, each by a merger of its own: those ride along each row
(`[merged, deepstack 1, ..., deepstack k]`, k + 1 times the LLM's width) into the LLM, which adds deepstack
feature i into its hidden states after its layer i (language.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from orch.runtime.models.hf.fused_qkv import GroupedColwise, group_fused_qkv
from orch.runtime.models.hf.module import HFModule
from orch.runtime.sample import MediaItem, grid_items

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.parallel.context import CPShard


# The tower MLP's projections: Qwen2-VL's fc1/fc2, Qwen2.5-VL's gate/up/down (SwiGLU), Qwen3-VL's linear_fc1/fc2.
MLP_IN = ("fc1", "gate_proj", "up_proj", "linear_fc1")
MLP_OUT = ("fc2", "down_proj", "linear_fc2")


class QwenVisionTower(HFModule):
    is_audio = False
    takes_items = True  # called with each sample's MediaItems (runtime/models/contract.py)

    def __init__(self, visual: nn.Module, config: Any) -> None:
        super().__init__()
        self.visual = visual
        vc = config.vision_config
        self.merge = int(vc.spatial_merge_size)
        width = int(getattr(vc, "out_hidden_size", None) or vc.hidden_size)
        self.deepstack = len(getattr(vc, "deepstack_visual_indexes", None) or ())
        self.output_dim = width * (1 + self.deepstack)  # Qwen3-VL: its deepstack features ride along each row
        for block in visual.blocks:  # held by q, k and v group at every TP degree (runtime/models/hf/fused_qkv.py)
            if hasattr(block.attn, "qkv"):  # Qwen2.5-Omni's tower has q, k and v apart
                group_fused_qkv(block.attn)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        """Megatron's split of every block: qkv by heads (GroupedColwise; q, k and v colwise where apart), the
        MLP's input projections colwise, the attention's `proj` and the MLP's last projection rowwise; the patch
        embedding and the mergers (Qwen3-VL's deepstack mergers too) replicated, as every projector is."""
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        plan: dict[str, ParallelStyle] = {}
        for i, block in enumerate(self.visual.blocks):
            at = f"visual.blocks.{i}"
            if hasattr(block.attn, "qkv"):
                plan[f"{at}.attn.qkv"] = GroupedColwise()
            else:
                plan |= {f"{at}.attn.{p}": ColwiseParallel() for p in ("q", "k", "v")}
            plan[f"{at}.attn.proj"] = RowwiseParallel()
            for name in MLP_IN:
                if hasattr(block.mlp, name):
                    plan[f"{at}.mlp.{name}"] = ColwiseParallel()
            for name in MLP_OUT:
                if hasattr(block.mlp, name):
                    plan[f"{at}.mlp.{name}"] = RowwiseParallel()
        return plan

    def after_tp(self, tp: int) -> None:
        # The attention reshapes its qkv output by its head count: a TP rank holds num_heads / tp of them.
        for block in self.visual.blocks:
            block.attn.num_heads //= tp

    def layer_stack(self) -> nn.Module:
        return self.visual.blocks  # type: ignore[no-any-return]

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]:
        """The smallest image, one merge window (`HasPlaceholder`: the tower needs a grid)."""
        d = self.merge * self.merge
        return torch.zeros(d, width, dtype=dtype, device=device), [d], [grid_items(d, d)]

    def forward(
        self,
        feats_TF: torch.Tensor,
        seqlens: list[int],
        cp: CPShard | None = None,
        items: Sequence[Sequence[MediaItem]] | None = None,
    ) -> torch.Tensor:
        if cp is not None:
            raise ValueError("a Qwen-VL vision tower attends within each image: it takes no context parallelism")
        if items is None:
            raise ValueError("a Qwen-VL vision tower needs each sample's image and video grids (items)")
        grids = [it.grid for per in items for it in per]
        if sum(t * h * w for t, h, w in grids) != feats_TF.shape[0]:
            raise ValueError(f"grids of {sum(t * h * w for t, h, w in grids)} patches for {feats_TF.shape[0]} rows")
        grid_thw = torch.tensor(grids, dtype=torch.int64, device=feats_TF.device)
        out = self.visual(feats_TF, grid_thw=grid_thw)
        if not self.deepstack:
            return out.pooler_output  # type: ignore[no-any-return]
        return torch.cat([out.pooler_output, *out.deepstack_features], dim=-1)

    def run_layer(self, x_TD: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
        """The tower's first block as it runs in training over samples of `seqlens` patches, each one image of
        the grid `grid_items` gives (orch profile's block case, runtime/models/hf/parts.py): its rotary
        positions, and its attention inside each image or, for a windowed block (Qwen2.5-VL), each window."""
        from transformers import vision_utils

        from orch.runtime.sample import grid_items

        visual: Any = self.visual
        unit = self.merge * self.merge  # a length not of whole merge windows is padded to them, then cut back
        grids = [it.grid for n in seqlens for it in grid_items(-(-n // unit) * unit, unit)]
        rows = x_TD.shape[0]
        parts = x_TD.split(seqlens)
        x_TD = torch.cat([F.pad(p, (0, 0, 0, -p.shape[0] % unit)) for p in parts]) if parts else x_TD
        grid_thw = torch.tensor(grids, dtype=torch.int64, device=x_TD.device)
        positions = vision_utils.get_vision_position_ids(grid_thw, self.merge)
        rotary = visual.rotary_pos_emb(x_TD, positions)
        cu_seqlens, _ = vision_utils.get_vision_attention_seqlens(grid_thw, visual.config)
        if 0 not in getattr(visual, "fullatt_block_indexes", [0]):  # block 0 attends inside windows
            _, cu_seqlens = vision_utils.get_vision_window_index(
                grid_thw, spatial_merge_size=self.merge, window_size=visual.window_size, patch_size=visual.patch_size
            )
        out = visual.blocks[0](x_TD, cu_seqlens=cu_seqlens, position_embeddings=rotary)
        if out.shape[0] == rows:
            return out  # type: ignore[no-any-return]
        padded = [-(-n // unit) * unit for n in seqlens]
        starts = [sum(padded[:i]) for i in range(len(seqlens))]
        keep = torch.cat([torch.arange(a, a + n) for a, n in zip(starts, seqlens, strict=True)])
        return out[keep.to(out.device)]  # type: ignore[no-any-return]
