"""Qwen3-Omni's config.json (`model_type: qwen3_omni_moe`) read into the thinker's modules without torch: module
`audio` (Qwen3-Omni's audio encoder), module `vision` (a Qwen3-VL tower with deepstack mergers) and module `llm`
(the thinker's MoE decoder, through the shared MoE reader `moe_module`). The talker and code2wav are not read.

The audio encoder cuts each clip's log-mel frames into chunks of `2·n_window` frames, and three stride-2 convs
make each chunk's tokens (13 of a full chunk of 100 frames: transformers' `_get_feat_extract_output_lengths`
counts 13 whatever n_window is, so orch takes only the n_window whose conv gives 13); its blocks attend within
windows of `n_window_infer / (2·n_window)` chunks (104 tokens: `window_tokens`, priced per window) and its
output (`proj2`, `output_dim`) is already the LLM's width and one LLM token a token: no pooling (downsample 1).
A clip's input rows are its frames packed 4 to a row (`input_dim` 4 x num_mel_bins, so the data's 2 rows a token
carry 8 frames, which is at least every token's frames; qwen3_media.py). Fields absent take transformers 5.24's
class defaults (`_DEFAULTS`; tests/unit/test_qwen3_omni.py checks them against it).
"""

from __future__ import annotations

from typing import Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig, decoder_module, moe_module
from orch.planner.specs import HFPart, ModuleSpec
from orch.runtime.models.qwen_omni.config import audio_spec, audio_widths, check_vision_width, sub_config
from orch.runtime.models.qwen_vl.config import vision_module

MODEL_TYPE = "qwen3_omni_moe"
CHUNK_TOKENS = 13  # tokens of a full chunk as transformers counts them (module docstring)
FRAMES_PER_ROW = 4  # log-mel frames packed into one input row (module docstring)

_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen3_omni_moe_thinker": dict(position_id_per_seconds=25, tie_word_embeddings=False),
    "qwen3_omni_moe_audio_encoder": dict(
        num_mel_bins=128, encoder_layers=32, encoder_attention_heads=20, encoder_ffn_dim=5120, d_model=1280,
        max_source_positions=1500, n_window=50, output_dim=3584, n_window_infer=800, downsample_hidden_size=480,
    ),
    "qwen3_omni_moe_vision_encoder": dict(
        depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, in_channels=3, patch_size=16,
        spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=3584, deepstack_visual_indexes=[8, 16, 24],
    ),
    "qwen3_omni_moe_text": dict(
        vocab_size=3584, hidden_size=2048, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, decoder_sparse_step=1, moe_intermediate_size=768, num_experts_per_tok=8,
        num_experts=128, mlp_only_layers=[], router_aux_loss_coef=0.001, output_router_logits=False,
    ),
}  # fmt: skip


def conv_tokens(frames: int) -> int:
    """Tokens three stride-2 convs (kernel 3, padding 1) make of `frames` frames."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def clip_tokens(frames: int, n_window: int) -> int:
    """LLM tokens of a clip of `frames` log-mel frames: 13 a full chunk of 2·n_window frames and the conv's of the
    rest (the processor's and the model's `_get_feat_extract_output_lengths`)."""
    whole, rest = divmod(frames, 2 * n_window)
    return whole * CHUNK_TOKENS + (conv_tokens(rest) if rest else 0)


def frames_for(tokens: int, n_window: int) -> int:
    """The fewest log-mel frames whose clip gives `tokens` tokens (every count is some clip's: a chunk's r frames
    give ceil(r / 8), 1 to 13); at most 8 a token."""
    if tokens < 1:
        return 0
    whole, rest = divmod(tokens - 1, CHUNK_TOKENS)  # rest + 1 tokens of the last chunk: 8·rest + 1 frames
    return whole * 2 * n_window + 8 * rest + 1


def window_tokens(n_window: int, n_window_infer: int) -> int:
    """Tokens an audio block attends within: n_window_infer / (2·n_window) full chunks (HF's get_audio_cu_seqlens)."""
    return CHUNK_TOKENS * (n_window_infer // (2 * n_window))


def audio_module(cfg: HFConfig, llm_hidden: int, hf: HFPart) -> ModuleSpec:
    """Qwen3-Omni's audio encoder (module docstring)."""
    heads, hidden = audio_widths(cfg, llm_hidden)
    n_window = cfg.positive("n_window")
    if conv_tokens(2 * n_window) != CHUNK_TOKENS:
        raise SpecError(
            cfg.source,
            cfg.field("n_window"),
            f"{n_window}: a chunk of {2 * n_window} frames gives {conv_tokens(2 * n_window)} tokens, and "
            f"transformers counts {CHUNK_TOKENS} (expected 49 to 52; the published 50)",
        )
    infer = cfg.positive("n_window_infer")
    if infer < 2 * n_window:
        raise SpecError(cfg.source, cfg.field("n_window_infer"), f"{infer}: less than one chunk (2·n_window)")
    window = window_tokens(n_window, infer)
    input_dim = FRAMES_PER_ROW * cfg.positive("num_mel_bins")
    return audio_spec(cfg, heads, hidden, hf, input_dim=input_dim, downsample=1, window=window)


def thinker_config(top: HFConfig) -> HFConfig:
    top.expect_type((MODEL_TYPE,))
    return sub_config(top, "thinker_config", "qwen3_omni_moe_thinker", _DEFAULTS)


def read_qwen3_omni(top: HFConfig, path: str) -> dict[str, ModuleSpec]:
    """config.json of a Qwen3-Omni model -> the thinker's `audio`, `vision` and `llm` modules."""
    thinker = thinker_config(top)
    text = sub_config(thinker, "text_config", "qwen3_omni_moe_text", _DEFAULTS)
    llm = moe_module(text, decoder_module(text, HFPart(path=path, part="text")))
    vcfg = sub_config(thinker, "vision_config", "qwen3_omni_moe_vision_encoder", _DEFAULTS)
    check_vision_width(vcfg, llm.hidden)
    vision = vision_module(vcfg, "qwen3_vl", HFPart(path=path, part="vision"))
    acfg = sub_config(thinker, "audio_config", "qwen3_omni_moe_audio_encoder", _DEFAULTS)
    audio = audio_module(acfg, llm.hidden, HFPart(path=path, part="audio"))
    if thinker.values.get("tie_word_embeddings"):
        llm = llm.model_copy(update={"tied_embeddings": True})
    return {"audio": audio, "vision": vision, "llm": llm}


def audio_window(top: dict[str, Any]) -> tuple[int, int]:
    """(n_window, n_window_infer) of a config.json's thinker, defaults where absent."""
    audio = (top.get("thinker_config") or {}).get("audio_config") or {}
    d = _DEFAULTS["qwen3_omni_moe_audio_encoder"]
    return int(audio.get("n_window", d["n_window"])), int(audio.get("n_window_infer", d["n_window_infer"]))


def per_second(top: dict[str, Any]) -> int:
    """The thinker's position_id_per_seconds (its class default where absent)."""
    thinker = top.get("thinker_config") or {}
    return int(thinker.get("position_id_per_seconds", _DEFAULTS["qwen3_omni_moe_thinker"]["position_id_per_seconds"]))
