"""A Hugging Face decoder (Llama, Qwen2, Mistral) as orch's LLM: `embed_inputs`, `run_blocks`,
`text_logits` and `keep_stage` over transformers' own embedding, decoder layers, norm and head.

A micro-batch is packed into one row ([1, T, hidden]); positions restart at 0 in every sample (under
CP: this rank's positions of each sample), the rotary embedding is the model's own, and attention is
orch's registered varlen attention (runtime/models/hf/attention.py), which the layers reach through
the config's `_attn_implementation` with the lengths passed as keyword arguments (a family with a
sliding window, Mistral's or Qwen2's, passes its window itself).

Layers live in a ModuleDict keyed by their index, so parameter names ("layers.3.self_attn.q_proj.weight")
are those of the HF model's ModuleList, in the full model and in a stage that keeps layers 2-3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from orch.runtime.models.contract import RoutesTokens
from orch.runtime.models.hf.module import HFModule, layer_plan
from orch.runtime.models.hf.moe import HFSparseMoE, adopt_sparse_blocks
from orch.runtime.models.staged import StagedDecoder

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import SequenceLayout


class HFCausalLM(HFModule, StagedDecoder):
    PARTS = ("embed_tokens", "layers", "norm", "lm_head")

    def __init__(self, decoder: nn.Module, lm_head: nn.Module, config: Any) -> None:
        super().__init__()
        self.embed_tokens: nn.Module | None = decoder.embed_tokens
        self.layers = nn.ModuleDict({str(i): layer for i, layer in enumerate(decoder.layers)})
        adopt_sparse_blocks(self.layers)  # a MoE decoder's sparse blocks, expert-parallel (runtime/models/hf/moe.py)
        self.norm: nn.Module | None = decoder.norm
        self.rotary_emb = decoder.rotary_emb
        self.lm_head: nn.Module | None = lm_head
        # tied as transformers tied them (its config rule differs by family): one Parameter in two places
        self.tied = getattr(lm_head, "weight", None) is getattr(decoder.embed_tokens, "weight", False)

    def tp_plan(self) -> dict[str, ParallelStyle]:
        from torch.distributed.tensor.parallel import SequenceParallel

        plan: dict[str, ParallelStyle] = {}
        for i, layer in self.layers.items():
            # a sparse MoE block stays whole: every TP rank runs its router and experts on the same rows
            dense = not isinstance(layer.mlp, HFSparseMoE)
            mlp_in, mlp_out = (("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",)) if dense else ((), ())
            plan |= layer_plan(f"layers.{i}", ("self_attn.o_proj",), mlp_in, mlp_out)
            # Qwen3's per-head q/k norms see this rank's heads ([1, T, heads, d]): their weights replicated, the
            # gradient summed over the TP group (torchtitan's plan: the heads dim as the sharded "sequence")
            for norm in ("q_norm", "k_norm"):
                if isinstance(getattr(layer.self_attn, norm, None), nn.Module):
                    plan[f"layers.{i}.self_attn.{norm}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        return plan

    def layer_stack(self) -> nn.Module:
        return self.layers

    def position_ids(
        self, seqlens: list[int], cp: CPShard | None, layouts: list[SequenceLayout] | None, device: torch.device
    ) -> torch.Tensor:
        """[1, rows]: positions restarting at 0 in every sample (under CP: this rank's positions of each)."""
        if cp is not None:
            pos = [cp.mine_on_device(i) for i in range(len(seqlens))]
        else:
            pos = [torch.arange(n, device=device) for n in seqlens]
        return (torch.cat(pos) if pos else torch.zeros(0, dtype=torch.int64, device=device)).unsqueeze(0)

    def split_rows(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the hidden rows, features added into them after the first layers, k x width: Qwen3-VL's deepstack;
        none here)."""
        return x_TD, None

    def run_blocks(
        self,
        x_TD: torch.Tensor,
        seqlens: list[int],
        cp: CPShard | None = None,
        layouts: list[SequenceLayout] | None = None,
    ) -> torch.Tensor:
        if x_TD.shape[0] == 0 and cp is None:
            # An empty micro-batch (a resharding FSDP2 module's ranks pad with them: runtime/parallel/fsdp.py) must
            # still call every layer, and HF attention takes no zero-length sequence: the layers run on one zero
            # row, a sequence of its own, dropped after (its gradients are exact zeros).
            out = self.run_blocks(x_TD.new_zeros(1, x_TD.shape[1]), [1])[:0]
            for block in self.modules():  # the zero row routed nothing: no router aux loss of it
                if isinstance(block, RoutesTokens):
                    block.take_router_logits()
            return out
        x_TD, added = self.split_rows(x_TD)
        width = x_TD.shape[1]
        position_ids = self.position_ids(seqlens, cp, layouts, x_TD.device)
        hidden = x_TD.unsqueeze(0)
        rotary = self.rotary_emb(hidden, position_ids=position_ids)
        text_positions = position_ids if position_ids.ndim == 2 else None  # M-RoPE's layers take no 1-D ids
        for key, layer in self.layers.items():
            hidden = layer(
                hidden,
                attention_mask=None,
                position_ids=text_positions,
                position_embeddings=rotary,
                orch_seqlens=seqlens,
                orch_cp=cp,
            )
            i = int(key)
            if added is not None and (i + 1) * width <= added.shape[1]:
                hidden = hidden + added[:, i * width : (i + 1) * width].unsqueeze(0)
        return hidden.squeeze(0)


def wrap_language_model(full: nn.Module) -> HFCausalLM:
    """The language model of a `...ForCausalLM` or of a multimodal model's `language_model`, with its head."""
    config: Any = full.config  # type: ignore[assignment]
    base: Any = full.model
    decoder = getattr(base, "language_model", base)
    return HFCausalLM(decoder, full.lm_head, getattr(config, "text_config", None) or config)  # type: ignore[arg-type]
