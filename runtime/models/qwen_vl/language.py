"""A Qwen-VL language model (Qwen2-VL's, Qwen2.5-VL's text model) as orch's LLM: transformers' own layers
(`HFCausalLM`), with M-RoPE: each sample's [3, length] positions from its layout (`SequenceLayout.positions`,
runtime/models/qwen_vl/rope.py), this CP rank's share of them under context parallelism."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from orch.runtime.models.decoder.causal_lm import HFCausalLM

if TYPE_CHECKING:
    from orch.runtime.models.sequence import SequenceLayout
    from orch.runtime.parallel.context import CPShard


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
