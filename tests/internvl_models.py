"""A tiny InternVL model (InternVLForConditionalGeneration, a Qwen2 or Llama LLM) written to a local directory from
transformers' own config classes, with what a hub "-hf" directory holds beside the weights: a tokenizer with the
family's special tokens (`<img>`, `</img>`, `<IMG_CONTEXT>`, `<video>`), a chat template, and
preprocessor_config.json (GotOcr2ImageProcessor: the tile size and the min/max tiles)."""

from contextlib import contextmanager
from pathlib import Path

from hf_models import TEXT, save

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
SPECIALS = ("<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>")
# Tiles of 28 px, 4 x 4 patches of 7 px, 2 x 2 of them a token after pixel shuffle: 4 tokens a tile.
VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
          "image_size": 28, "patch_size": 7}  # fmt: skip
TILE, MAX_TILES = 28, 6


def make_tokenizer(directory: Path):
    """The demo's word-level tokenizer with InternVL's special tokens, saved with the chat template and the
    tokens InternVLProcessor reads off the tokenizer; returns the fast tokenizer."""
    import transformers
    from tokenizers import Tokenizer

    from orch.runtime.data.demo_data import make_tokenizer as demo_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    path = demo_tokenizer(directory / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(list(SPECIALS))
    tok.save(str(path))
    transformers.logging.set_verbosity_error()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(path), unk_token="[UNK]", eos_token="<|im_end|>",
        extra_special_tokens={"start_image_token": "<img>", "end_image_token": "</img>",
                              "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"},
    )  # fmt: skip
    fast.chat_template = CHATML
    fast.save_pretrained(directory)
    return fast


def make_internvl(
    directory: Path, text: str = "qwen2", *, seed: int = 0, vision_extra: dict | None = None, **top_extra
) -> Path:
    """A tiny InternVL (3 tower blocks, 4 LLM layers) saved with safetensors, its tokenizer, chat template and image
    processor config; returns the directory. `vision_extra` overrides vision config fields (`use_qk_norm`), `top_extra`
    InternVLConfig's (`vision_feature_layer`, `tie_word_embeddings`)."""
    import torch
    import transformers

    directory = Path(directory)
    fast = make_tokenizer(directory)
    text_cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[text]
    config = transformers.InternVLConfig(
        vision_config=transformers.InternVLVisionConfig(**{**VISION, **(vision_extra or {})}),
        text_config=text_cls(**{**TEXT, "vocab_size": len(fast)}),
        image_token_id=fast.convert_tokens_to_ids("<IMG_CONTEXT>"),
        image_seq_length=4,
        **{"tie_word_embeddings": False, **top_extra},  # untied unless asked: the LLM takes pipeline stages
    )
    torch.manual_seed(seed)
    save(transformers.InternVLForConditionalGeneration(config), directory)
    image = transformers.GotOcr2ImageProcessor(size={"height": TILE, "width": TILE}, max_patches=MAX_TILES)
    image.save_pretrained(directory)
    return directory


@contextmanager
def hf_norms_in_float64():
    """HF's InternVLVisionRMSNorm (the q/k norms of `use_qk_norm`; a test's tower keeps LayerNorms elsewhere) computing at its input's precision where that is
    above float32, as orch's WidthRMSNorm does: HF's upcast to float32 is for half precision, and in float64 it
    would round the norm to float32 (1e-7), which a float64 comparison to 1e-9 cannot hold."""
    import torch
    from transformers.models.internvl import modeling_internvl

    cls = modeling_internvl.InternVLVisionRMSNorm
    original = cls.forward

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        x = hidden_states.to(torch.promote_types(dtype, torch.float32))
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)

    cls.forward = forward
    try:
        yield
    finally:
        cls.forward = original


def hf_processor(directory: Path):
    """HF's own InternVLProcessor over the directory's tokenizer and image processor as AutoImageProcessor picks it
    (4 tokens a tile); its video processor needs torchvision, absent here: built without one."""
    import transformers

    transformers.logging.set_verbosity_error()
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    image = transformers.AutoImageProcessor.from_pretrained(directory)
    check = transformers.ProcessorMixin.check_argument_for_proper_class
    transformers.ProcessorMixin.check_argument_for_proper_class = lambda self, name, arg: None  # type: ignore
    try:
        return transformers.InternVLProcessor(image_processor=image, tokenizer=tok, image_seq_length=4,
                                              chat_template=CHATML)  # fmt: skip
    finally:
        transformers.ProcessorMixin.check_argument_for_proper_class = check  # type: ignore
