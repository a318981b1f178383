"""A reference Block held as a module holds its blocks (`layers`), so data parallelism wraps it as it wraps them
(runtime/parallel/fsdp.py `apply_fsdp`: the block one FSDP2 unit, its holder the root)."""

from __future__ import annotations

import torch
from torch import nn


class OneBlock(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList([block])

    def forward(self, x_TD: torch.Tensor, seqlens: list[int]) -> torch.Tensor:
        return self.layers[0](x_TD, seqlens)  # type: ignore[no-any-return]
