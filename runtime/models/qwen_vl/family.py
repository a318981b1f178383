"""The Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL; docs/qwen_vl.md): a native-resolution vision tower over
packed images and videos of any size (module `vision`, vision.py) feeding a Qwen decoder with M-RoPE positions
(module `llm`, language.py; positions: rope.py); its config read by config.py, its media counted by media.py and
processed by processing.py. Torch-free at import (runtime/models/family.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig
from orch.planner.model_dir import Role
from orch.planner.specs import Modality, ModelSpec, ModuleSpec
from orch.runtime.models.family import Family, Positions
from orch.runtime.models.qwen_vl.config import read_qwen_vl

if TYPE_CHECKING:
    import torch
    from torch import nn

    from orch.runtime.models.hf.module import HFModule
    from orch.runtime.models.qwen_vl.media import VisionGrids
    from orch.runtime.models.qwen_vl.processing import VisionMedia
    from orch.runtime.sample import MediaItem, SequenceLayout


class QwenVL(Family):
    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.MODEL)

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        return read_qwen_vl(top, path)

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.qwen_vl.language import DeepstackCausalLM, MRopeCausalLM
        from orch.runtime.models.qwen_vl.vision import QwenVisionTower

        assert spec.hf is not None
        config: Any = full.config
        base: Any = full.model
        deepstack = len(getattr(config.vision_config, "deepstack_visual_indexes", None) or ())
        if spec.hf.part == "text" and deepstack:
            return DeepstackCausalLM(base.language_model, full.lm_head, config.text_config, deepstack)
        if spec.hf.part == "text":
            return MRopeCausalLM(base.language_model, full.lm_head, config.text_config)
        if spec.hf.part != "vision":
            raise SpecError(f"{spec.hf.path}/config.json", spec.hf.part, "a Qwen-VL model gives vision and text")
        return QwenVisionTower(base.visual, config)

    def media_processor(self, spec: ModuleSpec, modality: Modality) -> VisionMedia:
        """Each image's and video's patch rows in the order HF's processor gives `pixel_values` (processing.py)."""
        from orch.runtime.models.qwen_vl.processing import VisionMedia

        return VisionMedia(spec)

    def token_rule(self, spec: ModuleSpec, modality: Modality) -> VisionGrids | None:
        """Each image's and video's patch grid from its header, the text around its rows (media.py)."""
        from orch.runtime.models.qwen_vl.media import token_rule

        return token_rule(spec, modality, self.model_type)

    def layout_positions(self, model: ModelSpec) -> Positions:
        """Each sample's M-RoPE positions from its layout and items (rope.py), with the model's merge size and, for
        Qwen2.5-VL, its video time scale (`vision_config.tokens_per_second`)."""
        from orch.planner.hf_config import read_config
        from orch.runtime.models.qwen_vl.rope import mrope_positions

        assert model.llm.hf is not None
        _, config = read_config(model.llm.hf.path)
        vision = config.get("vision_config") or {}
        merge = int(vision.get("spatial_merge_size", 2))
        per_second = vision.get("tokens_per_second", 4) if self.model_type == "qwen2_5_vl" else None

        def positions(layout: SequenceLayout, items: tuple[MediaItem, ...]) -> torch.Tensor:
            return mrope_positions(layout, items, merge, per_second)

        return positions
