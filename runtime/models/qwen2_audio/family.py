"""Qwen2-Audio as a family (a Whisper-style tower and its projector, module `audio`, feeding a Qwen2 decoder,
module `llm`), and a composed spec's bare Whisper encoder with a projector of orch's. Torch-free at import
(runtime/models/family.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, audio_module, text_module
from orch.planner.model_dir import Role
from orch.planner.specs import HFPart, Modality, ModuleSpec
from orch.runtime.models.family import Family

if TYPE_CHECKING:
    from torch import nn

    from orch.runtime.models.hf.module import HFModule
    from orch.runtime.models.qwen2_audio.media import ClipTokens
    from orch.runtime.models.qwen2_audio.processing import WhisperFeatures


# The sub-configs Qwen2AudioConfig builds where config.json names none (transformers 5.24).
AUDIO_CONFIG = dict(model_type="qwen2_audio_encoder")
TEXT_CONFIG = dict(model_type="qwen2")


class _WhisperClips(Family):
    def media_processor(self, spec: ModuleSpec, modality: Modality) -> WhisperFeatures:
        """The tower's clips by its own feature extractor (processing.py)."""
        from orch.runtime.models.qwen2_audio.processing import WhisperFeatures

        return WhisperFeatures(spec)


class Qwen2Audio(_WhisperClips):
    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.MODEL)

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        audio = audio_module(top.sub("audio_config", AUDIO_CONFIG), HFPart(path=path, part="audio"))
        text = text_module(top.sub("text_config", TEXT_CONFIG), HFPart(path=path, part="text"))
        return {"audio": audio, "llm": text}

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.decoder.causal_lm import wrap_language_model
        from orch.runtime.models.qwen2_audio.audio import HFAudioEncoder

        assert spec.hf is not None
        config: Any = full.config
        base: Any = full.model
        if spec.hf.part == "text":
            return wrap_language_model(full)
        if spec.hf.part != "audio" or not hasattr(base, "audio_tower"):
            raise SpecError(
                f"{config.name_or_path}/config.json", spec.hf.part, "a Qwen2-Audio model gives audio and text"
            )
        return HFAudioEncoder(base.audio_tower, base.multi_modal_projector, config)

    def token_rule(self, spec: ModuleSpec, modality: Modality) -> ClipTokens | None:
        """Qwen2-Audio's clips (media.py)."""
        from orch.runtime.models.qwen2_audio.media import token_rule

        return token_rule(spec, modality)


class WhisperTower(_WhisperClips):
    """A composed spec's bare Whisper encoder (part: encoder), `downsample` tokens merged by orch's projector;
    its clips keep the common rule (runtime/data/index.py `audio_tokens`)."""

    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.TOWER)

    def read_source(
        self, top: HFConfig, directory: str, ref: dict[str, Any], rest: dict[str, Any], where: str, source: str
    ) -> ModuleSpec:
        if ref.get("part") != "encoder":
            raise SpecError(
                source, f"{where}.hf.part", "a whisper source is a sequence-to-sequence model: give part: encoder"
            )
        downsample = rest.pop("downsample", 1)
        if not isinstance(downsample, int) or downsample <= 0:
            raise SpecError(source, f"{where}.downsample", f"expected a positive integer, got {downsample!r}")
        return audio_module(top, HFPart(path=directory, part="audio"), downsample)

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.hf.projector import projector_on_meta
        from orch.runtime.models.qwen2_audio.audio import HFWhisperEncoder

        config: Any = full.config
        base: Any = full.model
        assert spec.clip_tokens is not None
        projector = projector_on_meta(int(config.d_model) * spec.downsample, llm_hidden)
        return HFWhisperEncoder(base.encoder, projector, spec.clip_tokens, spec.downsample, llm_hidden)
