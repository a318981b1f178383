"""Qwen2.5-Omni's config.json read into the thinker's modules without torch: module `audio` (the audio tower,
its average pool and projection to the LLM's width), module `vision` (a Qwen2.5-VL tower: windowed blocks, a
patch merger) and module `llm` (the thinker's Qwen2 decoder). The talker and token2wav are not read: orch trains
the thinker only.

The audio tower runs each clip's log-mel frames in chunks of `2·n_window` frames (`n_window` positions after its
stride-2 conv), each chunk attending within itself: its attention window is `n_window` encoder tokens
(`clip_tokens`; its attention priced per chunk, `window_tokens`: each token meets n_window others in every
block), and an average pool merges 2 tokens into one LLM token. Fields absent take transformers 5.24's
class defaults (`_DEFAULTS`; tests/unit/test_qwen_omni.py checks them against it). The LLM part is
`llm_module`, a function of the thinker's text_config alone, so a thinker with another language model (a MoE)
swaps that function only.
"""

from __future__ import annotations

from typing import Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, decoder_module
from orch.planner.specs import HFPart, Modality, ModuleKind, ModuleSpec
from orch.runtime.models.qwen_vl.config import vision_module

MODEL_TYPES = ("qwen2_5_omni",)

_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_5_omni_thinker": dict(position_id_per_seconds=25, seconds_per_chunk=2, tie_word_embeddings=False),
    "qwen2_5_omni_audio_encoder": dict(
        num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, d_model=1280,
        max_source_positions=1500, n_window=100, output_dim=3584,
    ),
    "qwen2_5_omni_vision_encoder": dict(
        depth=32, hidden_size=3584, intermediate_size=3420, num_heads=16, in_channels=3, patch_size=14,
        spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=3584,
        fullatt_block_indexes=[7, 15, 23, 31],
    ),
    "qwen2_5_omni_text": dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4,
    ),
}  # fmt: skip


def sub_config(
    parent: HFConfig, name: str, model_type: str, defaults: dict[str, dict[str, Any]] | None = None
) -> HFConfig:
    """Sub-config `name` of `parent` (the top's thinker_config, the thinker's audio/vision/text_config) with its
    class defaults (`defaults`, this module's `_DEFAULTS` where not given: Qwen3-Omni's reader passes its own);
    a model_type other than the class's is refused, naming the field."""
    raw = parent.values.get(name)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SpecError(parent.source, parent.field(name), f"expected a mapping, got {type(raw).__name__}")
    got = raw.get("model_type", model_type)
    if got != model_type:
        raise SpecError(
            parent.source, f"{parent.field(name)}.model_type", f"'{got}' is not supported; expected {model_type}"
        )
    return HFConfig(parent.source, parent.field(name), raw, defaults=(defaults or _DEFAULTS)[model_type])


def thinker_config(top: HFConfig) -> HFConfig:
    top.expect_type(MODEL_TYPES)
    return sub_config(top, "thinker_config", "qwen2_5_omni_thinker")


def audio_widths(cfg: HFConfig, llm_hidden: int) -> tuple[int, int]:
    """An Omni audio tower's (heads, d_model): heads that divide its width, and an `output_dim` the LLM's width."""
    heads, hidden = cfg.positive("encoder_attention_heads"), cfg.positive("d_model")
    if hidden % heads:
        raise SpecError(
            cfg.source, cfg.field("encoder_attention_heads"), f"{heads} heads do not divide d_model {hidden}"
        )
    if cfg.positive("output_dim") != llm_hidden:
        raise SpecError(
            cfg.source, cfg.field("output_dim"), f"{cfg.values['output_dim']}: the LLM is {llm_hidden} wide"
        )
    return heads, hidden


def audio_module(cfg: HFConfig, llm_hidden: int, hf: HFPart) -> ModuleSpec:
    """The audio tower: its chunks' attention (`n_window` tokens a window), 2 tokens pooled into one LLM token,
    projected to `output_dim`, which must be the LLM's width."""
    heads, hidden = audio_widths(cfg, llm_hidden)
    window = cfg.positive("n_window")
    if window % 2:
        raise SpecError(
            cfg.source,
            cfg.field("n_window"),
            f"{window}: orch pools whole pairs of a chunk's tokens; expected an even number",
        )
    return audio_spec(cfg, heads, hidden, hf, input_dim=cfg.positive("num_mel_bins"), downsample=2, window=window)


def audio_spec(
    cfg: HFConfig, heads: int, hidden: int, hf: HFPart, *, input_dim: int, downsample: int, window: int
) -> ModuleSpec:
    """An Omni audio tower's module: its layers of `heads` x `hidden` feeding the LLM, `input_dim` wide rows in,
    `downsample` of its tokens pooled into one LLM token, attention within `window` tokens."""
    return ModuleSpec(
        kind=ModuleKind.ENCODER,
        layers=cfg.positive("encoder_layers"),
        hidden=hidden,
        heads=heads,
        ffn=cfg.positive("encoder_ffn_dim"),
        mlp="gelu",
        feeds="llm",
        modality=Modality.AUDIO,
        input_dim=input_dim,
        downsample=downsample,
        clip_tokens=window,
        window_tokens=window,  # priced per window: each token meets its window's (planner/costs.py)
        full_attention_blocks=(),
        hf=hf,
    )


def llm_module(text: HFConfig, hf: HFPart) -> ModuleSpec:
    """The thinker's language model (Qwen2.5-Omni's: a Qwen2 decoder); the one part a MoE thinker replaces."""
    return decoder_module(text, hf)


def check_vision_width(vcfg: HFConfig, llm_hidden: int) -> None:
    """An Omni vision tower's merger writes the LLM's width (`out_hidden_size`)."""
    if vcfg.positive("out_hidden_size") != llm_hidden:
        raise SpecError(
            vcfg.source,
            vcfg.field("out_hidden_size"),
            f"{vcfg.values['out_hidden_size']}: the LLM is {llm_hidden} wide",
        )


def read_qwen_omni(top: HFConfig, path: str) -> dict[str, ModuleSpec]:
    """config.json of a Qwen2.5-Omni model -> the thinker's `audio`, `vision` and `llm` modules."""
    thinker = thinker_config(top)
    llm = llm_module(sub_config(thinker, "text_config", "qwen2_5_omni_text"), HFPart(path=path, part="text"))
    vcfg = sub_config(thinker, "vision_config", "qwen2_5_omni_vision_encoder")
    check_vision_width(vcfg, llm.hidden)
    vision = vision_module(vcfg, "qwen2_5_vl", HFPart(path=path, part="vision"))
    acfg = sub_config(thinker, "audio_config", "qwen2_5_omni_audio_encoder")
    audio = audio_module(acfg, llm.hidden, HFPart(path=path, part="audio"))
    if thinker.values.get("tie_word_embeddings"):
        llm = llm.model_copy(update={"tied_embeddings": True})
    return {"audio": audio, "vision": vision, "llm": llm}


def time_axis(top: dict[str, Any]) -> tuple[int, float, int]:
    """(position_id_per_seconds, seconds_per_chunk, spatial_merge_size) of a config.json's thinker, defaults
    where absent."""
    thinker = top.get("thinker_config") or {}
    vision = thinker.get("vision_config") or {}
    d = _DEFAULTS["qwen2_5_omni_thinker"]
    return (
        int(thinker.get("position_id_per_seconds", d["position_id_per_seconds"])),
        float(thinker.get("seconds_per_chunk", d["seconds_per_chunk"])),
        int(vision.get("spatial_merge_size", 2)),
    )
