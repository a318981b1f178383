"""transformers' sparse Mixture-of-Experts blocks as orch's `ExpertBlock` (runtime/models/contract.py), shared by
every family whose decoder has them (Qwen3-VL-MoE's language model; Qwen3-MoE's; Qwen3-Omni's thinker).

Such a block (transformers 5.24: `Qwen3VLMoeTextSparseMoeBlock`, `Qwen3MoeSparseMoeBlock`) is a top-k router
`gate` (its `weight` [experts, hidden]; called on [rows, hidden] it returns the logits, the chosen experts'
weights and their indices: softmax in float32, top-k, renormalised where the model says so, so routing here is
HF's own call) and `experts`, every expert's MLP stacked in two tensors: `gate_up_proj` [experts, 2 x inner,
hidden] (gate rows, then up rows) and `down_proj` [experts, hidden, inner]. The adapter keeps both modules (so
parameter names, `mlp.gate.weight` and `mlp.experts.gate_up_proj`, and HF's export are unchanged) and runs the
block as orch's reference MoE does: (token, choice) rows sorted by expert, through the experts here or, under
expert parallelism, through `exchange` to the ranks holding them. An EP rank keeps its experts as a DTensor
sharded on dim 0 over the EP group (`keep_experts`): its local rows are its experts, the safetensors are read
and a checkpoint written by each rank's slice (runtime/models/hf/weights.py `local_region`), and export gathers
the whole stacked tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from orch.runtime.models.contract import ExpertExchange

# The layout `use_experts_implementation` records on an experts module: what `run_experts` computes.
HF_LAYOUT = {"is_concatenated": True, "is_transposed": False, "has_bias": False, "has_gate": True}


def is_sparse_block(module: nn.Module) -> bool:
    """transformers' sparse MoE block of stacked experts (the layout `HF_LAYOUT`) and a top-k router."""
    experts, gate = getattr(module, "experts", None), getattr(module, "gate", None)
    stacked = isinstance(getattr(experts, "gate_up_proj", None), nn.Parameter)
    return stacked and isinstance(getattr(gate, "top_k", None), int)


class HFSparseMoE(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        experts: Any = block.experts
        odd = {k: getattr(experts, k, v) for k, v in HF_LAYOUT.items() if getattr(experts, k, v) != v}
        if odd:
            raise ValueError(f"{type(experts).__name__}: experts stored as {odd}; orch runs {HF_LAYOUT}")
        self.gate = block.gate
        self.experts = experts
        self.num_experts = int(experts.num_experts)
        self.top_k = int(block.gate.top_k)
        self.exchange: ExpertExchange | None = None
        self.first = 0  # the global index of this rank's first expert
        self.router_logits: torch.Tensor | None = None
        self.keeps_logits = False  # set by the aux loss (runtime/train/aux_loss.py) when the model asks for it

    def keep_experts(self, local: list[int], mesh: Any) -> None:
        """Hold only experts `local` (a contiguous block): the stacked tensors sharded on dim 0 over the EP mesh."""
        from torch.distributed.tensor import Shard, distribute_tensor

        self.first = local[0]
        for name in ("gate_up_proj", "down_proj"):
            p = getattr(self.experts, name)
            setattr(self.experts, name, nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)]), p.requires_grad))

    def take_router_logits(self) -> torch.Tensor | None:
        logits, self.router_logits = self.router_logits, None
        return logits

    def _local(self, name: str) -> torch.Tensor:
        p = getattr(self.experts, name)
        return p.to_local() if hasattr(p, "to_local") else p

    def run_experts(self, x_ND: torch.Tensor, counts: list[int], experts: list[int]) -> torch.Tensor:
        """Rows grouped by expert (counts[i] rows for global expert experts[i]) through those experts, each the
        HF experts module's own math: act(x W_gate) * (x W_up), then W_down; in the experts' dtype (under EP the
        masters stay outside FSDP2's casts, as the reference MoE's)."""
        gate_up, down = self._local("gate_up_proj"), self._local("down_proj")
        act = self.experts.act_fn
        dtype = gate_up.dtype
        outs = []
        for e, part in zip(experts, x_ND.split(counts), strict=True):
            if part.shape[0] == 0:
                outs.append(part)
                continue
            i = e - self.first
            g, u = nn.functional.linear(part.to(dtype), gate_up[i]).chunk(2, dim=-1)
            outs.append(nn.functional.linear(act(g) * u, down[i]).to(x_ND.dtype))
        return torch.cat(outs) if outs else x_ND

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        from orch.runtime.models.reference import run_routed

        shape = hidden.shape
        x_TD = hidden.reshape(-1, shape[-1])
        logits, gates_TK, idx_TK = self.gate(x_TD)
        if self.keeps_logits:  # the last call's (a recompute's forward in backward overwrites what was read)
            self.router_logits = logits
        return run_routed(self, x_TD, idx_TK, gates_TK).view(shape)


def adopt_sparse_blocks(layers: nn.ModuleDict) -> None:
    """Every decoder layer's sparse MoE block (`mlp`) run by an `HFSparseMoE` (its parameters, their names, kept)."""
    for layer in layers.values():
        mlp = getattr(layer, "mlp", None)
        if isinstance(mlp, nn.Module) and is_sparse_block(mlp):
            layer.mlp = HFSparseMoE(mlp)
