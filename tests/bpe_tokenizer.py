"""A byte-level BPE tokenizer (GPT-2's and Qwen's kind: a word's leading space merged into its token, `Ġtall`)
trained offline with `tokenizers` on a few sentences, saved as a Hugging Face directory with a real chat
template, for the tests of which tokens train."""

from pathlib import Path

# LLaVA-1.5's conversation format (LLaMA-Factory's `llava` template, llava-hf's chat template as a string).
LLAVA_15 = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }} {% elif m['role'] == 'user' %}"
    "USER: {{ m['content'] }} {% else %}ASSISTANT: {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)
# The same text, its assistant contents and end of turn marked as transformers' `{% generation %}` blocks.
LLAVA_15_GENERATION = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }} {% elif m['role'] == 'user' %}"
    "USER: {{ m['content'] }} {% else %}ASSISTANT:{% generation %} {{ m['content'] }}{{ eos_token }}"
    "{% endgeneration %}{% endif %}{% endfor %}"
)
# Qwen2-VL-*-Instruct's chat_template.json, as the hub has it.
QWEN2_VL = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}"
    "<|im_end|>\n{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] "
    "== 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content "
    "%}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}"
)
QWEN2_VL_SPECIALS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Each template with its assistant contents and end of turn (not the text before them) in `{% generation %}`
# blocks: what HF's `return_assistant_tokens_mask` marks on these is the tokens overlapping an answer and its end
# of turn, the reference for a template without blocks. Qwen2-VL's newline after `<|im_end|>` is written as an
# expression: HF's environment (trim_blocks) drops the one after a block tag.
LLAVA_15_MARKED = LLAVA_15.replace(
    "{{ m['content'] }}{{ eos_token }}", "{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}"
)
_QWEN_TURN = "{{ message['content'] }}<|im_end|>"
QWEN2_VL_MARKED = QWEN2_VL.replace(
    _QWEN_TURN + "\n",
    "{% if message['role'] == 'assistant' %}{% generation %}"
    + _QWEN_TURN
    + "{% endgeneration %}{% else %}"
    + _QWEN_TURN
    + "{% endif %}{{ '\\n' }}",
    1,
)
SENTENCES = [
    "A tall strip of paper on a red table.",
    "What is in the picture? Describe it in a few words.",
    "Yes, a cat and a dog. No, there is none.",
    "(a) a red circle; (b) a blue square: which one is it?",
    "Is the cat on the mat? yes no maybe",
]


def make_bpe_tokenizer(directory: Path, template: str, specials: tuple[str, ...], eos: str) -> Path:
    """A byte-level BPE tokenizer trained on SENTENCES (a 320-token vocabulary) with `specials`, saved with
    `save_pretrained` and `template` as its chat template; returns the directory."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(SENTENCES, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos)
    fast.chat_template = template
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    return directory
