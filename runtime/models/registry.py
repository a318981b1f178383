"""The one registry of model families: config.json's `model_type` -> the family (runtime/models/family.py) that
reads, builds, wraps and feeds a directory of that type. Nothing else in orch names a family.

Importing it imports no torch: every family.py is torch-free at import. The planner never imports it (the
dependency runs `cli -> runtime -> planner`): the CLI hands `FAMILIES` to `planner.loading.load_model`.
Adding a family is its folder and one line here (docs/model_families.md).
"""

from __future__ import annotations

from pathlib import Path

from orch.planner.errors import SpecError
from orch.planner.hf_config import read_config
from orch.planner.loading import load_model as planner_load_model
from orch.planner.model_dir import read_model_dir
from orch.planner.specs import ModelSpec, ModuleSpec
from orch.runtime.models.decoder.family import Decoder
from orch.runtime.models.family import Family
from orch.runtime.models.internvl.family import InternVL
from orch.runtime.models.llava.family import Llava, VisionTower
from orch.runtime.models.qwen2_audio.family import Qwen2Audio, WhisperTower
from orch.runtime.models.qwen_omni.family import QwenOmni
from orch.runtime.models.qwen_vl.family import QwenVL

FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Llava("llava", "LlavaForConditionalGeneration"),
        Qwen2Audio("qwen2_audio", "Qwen2AudioForConditionalGeneration"),
        QwenVL("qwen2_vl", "Qwen2VLForConditionalGeneration"),
        QwenVL("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
        QwenVL("qwen3_vl", "Qwen3VLForConditionalGeneration"),
        QwenVL("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"),
        QwenOmni("qwen2_5_omni", "Qwen2_5OmniForConditionalGeneration"),
        InternVL("internvl", "InternVLForConditionalGeneration"),
        Decoder("llama", "LlamaForCausalLM"),
        Decoder("qwen2", "Qwen2ForCausalLM"),
        Decoder("mistral", "MistralForCausalLM"),
        VisionTower("clip_vision_model", "CLIPVisionModel"),
        VisionTower("siglip_vision_model", "SiglipVisionModel"),
        WhisperTower("whisper", "WhisperForConditionalGeneration"),  # its encoder
    )
}


def family_of_dir(directory: str) -> Family:
    """The family of a Hugging Face directory, by its config.json's model_type."""
    source, raw = read_config(directory)
    family = FAMILIES.get(str(raw.get("model_type")))
    if family is None:
        raise SpecError(
            source,
            "model_type",
            f"'{raw.get('model_type')}' is not built by the runtime; it builds {', '.join(FAMILIES)}",
        )
    return family


def family_of_spec(spec: ModuleSpec) -> Family | None:
    """The family a module comes from; None for orch's own modules (no `hf` source)."""
    return family_of_dir(spec.hf.path) if spec.hf is not None else None


def model_spec_from_dir(directory: str | Path) -> ModelSpec:
    """The ModelSpec of a Hugging Face model directory, read by its family (planner/model_dir.py)."""
    return read_model_dir(directory, FAMILIES)


def load_model(ref: str) -> ModelSpec:
    """A model spec file, a preset, a Hugging Face model directory or a composed spec (planner/loading.py), its
    directories read through this registry: what `--model` takes."""
    return planner_load_model(ref, FAMILIES)
