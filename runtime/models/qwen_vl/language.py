"""A Qwen-VL language model (Qwen2-VL's, Qwen2.5-VL's text model) as orch's LLM: transformers' own layers
(`HFCausalLM`), with M-RoPE: each sample's [3, length] positions from its layout (`SequenceLayout.positions`,
runtime/models/qwen_vl/rope.py), this CP rank's share of them under context parallelism; Qwen3-VL's adds the
tower's deepstack features (DeepstackCausalLM)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from orch.runtime.models.decoder.causal_lm import HFCausalLM
from orch.runtime.models.staged import stage_layers

if TYPE_CHECKING:
    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import SequenceLayout


class MRopeCausalLM(HFCausalLM):
    takes_layouts = True  # run_blocks is called with the micro-batch's layouts (runtime/models/contract.py)

    def position_ids(
        self, seqlens: list[int], cp: CPShard | None, layouts: list[SequenceLayout] | None, device: torch.device
    ) -> torch.Tensor:
        """[3, 1, rows]: each sample's positions (text-only: 0..n-1 on every axis)."""
        parts = []
        for i, n in enumerate(seqlens):
            layout = layouts[i] if layouts is not None else None
            full = layout.positions if layout is not None and layout.positions is not None else None
            if full is None:
                length = layout.length if layout is not None else n
                full = torch.arange(length).expand(3, -1)
            parts.append(full[:, cp.mine(i)] if cp is not None else full)
        pos = torch.cat(parts, 1) if parts else torch.zeros(3, 0, dtype=torch.int64)
        return pos.to(device).unsqueeze(1)


class DeepstackCausalLM(MRopeCausalLM):
    """Qwen3-VL's language model: M-RoPE (interleaved, by its own rotary embedding) and deepstack. A vision row
    arrives with its k deepstack features beside it (vision.py); text rows get zeros there, so the features are
    added after layers 0..k-1 on every row, which adds them at the vision positions only, as HF's
    `_deepstack_process` does. They live on the first pipeline stage, which must hold layers 0..k-1."""

    def __init__(self, decoder: nn.Module, lm_head: nn.Module, config: Any, deepstack: int) -> None:
        super().__init__(decoder, lm_head, config)
        self.deepstack = deepstack
        self.width = int(config.hidden_size)

    def keep_stage(self, stage: int, stages: int) -> None:
        first = stage_layers(len(self.layers), stages, 0)
        if self.deepstack > len(first):
            raise ValueError(
                f"the first of {stages} pipeline stages holds {len(first)} layers; Qwen3-VL adds its deepstack "
                f"features after each of its first {self.deepstack}: use fewer stages"
            )
        super().keep_stage(stage, stages)

    def embedding(self) -> nn.Module:
        return _Widened(super().embedding(), self.width * self.deepstack)  # type: ignore[return-value]

    def split_rows(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        if x_TD.shape[1] == self.width:  # a later pipeline stage: the features were added on the first
            return x_TD, None
        return x_TD[:, : self.width], x_TD[:, self.width :]


class _Widened:
    """An embedding whose rows get `extra` zeros (a text row's deepstack features), callable as the embedding."""

    def __init__(self, embed: nn.Module, extra: int) -> None:
        self.embed, self.extra = embed, extra

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return F.pad(self.embed(ids), (0, self.extra))

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.embed.parameters()
