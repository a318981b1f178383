"""Tiny Qwen-VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) written to local directories from transformers' own
config classes, with what a hub directory holds beside the weights: a tokenizer with the family's special
tokens, a chat template, preprocessor_config.json (the image processor's min/max pixels, patch, merge and
temporal patch) and video_preprocessor_config.json (fps, min/max frames)."""

from pathlib import Path

from hf_models import save

# ChatML as the Qwen templates render a conversation whose contents are strings (LLaMA-Factory's `qwen2_vl`).
CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
SPECIALS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16, "qwen3_vl_moe": 16}
TEXT = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
# Qwen3-VL-MoE's decoder: experts of a width other than the dense MLP's, one dense block (mlp_only_layers); the
# router's auxiliary loss off (output_router_logits: True, with router_aux_loss_coef, turns it on)
MOE_TEXT = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 20, "mlp_only_layers": [3],
            "tie_word_embeddings": False}  # fmt: skip
MROPE = [2, 2, 2]  # head_dim 12: 6 frequency pairs over (t, h, w)
# A small tower's image limits: 4 to 64 merged tokens per image.
MIN_PIXELS, MAX_PIXELS = 4 * 28 * 28, 64 * 28 * 28


def make_tokenizer(directory: Path) -> Path:
    """The demo's word-level tokenizer with the Qwen-VL special tokens, saved with the chat template (what a real
    model's processor directory holds); returns the tokenizer.json."""
    import transformers
    from tokenizers import Tokenizer

    from orch.runtime.data.demo_data import make_tokenizer as demo_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    path = demo_tokenizer(directory / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(path))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="[UNK]", eos_token="<|im_end|>")
    fast.chat_template = CHATML
    fast.save_pretrained(directory)
    return path


def make_qwen_vl(
    directory: Path, family: str = "qwen2_5_vl", *, seed: int = 0, vision_extra: dict | None = None, **text_extra
) -> Path:
    """A tiny `family` model (4 vision blocks, 4 LLM layers) saved with safetensors, its tokenizer, chat template
    and processor configs; returns the directory. `vision_extra` overrides vision config fields (Qwen2.5-VL's
    `window_size`, `fullatt_block_indexes`), `text_extra` text config fields."""
    import json

    import torch
    import transformers
    from tokenizers import Tokenizer

    directory = Path(directory)
    tok = Tokenizer.from_file(str(make_tokenizer(directory)))
    ids = {t: tok.token_to_id(t) for t in SPECIALS}
    vocab = tok.get_vocab_size()
    patch = PATCH[family]
    text = {**TEXT, "vocab_size": vocab, **text_extra}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": MROPE}
    vx = vision_extra or {}
    if family == "qwen2_vl":
        vision = transformers.Qwen2VLVisionConfig(depth=4, embed_dim=32, num_heads=4, mlp_ratio=2, hidden_size=48,
                                                  patch_size=patch, **vx)  # fmt: skip
        text_config = transformers.Qwen2VLTextConfig(**text, rope_parameters=rope)
        cls, config_cls = transformers.Qwen2VLForConditionalGeneration, transformers.Qwen2VLConfig
    elif family == "qwen2_5_vl":
        vision = transformers.Qwen2_5_VLVisionConfig(**{"depth": 4, "hidden_size": 32, "intermediate_size": 64,
                                                        "num_heads": 4, "out_hidden_size": 48, "window_size": 56,
                                                        "fullatt_block_indexes": [1, 3], "patch_size": patch,
                                                        "tokens_per_second": 2, **vx})  # fmt: skip
        text_config = transformers.Qwen2_5_VLTextConfig(**text, rope_parameters=rope)
        cls, config_cls = transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig
    elif family == "qwen3_vl":
        vision = transformers.Qwen3VLVisionConfig(depth=4, hidden_size=32, intermediate_size=64, num_heads=4,
                                                  out_hidden_size=48, patch_size=patch, num_position_embeddings=64,
                                                  deepstack_visual_indexes=[1, 2], **vx)  # fmt: skip
        text_config = transformers.Qwen3VLTextConfig(**text, head_dim=12,
                                                     rope_parameters={**rope, "mrope_interleaved": True})  # fmt: skip
        cls, config_cls = transformers.Qwen3VLForConditionalGeneration, transformers.Qwen3VLConfig
    elif family == "qwen3_vl_moe":  # Qwen3-VL's tower; a decoder of 4 experts (2 a token) but in block 3
        vision = transformers.Qwen3VLMoeVisionConfig(depth=4, hidden_size=32, intermediate_size=64, num_heads=4,
                                                     out_hidden_size=48, patch_size=patch, num_position_embeddings=64,
                                                     deepstack_visual_indexes=[1, 2], **vx)  # fmt: skip
        text = {**MOE_TEXT, **text}
        text_config = transformers.Qwen3VLMoeTextConfig(**text, head_dim=12,
                                                        rope_parameters={**rope, "mrope_interleaved": True})  # fmt: skip
        cls, config_cls = transformers.Qwen3VLMoeForConditionalGeneration, transformers.Qwen3VLMoeConfig
    else:
        raise ValueError(family)
    config = config_cls(
        vision_config=vision.to_dict(),
        text_config=text_config.to_dict(),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    save(cls(config), directory)
    merge = 2
    image = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS,
             "patch_size": patch, "merge_size": merge, "temporal_patch_size": 2,
             "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
             "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
             "rescale_factor": 1 / 255, "resample": 3}  # fmt: skip
    if family.startswith("qwen3"):
        image |= {"image_processor_type": "Qwen2VLImageProcessor", "image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    (directory / "preprocessor_config.json").write_text(json.dumps(image, indent=1))
    video = {**image, "video_processor_type": "Qwen2VLVideoProcessor", "fps": 2.0, "min_frames": 4,
             "max_frames": 16, "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}  # fmt: skip
    video.pop("image_processor_type")
    if family.startswith("qwen3"):  # Qwen3VLVideoProcessor: its limits as `size` alone
        del video["min_pixels"], video["max_pixels"]
        video |= {"video_processor_type": "Qwen3VLVideoProcessor",
                  "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}}  # fmt: skip
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video, indent=1))
    return directory
