"""The graph-aware 1F1B of a disaggregated plan: the encoder islands are one more pipeline stage.

Encoder work is cut into the LLM's micro-batches (micro-batch m of every LLM DP index at once). An
encoder island runs the first stage's order of a (pp + 1)-stage 1F1B: forward of chunk m, then its
rows go point to point to the LLM's first stage (`transport.P2P`, tag per edge and micro-batch), which
takes them as its F(m) starts; the boundary gradient of m comes back when the LLM's first stage has
run B(m), and the encoder backward of m follows. So the encoders of m + 1 run while the LLM computes
m, and neither island waits for the other's whole step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from orch.planner.routing import RouteTable
from orch.planner.trace import one_f_one_b_order
from orch.runtime.data.batch import Sample, encoder_order
from orch.runtime.parallel.pipeline import MicroBatch
from orch.runtime.parallel.transport import P2P
from orch.runtime.train.compute import encode
from orch.runtime.train.pieces import EncoderPieces
from orch.runtime.train.schedules.context import StepContext, StepWork
from orch.runtime.train.schedules.llm import run_llm


@dataclass
class _Cut:
    """The step cut into the LLM's micro-batches: micro-batch m of every LLM DP index at once."""

    encoders: list[str]
    micro_of: dict[int, int]  # sample id -> its micro-batch
    count: int  # micro-batches
    tables: dict[str, RouteTable | None]  # per encoder: its boundary's table (None: unbalanced)
    rows: dict[str, tuple[int, ...] | None]  # per encoder: its table's units' rows (None: the samples')
    pieces: dict[str, EncoderPieces]  # per encoder balanced by item: its pieces (the units of its table)
    members: list[frozenset[int]] = field(default_factory=list)  # micro-batch -> its sample ids
    pending: list[Any] = field(default_factory=list)  # the point-to-point sends, waited at the end

    def __post_init__(self) -> None:
        self.members = [frozenset(i for i, k in self.micro_of.items() if k == m) for m in range(self.count)]

    def units(self, e: str, m: int) -> frozenset[int]:
        """Micro-batch m's units of encoder e's table: its samples, or their pieces."""
        return self.pieces[e].of_samples(self.members[m]) if e in self.pieces else self.members[m]

    def micro(self, e: str, unit: int) -> int:
        """The micro-batch of a unit of encoder e's table."""
        return self.micro_of[self.pieces[e].sample[unit] if e in self.pieces else unit]

    def p2p(self, e: str, m: int) -> P2P:
        return P2P(tag=2 * (self.encoders.index(e) * self.count + m), pending=self.pending)


def run_graph_1f1b(ctx: StepContext, work: StepWork) -> torch.Tensor:
    """Run this rank's island of the step; returns its summed loss (zero off the LLM's last stage)."""
    llm_name, encs = ctx.model.llm_name, encoder_order(ctx.model)
    t = time.perf_counter()
    ctx.beat("route")
    inputs = {e: ctx.inputs(e, work) for e in encs}  # world collectives first, same order
    texts = {s.id: s for s in ctx.inputs(llm_name, work)}
    work.phases["route"] = time.perf_counter() - t
    calls = ctx.router.calls(llm_name, work.tables)
    per_dp = [
        ctx.router.micro_batches(llm_name, work.tables.held(llm_name, j), work.batch, calls)
        for j in range(ctx.grids[llm_name].dp)
    ]
    micro_of = {i: mb.index for mbs in per_dp for mb in mbs for i in mb.ids}
    balanced = ctx.router.balanced
    cut = _Cut(
        encs, micro_of, max(len(mbs) for mbs in per_dp),
        {e: work.tables.boundary_table(e) if balanced else None for e in encs},
        {e: work.tables.boundary_rows(e, work.batch) if balanced else None for e in encs},
        work.tables.pieces if balanced else {},
    )  # fmt: skip
    if ctx.stage is not None:
        loss_sum = _llm_island(ctx, work, texts, cut)
    else:
        loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
        _encoder_island(ctx, work, inputs, cut)
    for w in cut.pending:
        w.wait()
    return loss_sum


def _llm_island(ctx: StepContext, work: StepWork, texts: dict[int, Sample], cut: _Cut) -> torch.Tensor:
    """The LLM's stages: micro-batch m's encoder rows arrive point to point as its F(m) starts. The moved rows
    enter the LLM as leaves; after B(m) their gradients go back edge by edge in reversed encoder order, the
    order the encoder islands receive them (NCCL has no tags)."""
    batch, width = work.batch, ctx.model.prefix_width
    arrived: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def encoder_rows(mb: MicroBatch) -> dict[str, list[torch.Tensor]]:
        out = {}
        for e in cut.encoders:
            leaf = torch.zeros(0, width, dtype=ctx.dtype, device=ctx.device, requires_grad=True)
            got = ctx.boundaries[e].forward(
                leaf, batch, ctx.rank, ctx.world, cut.tables[e], only=cut.units(e, mb.index),
                p2p=cut.p2p(e, mb.index), rows=cut.rows[e],
            )  # fmt: skip
            rows = got.detach().requires_grad_()
            arrived[(e, mb.index)] = (got, rows)
            out[e] = list(rows.split([batch.projected(e, i) for i in mb.ids]))
        return out

    def send_back(mb: MicroBatch) -> None:
        for e in reversed(cut.encoders):
            got, rows = arrived.pop((e, mb.index), (None, None))
            if got is not None and rows is not None:
                torch.autograd.backward(got, rows.grad if rows.grad is not None else torch.zeros_like(rows))

    t = time.perf_counter()
    loss_sum = run_llm(ctx, work, texts, encoder_rows, send_back)
    work.phases[f"{ctx.model.llm_name}.fwd_bwd"] = time.perf_counter() - t
    return loss_sum


def _encoder_island(ctx: StepContext, work: StepWork, inputs: dict[str, list[Sample]], cut: _Cut) -> None:
    """An encoder island: the first stage's order of a (pp + 1)-stage 1F1B over the micro-batches, each
    forward's rows sent point to point to the LLM's first stage, each backward after its gradient returned."""
    served = [e for e in cut.encoders if e in ctx.modules]
    # under reshard an empty chunk runs the blocks too (on zero rows of the module's input width)
    widths = {e: ctx.model.modules[e].input_dim if ctx.router.calls(e, work.tables) else None for e in served}
    moved: dict[tuple[str, int], torch.Tensor] = {}
    for kind, m in one_f_one_b_order(ctx.grids[ctx.model.llm_name].pp + 1, cut.count)[0]:
        for e in served if kind == "F" else reversed(served):
            ctx.beat(f"{e} {'forward' if kind == 'F' else 'backward'}")
            t_op = time.perf_counter()
            if kind == "F":
                chunk = [s for s in inputs[e] if cut.micro(e, s.id) == m]
                ctx.count_encoder(work.counter, e, chunk, work.tables)
                fpt = ctx.model.modality(e).frames_per_token
                out = encode(ctx.modules[e], e, chunk, ctx.dtype, fpt, ctx.cp[e], widths[e])
                moved[(e, m)] = ctx.boundaries[e].forward(
                    out, work.batch, ctx.rank, ctx.world, cut.tables[e], only=cut.units(e, m), p2p=cut.p2p(e, m),
                    rows=cut.rows[e],
                )  # fmt: skip
            else:
                done = moved.pop((e, m))
                torch.autograd.backward(done, torch.zeros_like(done))
            now = time.perf_counter()
            key = f"{e}.fwd" if kind == "F" else f"{e}.bwd"
            work.phases[key] = work.phases.get(key, 0.0) + now - t_op
            work.spans.append((e, f"{kind}{m}", t_op, now))
