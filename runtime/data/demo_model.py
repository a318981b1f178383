"""A tiny LLaVA for the demo, written from a config (no download): CLIP vision tower, Llama LLM, the
LLaVA projector, its image processor and a fast tokenizer with a chat template and an `<image>` token, all
saved as `from_pretrained` reads them (safetensors weights). `orch plan --model DIR` takes the directory."""

from __future__ import annotations

from pathlib import Path

IMAGE_SIZE, PATCH = 28, 7  # 16 patches an image
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|>\n{% endfor %}"


def make_demo_llava(directory: Path, tokenizer_file: Path, *, hidden: int = 64, layers: int = 4, seed: int = 0) -> Path:
    """The model directory: a LlavaForConditionalGeneration sized for a CPU demo over `tokenizer_file`'s
    vocabulary (plus `<image>` and the template's role tokens)."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    transformers.logging.set_verbosity_error()  # the image processor's PIL fallback notice
    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.add_special_tokens(["<image>", "<|user|>", "<|assistant|>", "<|end|>"])
    vocab = -(-tok.get_vocab_size() // 16) * 16
    directory.mkdir(parents=True, exist_ok=True)
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(
            hidden_size=hidden // 2, intermediate_size=hidden, num_hidden_layers=2, num_attention_heads=4,
            image_size=IMAGE_SIZE, patch_size=PATCH,
        ),
        text_config=transformers.LlamaConfig(
            hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=vocab,
        ),
        image_token_id=tok.token_to_id("<image>"),
        vision_feature_select_strategy="default",
    )  # fmt: skip
    torch.manual_seed(seed)
    transformers.LlavaForConditionalGeneration(config).save_pretrained(directory)
    size = {"shortest_edge": IMAGE_SIZE}
    transformers.CLIPImageProcessor(size=size, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}).save_pretrained(
        directory
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(directory)
    return directory
