"""Qwen3-Omni as a family (`model_type: qwen3_omni_moe`; docs/qwen_omni.md): the thinker's audio encoder (module
`audio`, qwen3_audio.py), its Qwen3-VL vision tower with deepstack (module `vision`) and its MoE language model
with TMRoPE positions (module `llm`; its sparse blocks through the shared `HFSparseMoE`), out of the directory's
`Qwen3OmniMoeForConditionalGeneration`. Its config is read by qwen3_config.py, its media counted by
qwen3_media.py. Torch-free at import (runtime/models/family.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig
from orch.planner.specs import Modality, ModelSpec, ModuleSpec
from orch.runtime.models.family import Positions
from orch.runtime.models.qwen_omni.family import QwenOmni
from orch.runtime.models.qwen_omni.qwen3_config import read_qwen3_omni

if TYPE_CHECKING:
    import torch
    from torch import nn

    from orch.runtime.models.hf.module import HFModule
    from orch.runtime.models.qwen_omni.qwen3_media import Omni3Clips, Omni3Grids
    from orch.runtime.sample import MediaItem, MediaProcessor, SequenceLayout


class QwenOmni3(QwenOmni):
    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        return read_qwen3_omni(top, path)

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.qwen_omni.qwen3_audio import Omni3AudioTower

        assert spec.hf is not None
        if spec.hf.part == "audio":
            thinker: Any = getattr(full, "thinker", full)
            return Omni3AudioTower(thinker.model.audio_tower, thinker.config)
        if spec.hf.part not in ("text", "vision"):
            raise SpecError(
                f"{spec.hf.path}/config.json", spec.hf.part, "a Qwen3-Omni thinker gives audio, vision and text"
            )
        return super().wrap(full, spec, llm_hidden)

    def wrap_language_model(self, thinker: Any) -> HFModule:
        """The MoE decoder with Qwen3-VL's deepstack (its sparse blocks adopted by HFCausalLM as `HFSparseMoE`)."""
        from orch.runtime.models.qwen_vl.language import DeepstackCausalLM

        deepstack = len(thinker.config.vision_config.deepstack_visual_indexes)
        return DeepstackCausalLM(thinker.model.language_model, thinker.lm_head, thinker.config.text_config, deepstack)

    def media_processor(self, spec: ModuleSpec, modality: Modality) -> MediaProcessor:
        if modality == Modality.AUDIO:
            from orch.runtime.models.qwen_omni.qwen3_audio import PackedWhisperFeatures

            return PackedWhisperFeatures(spec)
        return super().media_processor(spec, modality)

    def token_rule(self, spec: ModuleSpec, modality: Modality) -> Omni3Clips | Omni3Grids | None:
        from orch.planner.hf_config import read_config
        from orch.runtime.models.qwen_omni.qwen3_config import audio_window, per_second
        from orch.runtime.models.qwen_omni.qwen3_media import token_rule

        if spec.hf is None:
            return None
        top = read_config(spec.hf.path)[1]
        return token_rule(spec, modality, audio_window(top)[0], per_second(top))

    def layout_positions(self, model: ModelSpec) -> Positions:
        """Each sample's TMRoPE positions (rope.py, as for Qwen2.5-Omni) with a sounding video's two bos and two
        eos tokens each a position of its own (Qwen3-Omni's `get_rope_index`)."""
        from orch.planner.hf_config import read_config
        from orch.runtime.models.qwen_omni.qwen3_config import per_second
        from orch.runtime.models.qwen_omni.rope import omni_positions

        assert model.llm.hf is not None
        top = read_config(model.llm.hf.path)[1]
        merge = int(((top.get("thinker_config") or {}).get("vision_config") or {}).get("spatial_merge_size", 2))
        pps = per_second(top)

        def positions(layout: SequenceLayout, items: tuple[MediaItem, ...]) -> torch.Tensor:
            return omni_positions(layout, items, merge, pps, pair_positions=2)

        return positions
