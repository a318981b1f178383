"""Build the modules of a model spec derived from Hugging Face directories (planner/hf_config.py).

Per directory: its config through transformers (`AutoConfig`, local files only), the whole
transformers model of its family's class (planner/families.py) built with parameters on meta
(runtime/models/hf/meta.py), the LLM's attention switched to orch's varlen attention, and each module the
spec takes from it wrapped in orch's contract by the family's folder (runtime/models/<family>/ `wrap`).
Nothing is allocated here: runtime/parallel/parallelize.py shards and fills each rank's share once the
plan's layout is known.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Any

from torch import nn

from orch.planner.errors import SpecError
from orch.planner.families import FAMILIES
from orch.planner.hf_config import read_config
from orch.planner.specs import ModelSpec, ModuleSpec
from orch.runtime.models.hf.attention import register
from orch.runtime.models.hf.meta import meta_parameters
from orch.runtime.models.hf.module import HFModule
from orch.runtime.models.hf.weights import Checkpoint


def load_config(directory: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise SpecError(str(Path(directory) / "config.json"), "", f"transformers cannot read it: {exc}") from None


def text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def build_full(directory: str) -> nn.Module:
    """The directory's transformers model, parameters on meta, the LLM attending with orch's varlen attention."""
    import transformers

    config = load_config(directory)
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise SpecError(
            str(Path(directory) / "config.json"),
            "model_type",
            f"'{config.model_type}' is not built by the runtime; it builds {', '.join(FAMILIES)}",
        )
    if family.attends_with_orch:
        tc = text_config(config)
        if getattr(tc, "attention_dropout", 0.0):
            raise SpecError(str(Path(directory) / "config.json"), "attention_dropout", "orch trains with 0 here")
        tc._attn_implementation = register()
    with meta_parameters():
        full = getattr(transformers, family.transformers_class)(config)
    return full  # type: ignore[no-any-return]


def family_module(spec: ModuleSpec) -> ModuleType | None:
    """The folder (runtime/models/<family>/) of the family an HF module comes from, by its config's model_type
    through planner/families.py; None for orch's own modules."""
    if spec.hf is None:
        return None
    _, config = read_config(spec.hf.path)
    return import_module(f"orch.runtime.models.{FAMILIES[str(config.get('model_type'))].runtime}")


def wrap(full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
    """The part `spec` takes of `full`, wrapped in orch's module contract by its family's folder."""
    family = FAMILIES[full.config.model_type]  # type: ignore[attr-defined]
    return import_module(f"orch.runtime.models.{family.runtime}").wrap(full, spec, llm_hidden)  # type: ignore[no-any-return]


def build_hf_modules(model: ModelSpec, names: list[str] | None = None) -> dict[str, HFModule]:
    """The wrapped modules for `names` (default: all), on meta, each bound to its weights' source."""
    fulls: dict[str, tuple[nn.Module, Checkpoint | None]] = {}
    out: dict[str, HFModule] = {}
    for name in names if names is not None else list(model.modules):
        hf = model.modules[name].hf
        if hf is None:
            raise SpecError("model", f"modules.{name}.hf", "a model mixing HF and orch modules is not built yet")
        if hf.path not in fulls:
            full = build_full(hf.path)
            fulls[hf.path] = (full, Checkpoint.of(hf.path, full))
        full, ckpt = fulls[hf.path]
        module = wrap(full, model.modules[name], model.llm.hidden)
        std = float(getattr(text_config(full.config), "initializer_range", 0.02))  # type: ignore[attr-defined]
        module.bind(full, ckpt, std)
        if ckpt is not None:
            missing = ckpt.missing(list(module.hf_keys.values()))
            if missing:
                raise SpecError(hf.path, missing[0], f"not in the model's safetensors ({len(missing)} tensors missing)")
        out[name] = module
    return out
