"""`model_factory: package.module:function` (the --config file; formerly `--model-factory`): users bring their own
encoders, projectors and LLM.

The function is called as `function(model: ModelSpec) -> Mapping[str, nn.Module]`, one module per
name of the model spec, after `torch.manual_seed(seed)`: every rank builds every module the same
way from the seed (then keeps the ones it serves), so initialisation stays a function of the seed
alone, whatever the plan. The modules' contracts are runtime/models/contract.py's:

* an encoder is called as `encoder(feats_TF, seqlens)` on packed variable-length input features
  ([sum of frames, input_dim]; audio has `Modality.frames_per_token` frames per token) and returns its
  tokens projected into the LLM's width, packed ([sum of projected tokens, llm hidden]);
* the LLM has `embed_inputs(prefixes, texts, cp, layouts)`, `run_blocks(x_TD, seqlens, cp)` and
  `text_logits(x_TD, seqlens, layouts, cp)` (and `keep_stage(stage, stages)` for a pipeline): a
  sample's `SequenceLayout` (runtime/sample.py) says where its encoder rows and text go and
  which logits are scored; `embed_packed` and `score_rows` do both. The reference
  `orch.runtime.models.reference.LLM` is the easiest base.

Tensor parallelism takes a module's own `tp_plan()` (PyTorch ParallelStyles by parameter path), and
otherwise shards the reference `Block`s wherever they occur in it; other layers stay replicated over TP.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

import torch
from torch import nn

from orch.planner.errors import SpecError
from orch.planner.specs import Modality, ModelSpec
from orch.runtime.models.contract import missing_llm_methods

Factory = Callable[[ModelSpec], Mapping[str, nn.Module]]
FLAG = "--model-factory"


def load_factory(ref: str) -> Factory:
    """The function named by 'package.module:function'; SpecError (one clear line) if it cannot be had."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(FLAG, "", f"expected package.module:function, got '{ref}'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of the user's module is reported the same way
        raise SpecError(FLAG, "", f"cannot import '{module_name}': {type(exc).__name__}: {exc}") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SpecError(FLAG, "", f"'{module_name}' has no function '{attr}'")
    return fn  # type: ignore[no-any-return]


def build_from_factory(
    ref: str, model: ModelSpec, seed: int, dtype: torch.dtype, names: list[str] | None = None
) -> dict[str, nn.Module]:
    """The factory's modules for `names` (default: all), checked against the contracts, in `dtype`."""
    torch.manual_seed(seed)
    fn = load_factory(ref)
    try:
        got = fn(model)
    except Exception as exc:  # the user's code: one clear line, not a traceback from inside it
        raise SpecError(FLAG, "", f"'{ref}' raised {type(exc).__name__}: {exc}") from None
    if not isinstance(got, Mapping) or set(got) != set(model.modules):
        have = sorted(got) if isinstance(got, Mapping) else type(got).__name__
        raise SpecError(FLAG, "", f"'{ref}' must return one module per name {sorted(model.modules)}, got {have}")
    out: dict[str, nn.Module] = {}
    for name in names if names is not None else list(model.modules):
        module = got[name]
        if not isinstance(module, nn.Module):
            raise SpecError(FLAG, name, f"expected an nn.Module, got {type(module).__name__}")
        if name == model.llm_name:
            missing = missing_llm_methods(module)
            if missing:
                raise SpecError(
                    FLAG, name, f"the LLM lacks {', '.join(missing)} (see orch.runtime.models.reference.LLM)"
                )
        else:
            # What the executor reads of an encoder, derived from the spec when the module does not say.
            if not hasattr(module, "is_audio"):
                module.is_audio = model.modality(name) == Modality.AUDIO
            if not hasattr(module, "output_dim"):
                module.output_dim = model.llm.hidden
        out[name] = module.to(dtype)
    return out
