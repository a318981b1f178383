"""The router's auxiliary (load-balancing) loss of a Mixture-of-Experts LLM, as transformers computes it where the
config asks for it (`output_router_logits`, weighed by `router_aux_loss_coef`: ModuleSpec.aux_loss_coef).

HF's `load_balancing_loss_func` over the router logits of every MoE layer of a batch (rows r, layers l, experts E,
top-k choices): with f_e the share of the (row, layer) pairs' top-k choices that went to expert e (over rows x
layers) and P_e the mean router probability of e over the same pairs, aux = E x sum_e f_e x P_e; the training
loss adds coef x aux. The softmax runs in the logits' dtype, the sums in float32, as HF's do; only P carries a
gradient (the choices are counts).

HF computes it over the whole batch; orch runs micro-batches on DP ranks, so a step's token shares are not
known when a micro-batch's backward runs. orch's semantics: **aux per micro-batch, weighted by its share of the
step's LLM rows**, aux_step = sum over the step's micro-batches m of (rows_m / rows) x aux(m), where aux(m) is
HF's function on micro-batch m's rows alone. One micro-batch holding the whole batch is HF's own aux; several are
the row-weighted sum of HF's aux of each (tests/distributed/test_moe_aux_loss.py holds both). Under CP a
micro-batch's rows are spread over the CP group: its choice counts and row count are summed over the group in the
forward (one all_reduce per micro-batch), so aux(m) is the whole micro-batch's, each CP rank contributing its own
rows' probabilities. Under TP every TP rank routes the same rows and adds the same term (the router is replicated,
its gradient whole on each). Under PP a micro-batch's layers live on several stages; aux(m) needs every layer's
counts before any stage's backward, so an aux loss under PP is refused (runtime/train/support.py).

The metrics report it apart from the LM loss (`aux_loss`: aux_step, unweighted by coef); the LM loss (`loss`) is
the label tokens' alone, and the objective differentiated is loss + coef x aux_loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from orch.runtime.models.contract import RoutesTokens


@dataclass
class RouterAux:
    coef: float
    experts: int
    top_k: int
    cp_group: Any  # the LLM's CP group on this rank (None without CP): a micro-batch's rows are spread over it

    @staticmethod
    def of(llm: nn.Module, coef: float, experts: int, top_k: int, cp_group: Any) -> RouterAux | None:
        """The aux loss of `llm` (its router logits kept from now on), or None when it has no routed block."""
        blocks = [m for m in llm.modules() if isinstance(m, RoutesTokens)]
        if coef <= 0 or not blocks:
            return None
        for block in blocks:
            block.keeps_logits = True  # type: ignore[attr-defined]
        return RouterAux(coef, experts, top_k, cp_group)

    def micro_batch(self, llm: nn.Module, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(this rank's share of aux(m): differentiable, float32; the same detached in float64) of the micro-batch
        the LLM just ran, from every routed block's logits (taken, so a block's are read once)."""
        logits = [
            lg
            for m in llm.modules()
            if isinstance(m, RoutesTokens)
            for lg in [m.take_router_logits()]
            if lg is not None
        ]
        counts = torch.zeros(self.experts, dtype=torch.float32, device=device)
        probs = torch.zeros(self.experts, dtype=torch.float32, device=device)
        rows = torch.zeros((), dtype=torch.float32, device=device)
        for layer in logits:
            weights = torch.softmax(layer, dim=-1)
            chosen = torch.topk(weights, self.top_k, dim=-1).indices
            counts = counts + torch.bincount(chosen.reshape(-1), minlength=self.experts).to(torch.float32)
            probs = probs + weights.float().sum(0)
            rows = rows + layer.shape[0]
        if self.cp_group is not None:
            totals = torch.cat([counts, rows.view(1)])
            dist.all_reduce(totals, group=self.cp_group)
            counts, rows = totals[:-1], totals[-1]
        if float(rows) == 0:
            zero = probs.sum() * 0
            return zero, zero.detach().double()
        share = (counts / rows * (probs / rows)).sum() * self.experts
        return share, share.detach().double()


def step_rows(layouts: list[Any]) -> int:
    """The step's LLM rows: every sample's sequence length (the weights' denominator)."""
    return sum(layout.length for layout in layouts)
