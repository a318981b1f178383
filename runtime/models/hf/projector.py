"""The projector orch builds for a composed spec's bare tower (CLIP, SigLIP, Whisper's encoder): LLaVA-1.5's
Linear, GELU, Linear, under LLaVA's parameter names."""

from __future__ import annotations

from typing import Any

from torch import nn

from orch.runtime.models.hf.meta import meta_parameters


class LlavaProjector(nn.Module):
    def __init__(self, in_width: int, llm_hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_width, llm_hidden)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(llm_hidden, llm_hidden)

    def forward(self, x: Any) -> Any:
        return self.linear_2(self.act(self.linear_1(x)))


def projector_on_meta(in_width: int, llm_hidden: int) -> LlavaProjector:
    with meta_parameters():
        return LlavaProjector(in_width, llm_hidden)
