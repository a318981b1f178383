"""Build the modules of a model spec derived from Hugging Face directories (runtime/models/registry.py).

Per directory: its config through transformers (`AutoConfig`, local files only), the whole
transformers model of its family's class (`Family.transformers_class`) built with parameters on meta
(runtime/models/hf/meta.py), the LLM's attention switched to orch's varlen attention, and each module the
spec takes from it wrapped in orch's contract by its family (`Family.wrap`).
Nothing is allocated here: runtime/parallel/parallelize.py shards and fills each rank's share once the
plan's layout is known.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from orch.planner.errors import SpecError
from orch.planner.specs import ModelSpec
from orch.runtime.models.hf.attention import register
from orch.runtime.models.hf.meta import meta_parameters
from orch.runtime.models.hf.module import HFModule
from orch.runtime.models.hf.weights import Checkpoint
from orch.runtime.models.registry import family_of_dir

if TYPE_CHECKING:
    from orch.runtime.models.family import Family


def load_config(directory: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise SpecError(str(Path(directory) / "config.json"), "", f"transformers cannot read it: {exc}") from None


def text_config(config: Any) -> Any:
    """The language model's config: a composite's text_config, Qwen2.5-Omni's thinker's, a decoder's own."""
    return config.get_text_config()


def build_full(directory: str, family: Family | None = None) -> nn.Module:
    """The directory's transformers model, parameters on meta, the LLM attending with orch's varlen attention."""
    import transformers

    family = family if family is not None else family_of_dir(directory)
    config = load_config(directory)
    if family.attends_with_orch:
        tc = text_config(config)
        if getattr(tc, "attention_dropout", 0.0):
            raise SpecError(str(Path(directory) / "config.json"), "attention_dropout", "orch trains with 0 here")
        tc._attn_implementation = register()
    with meta_parameters():
        full = getattr(transformers, family.transformers_class)(config)
    return full  # type: ignore[no-any-return]


def build_hf_modules(model: ModelSpec, names: list[str] | None = None) -> dict[str, HFModule]:
    """The wrapped modules for `names` (default: all), on meta, each bound to its weights' source."""
    fulls: dict[str, tuple[Family, nn.Module, Checkpoint | None]] = {}
    out: dict[str, HFModule] = {}
    for name in names if names is not None else list(model.modules):
        hf = model.modules[name].hf
        if hf is None:
            raise SpecError("model", f"modules.{name}.hf", "a model mixing HF and orch modules is not built yet")
        if hf.path not in fulls:
            family = family_of_dir(hf.path)
            full = build_full(hf.path, family)
            fulls[hf.path] = (family, full, Checkpoint.of(hf.path, full))
        family, full, ckpt = fulls[hf.path]
        module = family.wrap(full, model.modules[name], model.llm.hidden)
        std = float(getattr(text_config(full.config), "initializer_range", 0.02))  # type: ignore[attr-defined]
        module.bind(full, ckpt, std)
        if ckpt is not None:
            missing = ckpt.missing(list(module.hf_keys.values()))
            if missing:
                raise SpecError(hf.path, missing[0], f"not in the model's safetensors ({len(missing)} tensors missing)")
        out[name] = module
    return out
