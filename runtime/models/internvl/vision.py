"""InternVL's vision side as an orch encoder: the InternViT tower (transformers' InternVLVisionModel) up to
`vision_feature_layer`, its class token dropped, pixel shuffle (InternVLModel's own) and the projector
(InternVLMultiModalProjector), run as InternVLModel.get_image_features runs them.

orch's encoder contract: packed input rows in, packed LLM-width tokens out. A sample's rows are its tiles'
patches, `g²` per tile in row-major order (processing.py); the tiles are reassembled and run as a batch of whole
tiles, each attending within itself (the tower keeps its configured attention), so a tile is the unit the
planner and post-balancing price (`ModuleSpec.image_tokens`).

Tensor parallelism (`tp_plan`, `after_tp`): q, k, v and fc1 colwise, the attention's projection_layer and fc2
rowwise, by heads; the layer norms, layer scales, embeddings and projector replicated. InternViT-6B's q and k
norms (`use_qk_norm`) are RMSNorms over the whole embed width: under TP each rank holds its heads' share of the
width and of the norm's weight, and the squared sum is all-reduced over the TP group (`WidthRMSNorm`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle, RowwiseParallel

from orch.runtime.models.hf.module import HFModule

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import MediaItem


def feature_blocks(feature_layer: int, layers: int) -> int:
    return feature_layer if feature_layer >= 0 else layers + 1 + feature_layer


class WidthRMSNorm(nn.Module):
    """InternViT's q or k norm (InternVLVisionRMSNorm: an RMSNorm over the whole embed width, all heads at once),
    the same weight, whichever way it is held: whole, or sharded by heads under TP (`ShardedWidth`), where each
    rank holds its heads' columns and its share of the weight, and the squared sum over the width is all-reduced
    over the TP group (its backward sums the gradient back: torch.distributed.nn's all_reduce). In float32 and
    below it computes as HF's does (in float32); in float64 in float64, where HF's rounds the norm to float32."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = float(norm.variance_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        # HF's upcast to float32 for half precision; float64 stays float64 (a sum split over TP ranks and rounded to
        # float32 would differ from the whole one's rounding: in float64 both are exact to 1e-9)
        dtype = x.dtype
        x32 = x.to(torch.promote_types(dtype, torch.float32))
        squares = x32.pow(2).sum(-1, keepdim=True)
        width = x.shape[-1]
        weight = self.weight
        if isinstance(weight, DTensor):
            import torch.distributed.nn.functional as dist_nn

            group = weight.device_mesh.get_group()
            squares = dist_nn.all_reduce(squares, group=group)
            width *= weight.device_mesh.size()
            weight = weight.to_local()
        return weight * (x32 * torch.rsqrt(squares / width + self.eps)).to(dtype)


class SettledRowwise(RowwiseParallel):
    """RowwiseParallel whose all-reduced output is a plain tensor: InternViT's layers scale it by a parameter
    (`lambda_1 * attention_output`), which saves it for the backward, and a still-pending AsyncCollectiveTensor has
    no storage to save (the activation meter reads every saved tensor's)."""

    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: nn.Module, outputs: Any,
                           device_mesh: DeviceMesh) -> Any:  # fmt: skip
        from torch.distributed._functional_collectives import AsyncCollectiveTensor

        out = RowwiseParallel._prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh)
        return out.clone() if isinstance(out, AsyncCollectiveTensor) else out


class ShardedWidth(ParallelStyle):
    """TP of a `WidthRMSNorm` after a colwise q or k projection: its weight sharded as the projection's output
    columns (Shard(0): this rank's heads), its input this rank's columns as they come."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import Shard, distribute_module, distribute_tensor

        def shard(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for pname, p in list(mod.named_parameters(recurse=False)):
                sharded = distribute_tensor(p, mesh, [Shard(0)], src_data_rank=self.src_data_rank)
                mod.register_parameter(pname, nn.Parameter(sharded, p.requires_grad))

        return distribute_module(module, device_mesh, shard)


class InternVisionEncoder(HFModule):
    is_audio = False

    def __init__(self, tower: nn.Module, projector: nn.Module, config: Any) -> None:
        super().__init__()
        self.vision_tower = tower
        self.multi_modal_projector = projector
        vc = config.vision_config
        self.patch, self.channels = int(vc.patch_size[0]), int(vc.num_channels)
        self.grid = int(vc.image_size[0]) // self.patch
        self.image_tokens = self.grid * self.grid
        self.ratio = float(config.downsample_ratio)
        self.output_dim = int(config.text_config.hidden_size)
        layers = len(tower.encoder.layer)
        self.run = feature_blocks(int(config.vision_feature_layer), layers)
        self.last = self.run == layers and int(config.vision_feature_layer) == -1  # HF's last_hidden_state: after
        for i, layer in enumerate(tower.encoder.layer):  # the tower's final norm (an Identity under mean pooling)
            if i >= self.run:
                layer.requires_grad_(False)
        if not self.last:
            tower.layernorm.requires_grad_(False)
        self.qk_norm = bool(vc.use_qk_norm)
        if self.qk_norm:  # the same weights, a norm that also runs sharded by heads (WidthRMSNorm)
            for layer in tower.encoder.layer:
                layer.attention.q_norm = WidthRMSNorm(layer.attention.q_norm)
                layer.attention.k_norm = WidthRMSNorm(layer.attention.k_norm)

    def layer_stack(self) -> nn.Module:
        return self.vision_tower.encoder.layer  # type: ignore[no-any-return]

    def block_units(self) -> list[nn.Module]:
        """Its recompute and FSDP units (`NamesBlocks`): the tower's layers (HF names their list `layer`)."""
        return list(self.vision_tower.encoder.layer)

    def keep_first_layers(self, keep: int) -> None:
        super().keep_first_layers(keep)
        self.run, self.last = min(self.run, keep), False

    def tp_plan(self) -> dict[str, ParallelStyle]:
        from torch.distributed.tensor.parallel import ColwiseParallel

        plan: dict[str, ParallelStyle] = {}
        for i in range(self.run):
            at = f"vision_tower.encoder.layer.{i}"
            for name in ("attention.q_proj", "attention.k_proj", "attention.v_proj", "mlp.fc1"):
                plan[f"{at}.{name}"] = ColwiseParallel()
            for name in ("attention.projection_layer", "mlp.fc2"):
                plan[f"{at}.{name}"] = SettledRowwise()
            if self.qk_norm:
                plan[f"{at}.attention.q_norm"] = ShardedWidth()
                plan[f"{at}.attention.k_norm"] = ShardedWidth()
        return plan

    def after_tp(self, tp: int) -> None:
        """Each attention's reshapes take this rank's heads; a q/k norm its share of the width (module docstring)."""
        for i in range(self.run):
            attention = self.vision_tower.encoder.layer[i].attention
            attention.num_heads //= tp
            attention.embed_dim //= tp

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]:
        """One black tile (`HasPlaceholder`: HF's attention cannot run on an empty batch)."""
        return torch.zeros(self.image_tokens, width, dtype=dtype, device=device), [self.image_tokens], [()]

    def tiles(self, feats_TF: torch.Tensor) -> torch.Tensor:
        """Packed patch rows [n·g², C·p·p] -> tiles [n, C, g·p, g·p]."""
        g, p, c = self.grid, self.patch, self.channels
        n = feats_TF.shape[0] // self.image_tokens
        return feats_TF.reshape(n, g, g, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(n, c, g * p, g * p)

    def forward(self, feats_TF: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        from transformers.models.internvl.modeling_internvl import InternVLModel

        if cp is not None:
            raise ValueError("a tower of whole tiles takes no context parallelism")
        tower = self.vision_tower
        hidden = tower.embeddings(self.tiles(feats_TF))
        for layer in list(tower.encoder.layer)[: self.run]:
            hidden = layer(hidden)
        if self.last:
            hidden = tower.layernorm(hidden)
        hidden = hidden[:, 1:]  # the class token ("default")
        n = hidden.shape[0]
        hidden = hidden.reshape(n, self.grid, self.grid, hidden.shape[-1])
        shuffled = InternVLModel.pixel_shuffle(None, hidden, scale_factor=self.ratio)  # type: ignore[arg-type]
        # rows flattened before the projector, so the output is its own tensor, not a view (FSDP2 hooks it)
        return self.multi_modal_projector(shuffled.reshape(-1, shuffled.shape[-1]))
