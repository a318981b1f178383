"""Single-process reference: the whole global batch through the full model, no parallelism.

The equivalence tests compare every parallel plan against this (loss, gradients, parameters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orch.planner.specs import DataSpec, ModelSpec
from orch.runtime.data.batch import encoder_order
from orch.runtime.data.source import BatchSource, ConversationBatch
from orch.runtime.models.build import build_modules
from orch.runtime.train.compute import encode, join_prefix, text_loss
from orch.runtime.train.config import TrainConfig
from orch.runtime.train.optim import build_optimizer, set_lr


@dataclass
class ReferenceResult:
    losses: list[float]  # per step
    grads: dict[str, torch.Tensor]  # "module.param" -> gradient of step 0
    params: dict[str, torch.Tensor]  # "module.param" -> value after the last step


def run_reference(
    model: ModelSpec,
    data: DataSpec,
    *,
    seed: int,
    steps: int,
    dtype: torch.dtype = torch.float64,
    optimizer: str | None = None,
    lr: float | None = None,
    model_factory: str | None = None,
    train: TrainConfig | None = None,
) -> ReferenceResult:
    """`train`: the run's optimizer settings (schedule, clipping, AdamW's); default: TrainConfig's, with
    `optimizer` and `lr` where given."""
    given = {k: v for k, v in (("optimizer", optimizer), ("lr", lr)) if v is not None}
    cfg = train or TrainConfig(steps=steps, **given)
    modules = build_modules(model, seed, dtype, model_factory)
    for name, module in modules.items():  # a module built on meta (Hugging Face's): its weights read here, whole
        if any(p.is_meta for p in module.parameters()):
            module.materialize(torch.device("cpu"), seed, name)  # type: ignore[operator]
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    opt = build_optimizer(modules, cfg)
    assert opt is not None
    batches = BatchSource(model, data, seed)
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}
    for step in range(steps):
        batch = batches.build(cfg.data_step(step))
        if isinstance(batch, ConversationBatch):  # as the ranks agree: media that do not decode train nothing
            batch.decode({e: list(range(batch.size)) for e in encoder_order(model)})
            batch = batch.without(batch.decoded.failed())
        samples = [batch.sample(i, dtype) for i in range(batch.size)]
        encoded = {
            e: encode(modules[e], e, samples, dtype, model.modality(e).frames_per_token) for e in encoder_order(model)
        }
        rows = {e: [batch.projected(e, i) for i in range(batch.size)] for e in encoder_order(model)}
        per_enc = {e: encoded[e].split(rows[e]) for e in encoder_order(model)}
        order, width = encoder_order(model), model.prefix_width
        prefixes = [
            join_prefix([per_enc[e][i] for e in order], width, dtype, torch.device("cpu")) for i in range(batch.size)
        ]
        layouts = [batch.layout(i) for i in range(batch.size)]
        loss = text_loss(modules[model.llm_name], prefixes, samples, batch.label_tokens, layouts=layouts)
        opt.zero_grad()
        loss.backward()
        # A module no sample of this step reached has no gradient here, but a zero one on the ranks (they join
        # the sync with zeros), and AdamW decays a parameter with a zero gradient: the reference does the same.
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if step == 0:
            grads = {
                f"{n}.{pn}": p.grad.detach().clone()
                for n, m in modules.items()
                for pn, p in m.named_parameters()
                if p.grad is not None
            }
        if cfg.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_norm, foreach=False)
        set_lr(opt, cfg, step)
        opt.step()
        losses.append(loss.item())
    final = {f"{n}.{pn}": p.detach().clone() for n, m in modules.items() for pn, p in m.named_parameters()}
    return ReferenceResult(losses, grads, final)
