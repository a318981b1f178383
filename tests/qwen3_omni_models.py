"""A tiny Qwen3-Omni written to a local directory from transformers' own config classes (thinker, talker and
code2wav, each tiny), with a tokenizer holding the family's special tokens and their roles (`audio_bos_token`
`<|audio_start|>`, ...), a chat template and the processor's configs (Whisper's feature extractor, Qwen2-VL's
image processor at patch 16)."""

import json
from pathlib import Path

from hf_models import save
from qwen_omni_models import CHATML, make_tokenizer

ROLES = {"image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
         "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
         "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}  # fmt: skip
SPECIALS = ("<|im_start|>", "<|im_end|>", *ROLES.values())
MEL_BINS = 16
MIN_PIXELS, MAX_PIXELS = 4 * 32 * 32, 64 * 32 * 32
# n_window 50 (13 tokens a chunk, as transformers counts them); windows of 2 chunks (26 tokens)
AUDIO = {"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64,
         "num_mel_bins": MEL_BINS, "max_source_positions": 64, "n_window": 50, "n_window_infer": 200,
         "downsample_hidden_size": 8}  # fmt: skip
VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "patch_size": 16,
          "num_position_embeddings": 64, "deepstack_visual_indexes": [1]}  # fmt: skip
# a decoder of 4 experts (2 a token) but in block 3 (mlp_only_layers); the router's aux loss off
TEXT = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 12, "attention_dropout": 0.0, "num_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 20, "mlp_only_layers": [3],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2],
                            "interleaved": True, "mrope_interleaved": True}}  # fmt: skip
TALKER = {
    "text_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64, "num_experts": 2,
                    "num_experts_per_tok": 1, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                        "mrope_section": [1, 1, 2], "interleaved": True}},
    "code_predictor_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
                              "num_code_groups": 2},
    "num_code_groups": 2, "thinker_hidden_size": TEXT["hidden_size"], "accept_hidden_layer": 1, "spatial_merge_size": 2,
    **dict.fromkeys(("codec_eos_token_id", "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id",
                     "codec_pad_id", "codec_bos_id"), 0),
}  # fmt: skip
CODE2WAV = {"codebook_size": 16, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_quantizers": 2, "upsample_rates": [2],
            "upsampling_ratios": [2], "decoder_dim": 16, "sliding_window": 8}  # fmt: skip


def processor_parts():
    """Qwen2-VL's PIL image processor (patch 16) at the tiny tower's limits and Whisper's feature extractor."""
    import transformers

    images = transformers.Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=16,
                                                   merge_size=2, temporal_patch_size=2)  # fmt: skip
    return images, transformers.WhisperFeatureExtractor(feature_size=MEL_BINS)


def make_qwen3_omni(directory: Path, *, seed: int = 0, **text_extra) -> Path:
    """A tiny Qwen3OmniMoeForConditionalGeneration (audio chunks of 100 frames, 2 vision blocks with one deepstack
    merger, 4 MoE LLM layers) saved with safetensors, its tokenizer, chat template and processor configs."""
    import torch
    import transformers

    directory = Path(directory)
    tok = make_tokenizer(directory, ROLES)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    thinker = {
        "audio_config": {**AUDIO, "output_dim": TEXT["hidden_size"]},
        "vision_config": {**VISION, "out_hidden_size": TEXT["hidden_size"]},
        "text_config": {**TEXT, "vocab_size": len(tok), **text_extra},
        "audio_token_id": ids["<|audio_pad|>"], "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"], "vision_start_token_id": ids["<|vision_start|>"],
        "audio_start_token_id": ids["<|audio_start|>"], "position_id_per_seconds": 13,
    }  # fmt: skip
    config = transformers.Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=TALKER, code2wav_config=CODE2WAV)
    torch.manual_seed(seed)
    model = transformers.Qwen3OmniMoeForConditionalGeneration(config)
    initialise_talker_experts(model)
    save(model, directory)
    images, features = processor_parts()
    (directory / "preprocessor_config.json").write_text(
        json.dumps({**images.to_dict(), **features.to_dict()}, indent=1)
    )
    return directory


def initialise_talker_experts(model) -> None:
    """The talker's experts drawn like the thinker's (normal, initializer_range): transformers' _init_weights
    leaves them as torch.empty gave them, so a saved model held whatever freed memory held (after the family
    matrix, a NaN in a tensor that no equality then holds equal to itself)."""
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerTextExperts

    std = model.config.talker_config.text_config.initializer_range
    with torch.no_grad():
        for experts in (m for m in model.talker.modules() if isinstance(m, Qwen3OmniMoeTalkerTextExperts)):
            experts.gate_up_proj.normal_(0.0, std)
            experts.down_proj.normal_(0.0, std)


def make_processor(tokenizer):
    """Qwen3OmniMoeProcessor over `tokenizer` and `processor_parts`, without a video processor (transformers' needs
    torchvision, which is not installed: its class check is skipped for that part alone)."""
    import transformers

    class WithoutVideo(transformers.Qwen3OmniMoeProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    images, features = processor_parts()
    return WithoutVideo(image_processor=images, video_processor=None, feature_extractor=features,
                        tokenizer=tokenizer, chat_template=CHATML)  # fmt: skip
