"""InternVL as a family (an InternViT tower, pixel shuffle and projector over tiles, module `vision`, feeding a
Qwen2 or Llama decoder, module `llm`). Torch-free at import (runtime/models/family.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig
from orch.planner.model_dir import Role
from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.family import Family
from orch.runtime.models.internvl.config import read_internvl

if TYPE_CHECKING:
    from torch import nn

    from orch.runtime.models.hf.module import HFModule
    from orch.runtime.models.internvl.media import Tiles
    from orch.runtime.models.internvl.processing import TileMedia


class InternVL(Family):
    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.MODEL)

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        return read_internvl(top, path)

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.decoder.causal_lm import wrap_language_model
        from orch.runtime.models.internvl.vision import InternVisionEncoder

        assert spec.hf is not None
        if spec.hf.part == "text":
            return wrap_language_model(full)
        if spec.hf.part != "vision":
            raise SpecError(f"{spec.hf.path}/config.json", spec.hf.part, "an InternVL model gives vision and text")
        base: Any = full.model
        return InternVisionEncoder(base.vision_tower, base.multi_modal_projector, full.config)

    def media_processor(self, spec: ModuleSpec, modality: Modality) -> TileMedia:
        """Each image's tiles and each video frame's tile by the directory's image processor (processing.py)."""
        from orch.runtime.models.internvl.processing import TileMedia

        return TileMedia(spec)

    def token_rule(self, spec: ModuleSpec, modality: Modality) -> Tiles | None:
        """Each image's tiles and each video's frames from their headers, the text around their rows (media.py)."""
        from orch.runtime.models.internvl.media import token_rule

        return token_rule(spec, modality)
