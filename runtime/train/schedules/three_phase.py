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
    outs, moved, t = _encoder_forwards(ctx, work)
    # Boundary activations enter the LLM as leaves on its first stage, which collect the gradients.
    leaves = {e: moved[e].detach().requires_grad_() for e in moved}
    loss_sum = _llm_phase(ctx, work, leaves, t)
    _encoder_backwards(ctx, work, outs, moved, leaves)
    return loss_sum


def _encoder_forwards(
    ctx: StepContext, work: StepWork
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], float]:
    """Phase 1: each encoder's forward on its (balanced) samples, then its boundary move into the LLM's layout.
    Returns the encoder outputs, the moved rows, and when the phase ended."""
    model, phases, spans = ctx.model, work.phases, work.spans
    moved: dict[str, torch.Tensor] = {}
    outs: dict[str, torch.Tensor] = {}
    t = time.perf_counter()
    for e in encoder_order(model):
        ctx.beat(f"{e} route")
        samples = ctx.inputs(e, work)
        now = time.perf_counter()
        phases[f"{e}.route"] = now - t
        t = now
        ctx.beat(f"{e} forward")
        if e in ctx.modules:
            ctx.count_encoder(work.counter, e, samples, work.tables)
            fpt = model.modality(e).frames_per_token
            calls = ctx.router.calls(e, work.tables)
            chunks = ctx.router.chunks(e, samples, calls)
            # padded (calls > 0): every chunk, empty or not, runs through the encoder's blocks
            width = model.modules[e].input_dim if calls else None
            outs[e] = torch.cat([encode(ctx.modules[e], e, c, ctx.dtype, fpt, ctx.cp[e], width) for c in chunks])
        else:
            outs[e] = torch.zeros(0, model.prefix_width, dtype=ctx.dtype, device=ctx.device)
        now = time.perf_counter()
        phases[f"{e}.fwd"] = now - t
        if e in ctx.modules:
            spans.append((e, "forward", t, now))
        t = now
        ctx.beat(f"{e} boundary")
        table = work.tables.boundary_table(e) if ctx.router.balanced else None
        rows = work.tables.boundary_rows(e, work.batch) if ctx.router.balanced else None
        moved[e] = ctx.boundaries[e].forward(outs[e], work.batch, ctx.rank, ctx.world, table, rows=rows)
        now = time.perf_counter()
        phases[f"{e}.boundary"] = now - t
        spans.append((e, "boundary", t, now))
        t = now
    return outs, moved, t


def _llm_phase(ctx: StepContext, work: StepWork, leaves: dict[str, torch.Tensor], t: float) -> torch.Tensor:
    """Phase 2: the LLM's 1F1B over its micro-batches, its first stage fed the boundary leaves' rows."""
    llm_name, batch = ctx.model.llm_name, work.batch
    loss_sum = torch.zeros((), dtype=torch.float64, device=ctx.device)
    ctx.beat(f"{llm_name} route")
    texts = {s.id: s for s in ctx.inputs(llm_name, work)}
    now = time.perf_counter()
    work.phases[f"{llm_name}.route"] = now - t
    t = now
    if ctx.stage is not None:
        ids = ctx.router.held(llm_name, work.tables)
        rows: dict[str, tuple[torch.Tensor, ...]] = {}
        if ctx.stage.is_first:
            rows = {e: leaves[e].split([batch.projected(e, i) for i in ids]) for e in leaves}
        pos = {sid: j for j, sid in enumerate(ids)}

        def encoder_rows(mb: MicroBatch) -> dict[str, list[torch.Tensor]]:
            return {e: [rows[e][pos[i]] for i in mb.ids] for e in rows}

        loss_sum += run_llm(ctx, work, texts, encoder_rows)
    work.phases[f"{llm_name}.fwd_bwd"] = time.perf_counter() - t
    return loss_sum


def _encoder_backwards(
    ctx: StepContext,
    work: StepWork,
    outs: dict[str, torch.Tensor],
    moved: dict[str, torch.Tensor],
    leaves: dict[str, torch.Tensor],
) -> None:
    """Phase 3: boundary backwards and encoder backwards, one edge at a time (a fixed collective order). A hook
    on the encoder output marks where the boundary backward ends and the encoder's begins."""
    t = time.perf_counter()
    for e in reversed(encoder_order(ctx.model)):
        ctx.beat(f"{e} backward")
        t_e = time.perf_counter()
        arrived = [t_e]
        if outs[e].requires_grad:
            outs[e].register_hook(lambda g, a=arrived: a.__setitem__(0, time.perf_counter()))
        grad = leaves[e].grad if leaves[e].grad is not None else torch.zeros_like(leaves[e])
        torch.autograd.backward(moved[e], grad)
        now = time.perf_counter()
        work.phases[f"{e}.boundary_bwd"] = arrived[0] - t_e
        work.phases[f"{e}.bwd"] = now - arrived[0]
        work.spans.append((e, "backward", t_e, now))
    work.phases["encoders.bwd"] = time.perf_counter() - t
