"""Llama-style decoders (llama, qwen2, mistral; the language model of every multimodal family): transformers'
own layers as orch's CausalLM (causal_lm.py)."""

from __future__ import annotations

from typing import Any

from torch import nn

from orch.planner.specs import ModuleSpec
from orch.runtime.models.decoder.causal_lm import HFCausalLM


def wrap_language_model(full: nn.Module) -> HFCausalLM:
    """The language model of a `...ForCausalLM` or of a multimodal model's `language_model`, with its head."""
    config: Any = full.config  # type: ignore[assignment]
    base: Any = full.model
    decoder = getattr(base, "language_model", base)
    return HFCausalLM(decoder, full.lm_head, getattr(config, "text_config", None) or config)  # type: ignore[arg-type]


def wrap(full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFCausalLM:
    return wrap_language_model(full)


__all__ = ["HFCausalLM", "wrap", "wrap_language_model"]
