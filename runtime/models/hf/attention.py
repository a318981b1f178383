"""orch's attention for Hugging Face models, registered in transformers' AttentionInterface.

A decoder layer of a packed micro-batch sees one row of all its samples' tokens ([1, T, ...]). Given
only `position_ids`, transformers' sdpa attention does not keep packed samples apart (measured with
5.24: the second sample's logits change), so orch registers its own implementation and the wrappers
(runtime/models/decoder/causal_lm.py) pass each call the samples' lengths (`orch_seqlens`) and, under context
parallelism, the micro-batch's CP shard (`orch_cp`): attention is computed per sample with
`reference.attend`, CP ranks gathering K/V exactly as the reference model's attention does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from orch.runtime.models.reference import attend

if TYPE_CHECKING:
    from torch import nn

    from orch.runtime.parallel.context import CPShard

NAME = "orch_varlen"


def varlen_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    orch_seqlens: list[int] | None = None,
    orch_cp: CPShard | None = None,
    sliding_window: int | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """query [1, H, T, d], key/value [1, Hkv, T, d] -> ([1, T, H, d], no weights), per packed sample."""
    if dropout:
        raise ValueError("orch_varlen attention has no dropout: set the config's attention_dropout to 0")
    if orch_seqlens is None:
        raise ValueError("orch_varlen attention needs the packed samples' lengths (orch_seqlens)")
    q_THd, k_THd, v_THd = (t[0].transpose(0, 1) for t in (query, key, value))
    group = q_THd.shape[1] // k_THd.shape[1]
    causal = bool(getattr(module, "is_causal", True))
    kv_lens: list[int] = orch_seqlens
    q_pos: list[torch.Tensor | None] = [None] * len(orch_seqlens)
    if orch_cp is not None:
        k_THd, v_THd = orch_cp.gather_kv(k_THd, v_THd)
        kv_lens, q_pos = orch_cp.lens, [orch_cp.mine_on_device(i) for i in range(len(orch_seqlens))]
    outs = [
        attend(q, k, v, group, causal, q_offset=0, q_pos=qp, scale=scaling, window=sliding_window)
        for q, k, v, qp in zip(
            q_THd.split(orch_seqlens), k_THd.split(kv_lens), v_THd.split(kv_lens), q_pos, strict=True
        )
    ]
    y_THd = torch.cat(outs) if outs else q_THd
    return y_THd.unsqueeze(0), None


def register() -> str:
    """Register orch's attention with transformers (idempotent); returns the name configs select it by."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention)
    return NAME
