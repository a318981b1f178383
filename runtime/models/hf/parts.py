"""The pieces `orch profile` times of a Hugging Face module: one of its real layers, and the module without
its layers, each called as the reference model's Block and bare module are (runtime/profile/compute.py).

A layer runs as it runs in training: the LLM's decoder layer on a packed row with orch's varlen attention
and the model's rotary positions (HFCausalLM.run_blocks with one layer kept); a vision layer on whole
images of `image_tokens`; an audio layer on clips padded to `clip_tokens` (as the tower pads them); a family's
own `run_layer` where it has one (Qwen-VL's tower: each sample one image, its windows and rotary positions).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from orch.planner.specs import ModelSpec, ModuleSpec
from orch.runtime.models.contract import CausalLM
from orch.runtime.models.hf.build import build_hf_modules
from orch.runtime.models.hf.module import HFModule
from orch.runtime.parallel.parallelize import place


class LayerCase(nn.Module):
    """One layer of an HF module, called as `block(x_TD, seqlens)`."""

    def __init__(self, module: HFModule, spec: ModuleSpec) -> None:
        super().__init__()
        self.module = module
        self.window = spec.image_tokens or spec.clip_tokens  # attention windows of an encoder

    def forward(self, x_TD: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
        if isinstance(self.module, CausalLM):
            return self.module.run_blocks(x_TD, seqlens)
        own = getattr(self.module, "run_layer", None)  # a family that runs its first layer itself (Qwen-VL's tower)
        if callable(own):
            return own(x_TD, seqlens)  # type: ignore[no-any-return]
        assert self.window is not None
        rows = x_TD.shape[0]
        pad = -rows % self.window
        windows = F.pad(x_TD, (0, 0, 0, pad)).view(-1, self.window, x_TD.shape[1])
        out = self.module.layer_stack()[0](windows, None)
        return out.reshape(-1, x_TD.shape[1])[:rows].clone()  # not a view: FSDP2's hooks are on the output


def build_part(
    model: ModelSpec, name: str, layers: int, dtype: torch.dtype, device: torch.device, seed: int, tp_mesh: Any
) -> HFModule:
    """Module `name` with only its first `layers` layers, placed (TP-sharded over `tp_mesh`) and drawn from the seed."""
    module = build_hf_modules(model, [name])[name]
    module.checkpoint = None  # timing needs no trained weights: drawn from the seed
    module.keep_first_layers(layers)
    module.to(dtype)
    place(module, tp_mesh=tp_mesh, device=device, seed=seed, name=name)
    return module


def layer_case(
    model: ModelSpec, name: str, dtype: torch.dtype, device: torch.device, seed: int, tp_mesh: Any
) -> nn.Module:
    return LayerCase(build_part(model, name, 1, dtype, device, seed, tp_mesh), model.modules[name])


def bare_module(
    model: ModelSpec, name: str, dtype: torch.dtype, device: torch.device, seed: int, tp_mesh: Any
) -> nn.Module:
    return build_part(model, name, 0, dtype, device, seed, tp_mesh)
