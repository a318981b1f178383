"""Qwen2-Audio: a Whisper-style audio tower and its projector (module `audio`, audio.py) feeding a Qwen2
decoder (module `llm`, runtime/models/decoder/); and a composed spec's bare Whisper encoder, with a projector
of orch's merging `downsample` tokens into one LLM token; their clips by the tower's own feature extractor
(processing.py)."""

from __future__ import annotations

from typing import Any

from torch import nn

from orch.planner.errors import SpecError
from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.decoder import wrap_language_model
from orch.runtime.models.hf.module import HFModule
from orch.runtime.models.hf.projector import projector_on_meta
from orch.runtime.models.qwen2_audio.audio import HFAudioEncoder, HFWhisperEncoder
from orch.runtime.models.qwen2_audio.processing import WhisperFeatures


def media_processor(spec: ModuleSpec, modality: Modality) -> WhisperFeatures:
    """The tower's clips by its own feature extractor (processing.py)."""
    return WhisperFeatures(spec)


def wrap(full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
    assert spec.hf is not None
    config: Any = full.config
    base: Any = full.model
    if config.model_type == "whisper":
        assert spec.clip_tokens is not None
        projector = projector_on_meta(int(config.d_model) * spec.downsample, llm_hidden)
        return HFWhisperEncoder(base.encoder, projector, spec.clip_tokens, spec.downsample, llm_hidden)
    if spec.hf.part == "text":
        return wrap_language_model(full)
    if spec.hf.part != "audio" or not hasattr(base, "audio_tower"):
        raise SpecError(f"{config.name_or_path}/config.json", spec.hf.part, "a Qwen2-Audio model gives audio and text")
    return HFAudioEncoder(base.audio_tower, base.multi_modal_projector, config)


__all__ = ["HFAudioEncoder", "HFWhisperEncoder", "media_processor", "wrap"]
