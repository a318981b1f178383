"""The Llama-style decoders (llama, qwen2, mistral) as a family: a language model alone (`--model DIR`, module
`llm`) or a composed spec's llm. Torch-free at import (runtime/models/family.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orch.planner.hf_config import HFConfig, text_module, ties_embeddings
from orch.planner.model_dir import Role
from orch.planner.specs import HFPart, ModuleSpec
from orch.runtime.models.family import Family

if TYPE_CHECKING:
    from torch import nn

    from orch.runtime.models.decoder.causal_lm import HFCausalLM


class Decoder(Family):
    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.LLM)

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        return {"llm": text_module(top, HFPart(path=path, part="text"))}

    def read_source(
        self, top: HFConfig, directory: str, ref: dict[str, Any], rest: dict[str, Any], where: str, source: str
    ) -> ModuleSpec:
        spec = text_module(top, HFPart(path=directory, part="text"))
        return spec.model_copy(update={"tied_embeddings": ties_embeddings(top.values)})

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFCausalLM:
        from orch.runtime.models.decoder.causal_lm import wrap_language_model

        return wrap_language_model(full)
