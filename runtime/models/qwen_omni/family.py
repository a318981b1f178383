"""Qwen2.5-Omni as a family (runtime/models/qwen_omni/__init__.py): the thinker's audio tower (module `audio`),
vision tower (module `vision`) and language model with TMRoPE positions (module `llm`) out of the directory's
`Qwen2_5OmniForConditionalGeneration`. Torch-free at import (runtime/models/family.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig
from orch.planner.model_dir import Role
from orch.planner.specs import Modality, ModelSpec, ModuleSpec
from orch.runtime.models.family import Family, Positions
from orch.runtime.models.qwen_omni.config import read_qwen_omni

if TYPE_CHECKING:
    import torch
    from torch import nn

    from orch.runtime.models.hf.module import HFModule
    from orch.runtime.models.qwen_omni.media import OmniClips
    from orch.runtime.models.qwen_vl.media import VisionGrids
    from orch.runtime.sample import MediaItem, MediaProcessor, SequenceLayout


class QwenOmni(Family):
    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.MODEL)

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        return read_qwen_omni(top, path)

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.qwen_omni.audio import OmniAudioTower
        from orch.runtime.models.qwen_vl.vision import QwenVisionTower

        assert spec.hf is not None
        thinker: Any = getattr(full, "thinker", full)
        config: Any = thinker.config
        if spec.hf.part == "text":
            return self.wrap_language_model(thinker)
        if spec.hf.part == "vision":
            return QwenVisionTower(thinker.model.visual, config)
        if spec.hf.part == "audio":
            return OmniAudioTower(thinker.model.audio_tower, config)
        raise SpecError(
            f"{spec.hf.path}/config.json", spec.hf.part, "a Qwen2.5-Omni thinker gives audio, vision and text"
        )

    def wrap_language_model(self, thinker: Any) -> HFModule:
        """The thinker's language model and head (a MoE thinker's family overrides this alone)."""
        from orch.runtime.models.qwen_vl.language import MRopeCausalLM

        return MRopeCausalLM(thinker.model.language_model, thinker.lm_head, thinker.config.text_config)

    def media_processor(self, spec: ModuleSpec, modality: Modality) -> MediaProcessor:
        """Clips by the directory's Whisper feature extractor (runtime/models/qwen2_audio/processing.py), images
        and videos by Qwen2.5-VL's patch rows (runtime/models/qwen_vl/processing.py)."""
        if modality == Modality.AUDIO:
            from orch.runtime.models.qwen2_audio.processing import WhisperFeatures

            return WhisperFeatures(spec)
        from orch.runtime.models.qwen_vl.processing import VisionMedia

        return VisionMedia(spec)

    def token_rule(self, spec: ModuleSpec, modality: Modality) -> OmniClips | VisionGrids | None:
        """Each clip's tokens by the processor's formula, each image's and video's grid (media.py)."""
        from orch.runtime.models.qwen_omni.media import token_rule

        return token_rule(spec, modality)

    def layout_positions(self, model: ModelSpec) -> Positions:
        """Each sample's TMRoPE positions from its layout and vision items (rope.py): the thinker's
        `position_id_per_seconds` on a video's time axis, audio and text one position a row."""
        from orch.planner.hf_config import read_config
        from orch.runtime.models.qwen_omni.config import time_axis
        from orch.runtime.models.qwen_omni.rope import omni_positions

        assert model.llm.hf is not None
        per_second, _, merge = time_axis(read_config(model.llm.hf.path)[1])

        def positions(layout: SequenceLayout, items: tuple[MediaItem, ...]) -> torch.Tensor:
            return omni_positions(layout, items, merge, per_second)

        return positions
