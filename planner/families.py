"""The model families orch trains from Hugging Face directories: one row each, the one table that the planner's
config reader (planner/hf_config.py, config.json -> ModelSpec without torch) and the runtime's builder
(runtime/models/hf/build.py) both read.

A row says which transformers class holds every part orch takes from a directory of that `model_type`, which
folder under runtime/models/ wraps those parts in orch's module contract (its `wrap(full, spec, llm_hidden)`),
what the directory is to a user, and how its config.json becomes modules. Adding a family is a row here, its
config reader and its folder; nothing under runtime/train/ changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, audio_module, text_module, vision_module
from orch.planner.qwen_vl_config import read_qwen_vl
from orch.planner.specs import HFPart, ModuleSpec


class Role(StrEnum):
    MODEL = "model"  # `--model DIR` alone gives every module (a multimodal model)
    LLM = "llm"  # a language model: `--model DIR` alone (text only), or a composed spec's llm
    TOWER = "tower"  # an encoder source of a composed spec (orch builds its projector)


Reader = Callable[[HFConfig, str], dict[str, ModuleSpec]]


@dataclass(frozen=True)
class Family:
    model_type: str
    transformers_class: str  # the class whose (meta) instance holds every part orch takes
    runtime: str  # the folder under runtime/models/ that wraps the parts (orch.runtime.models.<runtime>.wrap)
    role: Role
    read: Reader | None = None  # config.json -> {module name: spec}; None for a tower (a composed spec reads it)

    @property
    def attends_with_orch(self) -> bool:
        """The language model attends with orch's varlen attention; a bare tower keeps its own (whole images,
        padded clips: no packed sequences cross it)."""
        return self.role != Role.TOWER


def _llava(top: HFConfig, path: str) -> dict[str, ModuleSpec]:
    vision = vision_module(top.sub("vision_config", "llava"), top, HFPart(path=path, part="vision"))
    return {"vision": vision, "llm": text_module(top.sub("text_config", "llava"), HFPart(path=path, part="text"))}


def _qwen2_audio(top: HFConfig, path: str) -> dict[str, ModuleSpec]:
    audio = audio_module(top.sub("audio_config", "qwen2_audio"), HFPart(path=path, part="audio"))
    return {"audio": audio, "llm": text_module(top.sub("text_config", "qwen2_audio"), HFPart(path=path, part="text"))}


def _decoder(top: HFConfig, path: str) -> dict[str, ModuleSpec]:
    return {"llm": text_module(top, HFPart(path=path, part="text"))}


FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("llava", "LlavaForConditionalGeneration", "llava", Role.MODEL, _llava),
        Family("qwen2_audio", "Qwen2AudioForConditionalGeneration", "qwen2_audio", Role.MODEL, _qwen2_audio),
        Family("qwen2_vl", "Qwen2VLForConditionalGeneration", "qwen_vl", Role.MODEL, read_qwen_vl),
        Family("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "qwen_vl", Role.MODEL, read_qwen_vl),
        Family("qwen3_vl", "Qwen3VLForConditionalGeneration", "qwen_vl", Role.MODEL, read_qwen_vl),
        Family("llama", "LlamaForCausalLM", "decoder", Role.LLM, _decoder),
        Family("qwen2", "Qwen2ForCausalLM", "decoder", Role.LLM, _decoder),
        Family("mistral", "MistralForCausalLM", "decoder", Role.LLM, _decoder),
        Family("clip_vision_model", "CLIPVisionModel", "llava", Role.TOWER),
        Family("siglip_vision_model", "SiglipVisionModel", "llava", Role.TOWER),
        Family("whisper", "WhisperForConditionalGeneration", "qwen2_audio", Role.TOWER),  # its encoder
    )
}


def types_of(*roles: Role) -> tuple[str, ...]:
    """The model_types of the families in `roles`, role by role in the order given, each in table order."""
    return tuple(t for role in roles for t, f in FAMILIES.items() if f.role == role)


def family_of(model_type: str | None, source: str, field: str, *roles: Role) -> Family:
    """The family of a config's model_type among `roles`; SpecError naming the supported ones otherwise."""
    allowed = types_of(*roles)
    if model_type not in allowed:
        raise SpecError(source, field, f"'{model_type}' is not supported; expected one of {', '.join(allowed)}")
    return FAMILIES[model_type]
