"""The LLM's part of a step on this rank: its pipeline stage's 1F1B over its micro-batches, the first stage
fed each sample's encoder rows and text where its layout places them, the last stage scoring the labels."""

from __future__ import annotations

from collections.abc import Callable

import torch

from orch.runtime.data.batch import Sample, encoder_order
from orch.runtime.parallel.context import CPShard
from orch.runtime.parallel.pipeline import MicroBatch
from orch.runtime.sample import scored_labels
from orch.runtime.train.aux_loss import step_rows
from orch.runtime.train.compute import join_prefix, label_loss
from orch.runtime.train.schedules.context import StepContext, StepWork


def run_llm(
    ctx: StepContext,
    work: StepWork,
    texts: dict[int, Sample],
    encoder_rows: Callable[[MicroBatch], dict[str, list[torch.Tensor]]],
    after_backward: Callable[[MicroBatch], None] | None = None,
) -> torch.Tensor:
    """This rank's LLM stage over its micro-batches (1F1B); `encoder_rows` gives the first stage each
    micro-batch's encoder rows per sample, `after_backward` runs after each B (PipelineStage.run).
    Returns the summed loss (last stage; zero elsewhere)."""
    assert ctx.stage is not None
    batch, llm_name = work.batch, ctx.model.llm_name
    calls = ctx.router.calls(llm_name, work.tables)
    micro = ctx.router.micro_batches(llm_name, ctx.router.held(llm_name, work.tables), batch, calls)
    order, width = encoder_order(ctx.model), ctx.model.prefix_width
    rows = step_rows([batch.layout(i) for i in range(batch.size)])  # the router aux loss's weights (aux_loss.py)

    def first_inputs(mb: MicroBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        per_encoder = encoder_rows(mb)
        prefixes = [
            join_prefix([per_encoder[e][j] for e in order], width, ctx.dtype, ctx.device) for j in range(len(mb.ids))
        ]
        work.counter.add(llm_name, dict(zip(mb.ids, mb.seqlens, strict=True)))
        return prefixes, [texts[i].text for i in mb.ids]

    def loss_of(mb: MicroBatch, logits: torch.Tensor, shard: CPShard | None) -> torch.Tensor:
        labels = [texts[i].labels for i in mb.ids]
        layouts = list(mb.layouts)
        # the scored positions' labels (under CP, of this rank's positions only)
        labels = shard.scored_labels(labels, layouts) if shard is not None else scored_labels(labels, layouts)
        empty = torch.zeros(0, dtype=torch.int64, device=logits.device)
        loss = label_loss(logits, torch.cat(labels or [empty]), batch.label_tokens)
        if ctx.aux is None:
            return loss
        share, value = ctx.aux.micro_batch(ctx.modules[llm_name], logits.device)
        weight = mb.rows / rows
        work.aux_sum += weight * float(value)
        return loss + (ctx.aux.coef * weight) * share.to(loss.dtype)

    def on_op(kind: str, m: int) -> None:
        ctx.beat(f"{llm_name} {'forward' if kind == 'F' else 'backward'}")

    run = ctx.stage.run(micro, first_inputs, loss_of, after_backward, on_op)
    work.spans += [(llm_name, op, a, b) for op, a, b in run.spans]
    return run.loss_sum
