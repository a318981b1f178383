"""Tiny Hugging Face models written to local directories from configs (no hub): the tests' HF models."""

from pathlib import Path

TEXT = {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128}  # fmt: skip
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
          "image_size": 28, "patch_size": 7}  # fmt: skip
IMAGE_TOKEN = 127
CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
SPECIALS = ["<|im_start|>", "<|im_end|>", "<image>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"]


def make_chat_tokenizer(directory: Path):
    """A fast tokenizer over the demo's words with the LLaVA and Qwen2-Audio special tokens (a model's processor
    takes it; its chat template is the processor's)."""
    import transformers
    from tokenizers import Tokenizer

    from orch.runtime.data.demo_data import make_tokenizer as demo_tokenizer

    path = demo_tokenizer(Path(directory) / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(SPECIALS)
    tok.save(str(path))
    transformers.logging.set_verbosity_error()
    return transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="[UNK]", eos_token="<|im_end|>")


def save(model, directory) -> None:
    """save_pretrained, after perturbing every vector: HF's init leaves norms at exactly 1 and biases at 0,
    and their gradients should count too."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(directory)


def make_llava(
    directory: Path,
    vision: str = "clip",
    text: str = "llama",
    *,
    seed: int = 0,
    image_token: int = IMAGE_TOKEN,
    **text_extra,
) -> Path:
    """A LlavaForConditionalGeneration of `vision` (clip, siglip) and `text` (llama, qwen2, mistral), saved
    with safetensors; returns the directory."""
    import torch
    import transformers

    vision_cls = {"clip": transformers.CLIPVisionConfig, "siglip": transformers.SiglipVisionConfig}[vision]
    text_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                "mistral": transformers.MistralConfig}[text]  # fmt: skip
    config = transformers.LlavaConfig(
        vision_config=vision_cls(**VISION),
        text_config=text_cls(**{**TEXT, **text_extra}),
        image_token_id=image_token,
        vision_feature_select_strategy="default" if vision == "clip" else "full",
        tie_word_embeddings=bool(text_extra.get("tie_word_embeddings", False)),
    )
    torch.manual_seed(seed)
    model = transformers.LlavaForConditionalGeneration(config)
    save(model, directory)
    return Path(directory)


AUDIO = {"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64,
         "num_mel_bins": 16, "max_source_positions": 20}  # fmt: skip


def make_qwen2_audio(
    directory: Path, *, seed: int = 0, audio_token: int = IMAGE_TOKEN, vocab: int | None = None, **audio_extra
) -> Path:
    """A Qwen2AudioForConditionalGeneration (clips of 20 encoder tokens unless `audio_extra` says otherwise) with a
    Qwen2 LLM, saved with safetensors."""
    import torch
    import transformers

    config = transformers.Qwen2AudioConfig(
        audio_config=transformers.Qwen2AudioEncoderConfig(**{**AUDIO, **audio_extra}),
        text_config=transformers.Qwen2Config(**{**TEXT, **({"vocab_size": vocab} if vocab else {})}),
        audio_token_id=audio_token,
    )
    torch.manual_seed(seed)
    model = transformers.Qwen2AudioForConditionalGeneration(config)
    save(model, directory)
    return Path(directory)


def make_parts(directory: Path, *, seed: int = 0) -> tuple[Path, Path]:
    """A bare SigLIP tower and a Qwen2 language model in directories of their own (a composed spec's sources)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    tower = transformers.SiglipVisionModel(transformers.SiglipVisionConfig(**VISION))
    llm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TEXT))
    for model, name in ((tower, "siglip"), (llm, "qwen2")):
        save(model, Path(directory) / name)
    return Path(directory) / "siglip", Path(directory) / "qwen2"


WHISPER = {"d_model": 32, "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 64,
           "decoder_layers": 1, "decoder_attention_heads": 4, "decoder_ffn_dim": 64, "num_mel_bins": 16,
           "max_source_positions": 20, "max_target_positions": 16, "vocab_size": 64, "pad_token_id": 0,
           "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}  # fmt: skip


def make_whisper(directory: Path, *, seed: int = 0) -> Path:
    """A WhisperForConditionalGeneration (clips of 20 encoder tokens), saved with safetensors."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**WHISPER))
    save(model, directory)
    return Path(directory)


TEMPLATE = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} ?\n{% endfor %}"


def save_processor(directory, tokenizer_file):
    """The model's processor beside its weights: a CLIP image processor at the tower's 28 pixels and a fast
    tokenizer with a chat template (what save_pretrained of a real model's processor writes)."""
    import transformers

    transformers.CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(
        directory
    )
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file), unk_token="[UNK]")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(directory)
