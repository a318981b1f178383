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
from typing import Any

import torch

from orch.planner.trace import one_f_one_b_order
from orch.runtime.data.batch import encoder_order
from orch.runtime.parallel.pipeline import MicroBatch
from orch.runtime.parallel.transport import P2P
from orch.runtime.train.compute import encode
from orch.runtime.train.schedules.context import StepContext, StepWork
from orch.runtime.train.schedules.llm import run_llm


def run_graph_1f1b(ctx: StepContext, work: StepWork) -> torch.Tensor:
    """Run this rank's island of the step; returns its summed loss (zero off the LLM's last stage)."""
    model, dtype, device = ctx.model, ctx.dtype, ctx.device
    llm_name, width = model.llm_name, model.llm.hidden
    batch, tables, phases, spans = work.batch, work.tables, work.phases, work.spans
    router = ctx.router
    encs = encoder_order(model)
    t = time.perf_counter()
    inputs = {e: ctx.inputs(e, work) for e in encs}  # world collectives first, same order
    texts = {s.id: s for s in ctx.inputs(llm_name, work)}
    phases["route"] = time.perf_counter() - t
    micro_of: dict[int, int] = {}
    llm_dp = ctx.grids[llm_name].dp
    per_dp = [router.micro_batches(llm_name, tables.held(llm_name, j), batch) for j in range(llm_dp)]
    for mbs in per_dp:
        for mb in mbs:
            micro_of.update(dict.fromkeys(mb.ids, mb.index))
    count = max(len(mbs) for mbs in per_dp)
    members = [frozenset(i for i, m in micro_of.items() if m == k) for k in range(count)]
    table = {e: tables.boundary_table(e) if router.balanced else None for e in encs}
    pending: list[Any] = []

    def p2p(e: str, m: int) -> P2P:
        return P2P(tag=2 * (encs.index(e) * count + m), pending=pending)

    t = time.perf_counter()
    if ctx.stage is not None:
        # The moved rows enter the LLM as leaves; after B(m) their gradients go back edge by edge in
        # reversed encoder order, the order the encoder islands receive them (NCCL has no tags).
        arrived: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}

        def encoder_rows(mb: MicroBatch) -> dict[str, list[torch.Tensor]]:
            out = {}
            for e in encs:
                leaf = torch.zeros(0, width, dtype=dtype, device=device, requires_grad=True)
                got = ctx.boundaries[e].forward(
                    leaf, batch, ctx.rank, ctx.world, table[e], only=members[mb.index], p2p=p2p(e, mb.index)
                )
                rows = got.detach().requires_grad_()
                arrived[(e, mb.index)] = (got, rows)
                out[e] = list(rows.split([batch.projected(e, i) for i in mb.ids]))
            return out

        def send_back(mb: MicroBatch) -> None:
            for e in reversed(encs):
                got, rows = arrived.pop((e, mb.index), (None, None))
                if got is not None and rows is not None:
                    torch.autograd.backward(got, rows.grad if rows.grad is not None else torch.zeros_like(rows))

        loss_sum = run_llm(ctx, work, texts, encoder_rows, send_back)
        phases[f"{llm_name}.fwd_bwd"] = time.perf_counter() - t
    else:
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        served = [e for e in encs if e in ctx.modules]
        moved: dict[tuple[str, int], torch.Tensor] = {}
        for kind, m in one_f_one_b_order(ctx.grids[llm_name].pp + 1, count)[0]:
            for e in served if kind == "F" else reversed(served):
                t_op = time.perf_counter()
                if kind == "F":
                    chunk = [s for s in inputs[e] if micro_of[s.id] == m]
                    ctx.count_encoder(work.counter, e, chunk)
                    fpt = model.modality(e).frames_per_token
                    out = encode(ctx.modules[e], e, chunk, dtype, fpt, ctx.cp[e])
                    moved[(e, m)] = ctx.boundaries[e].forward(
                        out, batch, ctx.rank, ctx.world, table[e], only=members[m], p2p=p2p(e, m)
                    )
                else:
                    done = moved.pop((e, m))
                    torch.autograd.backward(done, torch.zeros_like(done))
                now = time.perf_counter()
                key = f"{e}.fwd" if kind == "F" else f"{e}.bwd"
                phases[key] = phases.get(key, 0.0) + now - t_op
                spans.append((e, f"{kind}{m}", t_op, now))
    for w in pending:
        w.wait()
    return loss_sum
