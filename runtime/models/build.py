"""The modules of a model spec, by where they come from: Hugging Face directories (runtime/models/hf/),
a user's `--model-factory`, or orch's reference transformer."""

from __future__ import annotations

import torch
from torch import nn

from orch.planner.specs import ModelSpec


def build_modules(
    model: ModelSpec, seed: int, dtype: torch.dtype, factory: str | None = None, names: list[str] | None = None
) -> dict[str, nn.Module]:
    """Modules for `names` (default: all). HF modules come back on meta (sharded and filled by
    runtime/parallel/parallelize.py `place`);
    the others full, on the CPU, initialised from the seed in the run's dtype. A module the spec marks
    `trainable: false` comes frozen (`freeze`)."""
    modules: dict[str, nn.Module]
    if any(m.hf is not None for m in model.modules.values()):
        from orch.runtime.models.hf.build import build_hf_modules

        modules = {n: m.to(dtype) for n, m in build_hf_modules(model, names).items()}  # on meta: nothing allocated
    elif factory:
        from orch.runtime.models.factory import build_from_factory

        modules = build_from_factory(factory, model, seed, dtype, names)
    else:
        from orch.runtime.models.reference import build_model

        modules = build_model(model, seed, dtype, names)
    for name, module in modules.items():
        if not model.modules[name].trainable:
            freeze(module)
    return modules


PROJECTORS = ("projector.", "multi_modal_projector.")  # an encoder's projector (orch's reference, LLaVA's names)


def freeze(module: nn.Module) -> None:
    """`trainable: false`: no gradient for the module's weights, except an encoder's projector."""
    for pname, p in module.named_parameters():
        if not pname.startswith(PROJECTORS):
            p.requires_grad_(False)
