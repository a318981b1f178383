"""LLaVA: a CLIP or SigLIP tower and its projector (module `vision`, vision.py) feeding a Llama-style decoder
(module `llm`, runtime/models/decoder/); and a composed spec's bare CLIP or SigLIP tower, with a projector of
orch's into the LLM's width; their images by the tower's own image processor (processing.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from torch import nn

from orch.planner.errors import SpecError
from orch.planner.hf_config import VISION_TYPES, default_feature_layer, select_strategy
from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.decoder import wrap_language_model
from orch.runtime.models.hf.module import HFModule
from orch.runtime.models.hf.projector import projector_on_meta
from orch.runtime.models.llava.processing import TowerImages
from orch.runtime.models.llava.vision import HFVisionEncoder


def wrap(full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
    assert spec.hf is not None
    config: Any = full.config
    if config.model_type in VISION_TYPES:
        return _bare_tower(full, spec, llm_hidden)
    if spec.hf.part == "text":
        return wrap_language_model(full)
    base: Any = full.model
    if spec.hf.part != "vision" or not hasattr(base, "vision_tower"):
        raise SpecError(f"{config.name_or_path}/config.json", spec.hf.part, "a LLaVA model gives vision and text")
    return HFVisionEncoder(base.vision_tower, base.multi_modal_projector, config)


def media_processor(spec: ModuleSpec, modality: Modality) -> TowerImages:
    """The tower's images by its own image processor (processing.py)."""
    return TowerImages(spec)


def _bare_tower(full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
    """A composed spec's CLIP or SigLIP tower with a projector of orch's into the LLM's width."""
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


__all__ = ["HFVisionEncoder", "media_processor", "wrap"]
