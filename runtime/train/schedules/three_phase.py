"""The three-phase step of a homogeneous or colocated plan.

1. encoder forwards of the whole step (inputs moved to their balanced ranks), then one boundary move
   per edge (encoder -> LLM layout, by the composed table Π_llm ∘ B ∘ Π_enc⁻¹ when balancing);
2. the LLM's 1F1B over its micro-batches (one stage when pp == 1), forward and backward, into
   detached boundary leaves on its first stage;
3. boundary backward (the inverse move) and encoder backwards, one edge at a time in reversed model
   order (a fixed collective order on every rank).
"""

from __future__ import annotations

import time

import torch

from orch.runtime.data.batch import encoder_order
from orch.runtime.parallel.pipeline import MicroBatch
from orch.runtime.train.compute import encode
from orch.runtime.train.schedules.context import StepContext, StepWork
from orch.runtime.train.schedules.llm import run_llm


def run_three_phase(ctx: StepContext, work: StepWork) -> torch.Tensor:
    """Run the step's three phases on this rank; returns its summed loss (zero off the LLM's last stage)."""
    model, dtype, device = ctx.model, ctx.dtype, ctx.device
    llm_name, width = model.llm_name, model.llm.hidden
    batch, tables, phases, spans = work.batch, work.tables, work.phases, work.spans
    balanced = ctx.router.balanced
    t = time.perf_counter()
    # Phase 1: encoder forwards (inputs moved to their balanced ranks), then the boundary moves.
    moved: dict[str, torch.Tensor] = {}
    outs: dict[str, torch.Tensor] = {}
    for e in encoder_order(model):
        samples = ctx.inputs(e, work)
        now = time.perf_counter()
        phases[f"{e}.route"] = now - t
        t = now
        if e in ctx.modules:
            ctx.count_encoder(work.counter, e, samples)
            chunks = ctx.router.chunks(e, samples)
            fpt = model.modality(e).frames_per_token
            out = torch.cat([encode(ctx.modules[e], e, c, dtype, fpt, ctx.cp[e]) for c in chunks])
        else:
            out = torch.zeros(0, width, dtype=dtype, device=device)
        outs[e] = out
        now = time.perf_counter()
        phases[f"{e}.fwd"] = now - t
        if e in ctx.modules:
            spans.append((e, "forward", t, now))
        t = now
        table = tables.boundary_table(e) if balanced else None
        moved[e] = ctx.boundaries[e].forward(out, batch, ctx.rank, ctx.world, table)
        now = time.perf_counter()
        phases[f"{e}.boundary"] = now - t
        spans.append((e, "boundary", t, now))
        t = now

    # Phase 2: the LLM's 1F1B over micro-batches; boundary activations are leaves on the first stage
    # that collect the gradients.
    leaves = {e: moved[e].detach().requires_grad_() for e in moved}
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    texts = {s.id: s for s in ctx.inputs(llm_name, work)}
    now = time.perf_counter()
    phases[f"{llm_name}.route"] = now - t
    t = now
    if ctx.stage is not None:
        ids = ctx.router.held(llm_name, tables)
        rows: dict[str, tuple[torch.Tensor, ...]] = {}
        if ctx.stage.is_first:
            rows = {e: leaves[e].split([batch.projected(e, i) for i in ids]) for e in leaves}
        pos = {sid: j for j, sid in enumerate(ids)}

        def encoder_rows(mb: MicroBatch) -> dict[str, list[torch.Tensor]]:
            return {e: [rows[e][pos[i]] for i in mb.ids] for e in rows}

        loss_sum += run_llm(ctx, work, texts, encoder_rows)
    phases[f"{llm_name}.fwd_bwd"] = time.perf_counter() - t
    t = time.perf_counter()

    # Phase 3: boundary backwards and encoder backwards, one edge at a time (a fixed collective order).
    # A hook on the encoder output marks where the boundary backward ends and the encoder's begins.
    for e in reversed(encoder_order(model)):
        t_e = time.perf_counter()
        arrived = [t_e]
        if outs[e].requires_grad:
            outs[e].register_hook(lambda g, a=arrived: a.__setitem__(0, time.perf_counter()))
        grad = leaves[e].grad if leaves[e].grad is not None else torch.zeros_like(leaves[e])
        torch.autograd.backward(moved[e], grad)
        now = time.perf_counter()
        phases[f"{e}.boundary_bwd"] = arrived[0] - t_e
        phases[f"{e}.bwd"] = now - arrived[0]
        spans.append((e, "backward", t_e, now))
    phases["encoders.bwd"] = time.perf_counter() - t
    return loss_sum
