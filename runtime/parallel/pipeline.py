"""Pipeline parallelism for the LLM: one rank's stage and its non-interleaved 1F1B schedule.

A stage keeps its contiguous share of the LLM's layers (`LLM.keep_stage`); the first also
embeds (text embedding joined to the boundary's encoder rows), the last also computes the loss.
Micro-batches are packed variable-length sequences whose sizes every stage knows from the
global batch's lengths, so activations and gradients go between neighbouring stages by plain
send/recv of [rows, hidden] with no shape exchange.

The order of one stage is `planner.trace.one_f_one_b_order` (the schedule the planner prices).
Each op's send is posted together with the next op's receive (one `batch_isend_irecv`, as
Megatron pairs send_forward with recv_backward), sends are waited at the end of the step and a
receive is waited at once: a stage only ever waits for data its neighbour produces earlier in
that neighbour's order, so the schedule cannot deadlock, on gloo or on NCCL. Every TP (and CP)
rank of a stage exchanges with the same TP (CP) rank of its neighbour: activations are
replicated over TP, so each pair carries the full tensor.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from orch.planner.trace import one_f_one_b_order
from orch.runtime.models.contract import CausalLM, run_llm_blocks
from orch.runtime.parallel.context import CPGroup, CPShard
from orch.runtime.parallel.grid import Grid
from orch.runtime.sample import SequenceLayout


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of one DP index: its samples (ascending ids) and their LLM lengths."""

    index: int
    ids: tuple[int, ...]
    seqlens: tuple[int, ...]  # LLM tokens per sample: projected encoder tokens + text
    layouts: tuple[SequenceLayout, ...]  # per sample, where its rows go and which logits are scored

    @property
    def rows(self) -> int:
        return sum(self.seqlens)


# First stage: the micro-batch's (prefixes, text ids) per sample. Last stage: its loss from the logits
# of the scored positions it computed (under CP, the shard's: CPShard.scored_labels picks their labels).
FirstInputs = Callable[[MicroBatch], tuple[list[torch.Tensor], list[torch.Tensor]]]
LossOf = Callable[[MicroBatch, torch.Tensor, "CPShard | None"], torch.Tensor]


Transfer = tuple[torch.Tensor, int, int]  # (tensor, peer rank, tag) of one point-to-point message


@dataclass
class StageRun:
    """What one step of a stage produced: the summed loss (last stage) and timed ops."""

    loss_sum: torch.Tensor
    spans: list[tuple[str, float, float]]  # (op such as "F3" / "B0", start, end)


class PipelineStage:
    """This rank's stage of the LLM's pipeline (a single stage when pp == 1)."""

    def __init__(
        self,
        llm: CausalLM,
        grid: Grid,
        rank: int,
        width: int,
        dtype: torch.dtype,
        cp: CPGroup | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        """`device`: where receive buffers and the loss sum live (the rank's device, runtime/device.py)."""
        c = grid.coord(rank)
        assert c is not None, f"rank {rank} does not serve {grid.name}"
        self.llm, self.width, self.dtype, self.cp = llm, width, dtype, cp
        self.device = torch.device(device)
        self.stage, self.stages = c.pp, grid.pp
        self.prev = grid.rank_at(c.pp - 1, c.dp, c.cp, c.tp) if c.pp > 0 else None
        self.next = grid.rank_at(c.pp + 1, c.dp, c.cp, c.tp) if c.pp < grid.pp - 1 else None

    @property
    def is_first(self) -> bool:
        return self.prev is None

    @property
    def is_last(self) -> bool:
        return self.next is None

    def run(
        self,
        micro: list[MicroBatch],
        first_inputs: FirstInputs,
        loss_of: LossOf,
        after_backward: Callable[[MicroBatch], None] | None = None,
        on_op: Callable[[str, int], None] | None = None,
    ) -> StageRun:
        """Forward and backward of every micro-batch in 1F1B order; gradients accumulate in .grad.

        `after_backward(mb)` runs on this stage right after B(mb) (the graph schedule sends the
        boundary gradients of mb there, in a fixed order); `on_op(kind, m)` before each op ("F" or "B" of
        micro-batch m: the rank's heartbeat).
        """
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        spans: list[tuple[str, float, float]] = []
        saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}  # m -> (received input, output or loss)
        sends: list[Any] = []
        carry: Transfer | None = None  # the last op's send, posted with the next op's receive
        for kind, m in one_f_one_b_order(self.stages, len(micro))[self.stage]:
            mb, t0 = micro[m], time.perf_counter()
            if on_op is not None:
                on_op(kind, m)
            if kind == "F":
                saved[m], loss, carry = self._forward(mb, first_inputs, loss_of, carry, sends)
                if loss is not None:
                    loss_sum += loss
            else:
                carry = self._backward(mb, *saved.pop(m), carry, sends)
                if after_backward is not None:
                    after_backward(mb)
            spans.append((f"{kind}{m}", t0, time.perf_counter()))
        self._exchange(carry, None, sends)
        for work in sends:
            work.wait()
        return StageRun(loss_sum, spans)

    def _exchange(self, send: Transfer | None, recv: Transfer | None, sends: list[Any]) -> None:
        """Post the previous op's send together with this op's receive, and wait for the receive.

        One batch_isend_irecv per pair, as Megatron's send_forward_recv_backward: on NCCL a send and
        a receive between the same two ranks issued one after the other can wait on each other;
        issued as one group they cannot. The send's completion is waited at the end of the step.
        """
        ops = []
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send[0], send[1], tag=send[2]))
        if recv is not None:
            ops.append(dist.P2POp(dist.irecv, recv[0], recv[1], tag=recv[2]))
        if not ops:
            return
        works = dist.batch_isend_irecv(ops)
        if send is not None:
            sends.append(works[0])
        if recv is not None:
            works[-1].wait()

    def _forward(
        self, mb: MicroBatch, first_inputs: FirstInputs, loss_of: LossOf, carry: Transfer | None, sends: list[Any]
    ) -> tuple[tuple[torch.Tensor | None, torch.Tensor], torch.Tensor | None, Transfer | None]:
        # Under CP every stage cuts the micro-batch the same way (from the lengths) and passes its shard on.
        shard = self.cp.shard(list(mb.seqlens)) if self.cp is not None else None
        seqlens = shard.local_lens if shard is not None else list(mb.seqlens)
        rows = sum(seqlens)
        received: torch.Tensor | None = None
        if self.is_first:
            self._exchange(carry, None, sends)
            x_TD, got = self.llm.embed_inputs(*first_inputs(mb), shard, list(mb.layouts))
            assert got == seqlens, f"micro-batch {mb.index}: lengths {got} != {seqlens}"
        else:
            assert self.prev is not None
            received = torch.zeros(rows, self.width, dtype=self.dtype, device=self.device)
            # an empty micro-batch (EP pads them) is known empty on both sides: nothing to receive
            self._exchange(carry, (received, self.prev, 2 * mb.index) if rows else None, sends)
            x_TD = received.requires_grad_()
        y_TD = run_llm_blocks(self.llm, x_TD, seqlens, shard, list(mb.layouts))
        if self.is_last:
            loss = loss_of(mb, self.llm.text_logits(y_TD, seqlens, list(mb.layouts), shard), shard)
            return (received, loss), loss.detach().to(torch.float64), None
        assert self.next is not None
        send = (y_TD.detach().contiguous(), self.next, 2 * mb.index) if rows else None
        return (received, y_TD), None, send

    def _backward(
        self, mb: MicroBatch, received: torch.Tensor | None, out: torch.Tensor, carry: Transfer | None, sends: list[Any]
    ) -> Transfer | None:
        # A frozen LLM's micro-batch of text only leaves nothing to differentiate on the first stage.
        if self.is_last:
            self._exchange(carry, None, sends)
            if out.requires_grad:
                out.backward()
        else:
            assert self.next is not None
            grad = torch.zeros_like(out)
            self._exchange(carry, (grad, self.next, 2 * mb.index + 1) if out.shape[0] else None, sends)
            if out.requires_grad:
                torch.autograd.backward(out, grad)
        if received is not None and received.shape[0]:
            assert received.grad is not None and self.prev is not None
            return (received.grad.contiguous(), self.prev, 2 * mb.index + 1)
        return None
