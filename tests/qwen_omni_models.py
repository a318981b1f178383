"""A tiny Qwen2.5-Omni written to a local directory from transformers' own config classes (thinker, talker and
token2wav, each tiny), with what a hub directory holds beside the weights: a tokenizer with the family's special
tokens and their roles (`image_token`, `audio_bos_token`, ...), a chat template, and the processor's configs
(Whisper's feature extractor, Qwen2-VL's image processor limits)."""

import json
from pathlib import Path

from hf_models import save

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
ROLES = {"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
         "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
         "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}  # fmt: skip
SPECIALS = ("<|im_start|>", "<|im_end|>", *ROLES.values())
MEL_BINS = 16
MIN_PIXELS, MAX_PIXELS = 4 * 28 * 28, 64 * 28 * 28
AUDIO = {"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64,
         "num_mel_bins": MEL_BINS, "max_source_positions": 100, "n_window": 8}  # fmt: skip
VISION = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "window_size": 56,
          "fullatt_block_indexes": [1], "patch_size": 14}  # fmt: skip
TEXT = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "attention_dropout": 0.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 2, 2]}}  # fmt: skip
TALKER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64, **dict.fromkeys(
              ("tts_codec_start_token_id", "tts_codec_end_token_id", "tts_codec_pad_token_id",
               "tts_codec_mask_token_id"), 0),
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}}  # fmt: skip
TOKEN2WAV = {
    "dit_config": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 16,
                   "emb_dim": 16, "enc_emb_dim": 16, "enc_dim": 16, "enc_channels": [16, 16, 16, 16, 32],
                   "enc_attention_channels": 8, "enc_se_channels": 8, "num_embeds": 32, "mel_dim": 8,
                   "look_ahead_layers": [0], "look_backward_layers": [0]},
    "bigvgan_config": {"mel_dim": 8, "upsample_initial_channel": 16, "resblock_kernel_sizes": [3],
                       "resblock_dilation_sizes": [[1, 3, 5]], "upsample_rates": [2], "upsample_kernel_sizes": [4]},
}  # fmt: skip


def make_tokenizer(directory: Path, roles: dict[str, str] = ROLES):
    """The demo's word-level tokenizer with an Omni model's special tokens and their roles (Qwen2.5-Omni's by
    default), saved with the chat template; returns the fast tokenizer."""
    import transformers
    from tokenizers import Tokenizer

    from orch.runtime.data.demo_data import make_tokenizer as demo_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    path = demo_tokenizer(directory / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", *roles.values()])
    tok.save(str(path))
    transformers.logging.set_verbosity_error()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path), unk_token="[UNK]", eos_token="<|im_end|>", extra_special_tokens=roles
    )
    fast.chat_template = CHATML
    fast.save_pretrained(directory)
    return fast


def processor_parts():
    """Qwen2-VL's PIL image processor at the tiny tower's limits and Whisper's feature extractor of MEL_BINS bins."""
    import transformers

    images = transformers.Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=14,
                                                   merge_size=2, temporal_patch_size=2)  # fmt: skip
    return images, transformers.WhisperFeatureExtractor(feature_size=MEL_BINS)


def make_processor(tokenizer):
    """Qwen2_5OmniProcessor over `tokenizer` and `processor_parts`, without a video processor (transformers'
    needs torchvision, which is not installed: its class check is skipped for that part alone)."""
    import transformers

    class WithoutVideo(transformers.Qwen2_5OmniProcessor):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    images, features = processor_parts()
    return WithoutVideo(image_processor=images, video_processor=None, feature_extractor=features,
                        tokenizer=tokenizer, chat_template=CHATML)  # fmt: skip


def make_qwen_omni(
    directory: Path, *, seed: int = 0, audio: dict | None = None, vision: dict | None = None, **text_extra
) -> Path:
    """A tiny Qwen2_5OmniForConditionalGeneration (audio chunks of 16 frames, 2 vision blocks, 4 LLM layers) saved
    with safetensors, its tokenizer, chat template and processor configs; returns the directory. `audio`, `vision`
    and `text_extra` replace fields of the towers' and the LLM's configs (bench/bench_omni.py's wider model)."""
    import torch
    import transformers

    directory = Path(directory)
    tok = make_tokenizer(directory)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIALS}
    text = {**TEXT, "vocab_size": len(tok), **text_extra}
    thinker = {
        "audio_config": {**AUDIO, **(audio or {}), "output_dim": text["hidden_size"]},
        "vision_config": {**VISION, **(vision or {}), "out_hidden_size": text["hidden_size"]},
        "text_config": text,
        "audio_token_index": ids["<|AUDIO|>"], "image_token_index": ids["<|IMAGE|>"],
        "video_token_index": ids["<|VIDEO|>"], "vision_start_token_id": ids["<|vision_bos|>"],
        "vision_end_token_id": ids["<|vision_eos|>"], "audio_start_token_id": ids["<|audio_bos|>"],
        "audio_end_token_id": ids["<|audio_eos|>"],
    }  # fmt: skip
    config = transformers.Qwen2_5OmniConfig(thinker_config=thinker, talker_config=TALKER, token2wav_config=TOKEN2WAV)
    torch.manual_seed(seed)
    save(transformers.Qwen2_5OmniForConditionalGeneration(config), directory)
    # the voices the talker speaks in: Qwen2_5OmniForConditionalGeneration.from_pretrained reads them
    torch.save({"Chelsie": {"bos_token": 1, "cond": torch.zeros(1, 16), "ref_mel": torch.zeros(1, 4, 8)}},
               directory / "spk_dict.pt")  # fmt: skip
    images, features = processor_parts()  # one preprocessor_config.json holding both parts, as the hub's
    (directory / "preprocessor_config.json").write_text(
        json.dumps({**images.to_dict(), **features.to_dict()}, indent=1)
    )
    return directory
