"""Build the modules of a model spec derived from Hugging Face directories (planner/hf_config.py).

Per directory: its config through transformers (`AutoConfig`, local files only), the whole
transformers model built with parameters on meta (runtime/models/hf/meta.py), the LLM's attention
switched to orch's varlen attention, and each module the spec takes from it wrapped in orch's contract
(`vision` -> HFVisionEncoder, `audio` -> HFAudioEncoder: the tower and the projector; `text` -> HFCausalLM). Nothing is
allocated here: `HFModule.place` shards and fills each rank's share once the plan's layout is known.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from orch.planner.errors import SpecError
from orch.planner.hf_config import SUPPORTED_TYPES
from orch.planner.specs import ModelSpec, ModuleSpec
from orch.runtime.models.hf.attention import register
from orch.runtime.models.hf.meta import meta_parameters
from orch.runtime.models.hf.module import HFModule
from orch.runtime.models.hf.weights import Checkpoint

# model_type -> the transformers class holding every part orch takes from the directory
MODEL_CLASSES = {
    "llava": "LlavaForConditionalGeneration",
    "qwen2_audio": "Qwen2AudioForConditionalGeneration",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    # bare towers of a composed spec (their projector is orch's)
    "clip_vision_model": "CLIPVisionModel",
    "siglip_vision_model": "SiglipVisionModel",
    "whisper": "WhisperForConditionalGeneration",  # its encoder
}


def load_config(directory: str) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise SpecError(str(Path(directory) / "config.json"), "", f"transformers cannot read it: {exc}") from None


def text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def build_full(directory: str) -> nn.Module:
    """The directory's transformers model, parameters on meta, the LLM attending with orch's varlen attention."""
    import transformers

    config = load_config(directory)
    cls_name = MODEL_CLASSES.get(config.model_type)
    if cls_name is None:
        raise SpecError(
            str(Path(directory) / "config.json"),
            "model_type",
            f"'{config.model_type}' is planned but not built by the runtime yet; it builds {', '.join(MODEL_CLASSES)}",
        )
    if config.model_type in SUPPORTED_TYPES:  # the LLM attends with orch's; bare towers keep their own attention
        tc = text_config(config)
        if getattr(tc, "attention_dropout", 0.0):
            raise SpecError(str(Path(directory) / "config.json"), "attention_dropout", "orch trains with 0 here")
        tc._attn_implementation = register()
    with meta_parameters():
        full = getattr(transformers, cls_name)(config)
    return full  # type: ignore[no-any-return]


class LlavaProjector(nn.Module):
    """The LLaVA-1.5 projector orch builds for a bare vision tower: Linear, GELU, Linear (LLaVA's names)."""

    def __init__(self, vision_width: int, llm_hidden: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(vision_width, llm_hidden)
        self.act = nn.GELU()
        self.linear_2 = nn.Linear(llm_hidden, llm_hidden)

    def forward(self, x: Any) -> Any:
        return self.linear_2(self.act(self.linear_1(x)))


def _bare_tower(full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
    """A composed spec's CLIP or SigLIP tower with a projector of orch's into the LLM's width."""
    from types import SimpleNamespace

    from orch.planner.hf_config import default_feature_layer, select_strategy
    from orch.runtime.models.hf.vision import HFVisionEncoder

    vc = full.config  # type: ignore[attr-defined]
    assert spec.hf is not None
    feature = spec.hf.feature_layer if spec.hf.feature_layer is not None else default_feature_layer(vc.model_type)
    config = SimpleNamespace(
        vision_config=vc,
        vision_feature_layer=feature,
        vision_feature_select_strategy=select_strategy(vc.model_type),
        text_config=SimpleNamespace(hidden_size=llm_hidden),
    )
    picks = 1 if isinstance(feature, int) else len(feature)
    with meta_parameters():
        projector = LlavaProjector(int(vc.hidden_size) * picks, llm_hidden)
    return HFVisionEncoder(full, projector, config)


def _wrap(full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
    from orch.runtime.models.hf.audio import HFAudioEncoder
    from orch.runtime.models.hf.llm import HFCausalLM
    from orch.runtime.models.hf.vision import HFVisionEncoder

    assert spec.hf is not None
    part = spec.hf.part
    config = full.config  # type: ignore[attr-defined]
    if config.model_type in ("clip_vision_model", "siglip_vision_model"):
        return _bare_tower(full, spec, llm_hidden)
    if config.model_type == "whisper":
        from orch.runtime.models.hf.audio import HFWhisperEncoder

        assert spec.clip_tokens is not None
        with meta_parameters():
            projector = LlavaProjector(int(config.d_model) * spec.downsample, llm_hidden)
        return HFWhisperEncoder(full.model.encoder, projector, spec.clip_tokens, spec.downsample, llm_hidden)  # type: ignore[attr-defined]
    base = full.model  # type: ignore[attr-defined]
    if part == "vision":
        if not hasattr(base, "vision_tower"):
            raise SpecError(f"{config.name_or_path}/config.json", "vision_config", "the model has no vision tower")
        return HFVisionEncoder(base.vision_tower, base.multi_modal_projector, config)
    if part == "audio":
        if not hasattr(base, "audio_tower"):
            raise SpecError(f"{config.name_or_path}/config.json", "audio_config", "the model has no audio tower")
        return HFAudioEncoder(base.audio_tower, base.multi_modal_projector, config)
    if part == "text":
        decoder = getattr(base, "language_model", base)
        return HFCausalLM(decoder, full.lm_head, text_config(config))  # type: ignore[attr-defined]
    raise SpecError(f"{config.name_or_path}/config.json", part, "no such part built by the runtime yet")


def build_hf_modules(model: ModelSpec, names: list[str] | None = None) -> dict[str, HFModule]:
    """The wrapped modules for `names` (default: all), on meta, each bound to its weights' source."""
    fulls: dict[str, tuple[nn.Module, Checkpoint | None]] = {}
    out: dict[str, HFModule] = {}
    for name in names if names is not None else list(model.modules):
        hf = model.modules[name].hf
        if hf is None:
            raise SpecError("model", f"modules.{name}.hf", "a model mixing HF and orch modules is not built yet")
        if hf.path not in fulls:
            full = build_full(hf.path)
            fulls[hf.path] = (full, Checkpoint.of(hf.path, full))
        full, ckpt = fulls[hf.path]
        module = _wrap(full, model.modules[name], model.llm.hidden)
        std = float(getattr(text_config(full.config), "initializer_range", 0.02))  # type: ignore[attr-defined]
        module.bind(full, ckpt, std)
        if ckpt is not None:
            missing = ckpt.missing(list(module.hf_keys.values()))
            if missing:
                raise SpecError(hf.path, missing[0], f"not in the model's safetensors ({len(missing)} tensors missing)")
        out[name] = module
    return out
