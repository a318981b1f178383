"""LLaVA as a family (a CLIP or SigLIP tower and its projector, module `vision`, feeding a Llama-style decoder,
module `llm`), and a composed spec's bare CLIP or SigLIP tower with a projector of orch's. Torch-free at import
(runtime/models/family.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, default_feature_layer, select_strategy, text_module, tower_module
from orch.planner.hf_config import vision_module as llava_vision_module
from orch.planner.model_dir import Role
from orch.planner.specs import HFPart, Modality, ModuleSpec
from orch.runtime.models.family import Family

if TYPE_CHECKING:
    from torch import nn

    from orch.runtime.models.hf.module import HFModule
    from orch.runtime.models.llava.processing import TowerImages


# What LlavaConfig builds where config.json names none (transformers 5.24; tests/unit/test_hf_config.py checks
# them against it): its vision and text sub-configs, and its own fields.
VISION_CONFIG = dict(
    model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
    num_attention_heads=16, image_size=336, patch_size=14,
)  # fmt: skip
TEXT_CONFIG = dict(model_type="llama")  # a named sub-config takes its own family's defaults
LLAVA_DEFAULTS = dict(vision_feature_layer=-2, vision_feature_select_strategy="default")


class _TowerImages(Family):
    def media_processor(self, spec: ModuleSpec, modality: Modality) -> TowerImages:
        """The tower's images by its own image processor (processing.py)."""
        from orch.runtime.models.llava.processing import TowerImages

        return TowerImages(spec)


class Llava(_TowerImages):
    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.MODEL)

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        top = top.with_defaults(LLAVA_DEFAULTS)
        vision = llava_vision_module(top.sub("vision_config", VISION_CONFIG), top, HFPart(path=path, part="vision"))
        return {
            "vision": vision,
            "llm": text_module(top.sub("text_config", TEXT_CONFIG), HFPart(path=path, part="text")),
        }

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.decoder.causal_lm import wrap_language_model
        from orch.runtime.models.llava.vision import HFVisionEncoder

        assert spec.hf is not None
        config: Any = full.config
        if spec.hf.part == "text":
            return wrap_language_model(full)
        base: Any = full.model
        if spec.hf.part != "vision" or not hasattr(base, "vision_tower"):
            raise SpecError(f"{config.name_or_path}/config.json", spec.hf.part, "a LLaVA model gives vision and text")
        return HFVisionEncoder(base.vision_tower, base.multi_modal_projector, config)


class VisionTower(_TowerImages):
    """A composed spec's bare CLIP or SigLIP tower (`feature_layer`: its features' layer, LLaVA's
    vision_feature_layer), with a projector of orch's into the LLM's width."""

    def __init__(self, model_type: str, transformers_class: str) -> None:
        super().__init__(model_type, transformers_class, Role.TOWER)

    def read_source(
        self, top: HFConfig, directory: str, ref: dict[str, Any], rest: dict[str, Any], where: str, source: str
    ) -> ModuleSpec:
        feature = ref.get("feature_layer", default_feature_layer(self.model_type))
        part = HFPart(path=directory, part="vision", feature_layer=feature)
        return tower_module(top, feature, f"{source}: {where}.hf.feature_layer", part)

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        from orch.runtime.models.hf.projector import projector_on_meta
        from orch.runtime.models.llava.vision import HFVisionEncoder

        vc: Any = full.config
        assert spec.hf is not None
        feature = spec.hf.feature_layer if spec.hf.feature_layer is not None else default_feature_layer(vc.model_type)
        config = SimpleNamespace(
            vision_config=vc,
            vision_feature_layer=feature,
            vision_feature_select_strategy=select_strategy(vc.model_type),
            text_config=SimpleNamespace(hidden_size=llm_hidden),
        )
        picks = 1 if isinstance(feature, int) else len(feature)
        return HFVisionEncoder(full, projector_on_meta(int(vc.hidden_size) * picks, llm_hidden), config)
