"""The modules of a model spec, by where they come from: Hugging Face directories (runtime/models/hf/),
a user's `--model-factory`, or orch's reference transformer."""

from __future__ import annotations

import torch
from torch import nn

from orch.planner.specs import ModelSpec


def build_modules(
    model: ModelSpec, seed: int, dtype: torch.dtype, factory: str | None = None, names: list[str] | None = None
) -> dict[str, nn.Module]:
    """Modules for `names` (default: all). HF modules come back on meta (placed by `HFModule.place`);
    the others full, on the CPU, initialised from the seed in the run's dtype."""
    if any(m.hf is not None for m in model.modules.values()):
        from orch.runtime.models.hf.build import build_hf_modules

        return dict(build_hf_modules(model, names))
    if factory:
        from orch.runtime.models.factory import build_from_factory

        return build_from_factory(factory, model, seed, dtype, names)
    from orch.runtime.models.reference import build_model

    return build_model(model, seed, dtype, names)
