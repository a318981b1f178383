"""The text a model is trained on (runtime/data/index.py): the chat template rendered with the tokenizer's
special tokens, and labels on the assistant's contents through the template's end-of-turn token: each token
that overlaps them, as transformers' `return_assistant_tokens_mask` marks tokens (a template's own
`{% generation %}` blocks where it has them)."""

import json

import pytest

from orch.planner.errors import SpecError
from orch.runtime.data.conversations import Conversation
from orch.runtime.data.index import IGNORE, TextCounter, find_tokenizer
from orch.runtime.models.registry import load_model

CHATML = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
LLAMA2 = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %} {{ m['content'] }} {{ eos_token }}{% endif %}{% endfor %}"
)
CONV = Conversation("x:1", (("user", "what is this"), ("assistant", "a red circle"), ("user", "and"),
                            ("assistant", "a tone")), (), ())  # fmt: skip


@pytest.fixture
def tokenizer_dir(tmp_path):
    from tokenizers import Tokenizer

    from orch.runtime.data.demo_data import make_tokenizer

    tok = Tokenizer.from_file(str(make_tokenizer(tmp_path / "tokenizer.json")))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>", "<s>", "</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def _trained(counter: TextCounter, conv: Conversation = CONV) -> list[str]:
    got = counter.tokens(conv)
    return [counter.tokenizer.id_to_token(i) for i, y in zip(got.ids, got.labels, strict=True) if y != IGNORE]


def test_chatml_trains_each_assistant_content_and_its_end_of_turn_token(tokenizer_dir):
    counter = TextCounter(str(tokenizer_dir / "tokenizer.json"), CHATML)
    assert _trained(counter) == ["a", "red", "circle", "<|im_end|>", "a", "tone", "<|im_end|>"]


def test_a_template_with_no_special_token_after_the_content_trains_the_content_only(tokenizer_dir):
    counter = TextCounter(
        str(tokenizer_dir / "tokenizer.json"), "{% for m in messages %}{{ m['content'] }} ?\n{% endfor %}"
    )
    assert _trained(counter) == ["a", "red", "circle", "a", "tone"]


def test_special_tokens_come_from_tokenizer_config_and_eos_ends_the_turn(tokenizer_dir):
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": LLAMA2, "bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}}
    ))  # fmt: skip
    model = load_model("tiny")
    chat = find_tokenizer(model, str(tokenizer_dir))
    assert (chat.template, chat.bos_token, chat.eos_token) == (LLAMA2, "<s>", "</s>")
    counter = TextCounter(*chat)
    got = counter.tokens(CONV)
    assert counter.tokenizer.id_to_token(got.ids[0]) == "<s>"  # the template's bos_token, rendered
    assert _trained(counter) == ["a", "red", "circle", "</s>", "a", "tone", "</s>"]


def test_a_tokenizer_config_that_is_not_json_is_one_line_naming_it(tokenizer_dir):
    (tokenizer_dir / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(SpecError, match="tokenizer_config.json"):
        find_tokenizer(load_model("tiny"), str(tokenizer_dir))


def test_a_processors_chat_template_json_is_read_where_the_tokenizer_names_none(tokenizer_dir):
    """Hub Qwen2-VL / Qwen2.5-VL directories keep the template in the processor's chat_template.json."""
    (tokenizer_dir / "chat_template.json").write_text(json.dumps({"chat_template": CHATML}))
    chat = find_tokenizer(load_model("tiny"), str(tokenizer_dir))
    assert chat.template == CHATML
    assert _trained(TextCounter(*chat)) == ["a", "red", "circle", "<|im_end|>", "a", "tone", "<|im_end|>"]
    (tokenizer_dir / "chat_template.json").write_text("[1, 2]")
    with pytest.raises(SpecError, match="chat_template.json: chat_template: not a JSON object"):
        find_tokenizer(load_model("tiny"), str(tokenizer_dir))


# Byte-level BPE merges the template's space into an answer's first word (`ASSISTANT: yes` -> `Ġyes`).
BPE_CONVS = {
    "one word": [("user", "Is the cat on the mat?"), ("assistant", "yes")],
    "multi-turn": [
        ("user", "What is in the picture?"),
        ("assistant", "A tall strip"),
        ("user", "Is it red?"),
        ("assistant", "no"),
    ],
    "punctuation first": [
        ("user", "Which one is it?"),
        ("assistant", "(a) a red circle."),
        ("user", "Sure?"),
        ("assistant", ", yes: the red one"),
    ],
    "system": [("system", "Describe it in a few words."), ("user", "What is it?"), ("assistant", "A cat")],
}


def _hf_mask(directory, template: str, messages: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """HF's ids and assistant mask of `messages` under `template`."""
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    out = hf.apply_chat_template([{"role": r, "content": c} for r, c in messages], chat_template=template,
                                 tokenize=True, return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
    assert any(out["assistant_masks"])
    return list(out["input_ids"]), list(out["assistant_masks"])


def _orch_mask(directory, messages: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    counter = TextCounter(*find_tokenizer(load_model("tiny"), str(directory)))
    got = counter.tokens(Conversation("x:1", tuple(messages)))
    return got.ids, [int(y != IGNORE) for y in got.labels]


@pytest.mark.parametrize("conv", list(BPE_CONVS))
def test_a_templates_generation_blocks_train_what_hf_marks(tmp_path, conv):
    """Where the template marks what trains (`{% generation %}`), orch trains exactly HF's assistant mask."""
    from bpe_tokenizer import LLAVA_15_GENERATION, make_bpe_tokenizer

    directory = make_bpe_tokenizer(tmp_path, LLAVA_15_GENERATION, ("</s>",), "</s>")
    ids, mask = _orch_mask(directory, BPE_CONVS[conv])
    assert (ids, mask) == _hf_mask(directory, LLAVA_15_GENERATION, BPE_CONVS[conv])


@pytest.mark.parametrize("conv", list(BPE_CONVS))
@pytest.mark.parametrize("family", ["llava-1.5", "qwen2-vl"])
def test_a_byte_level_answers_first_token_trains_as_hf_marks_it(tmp_path, family, conv):
    """LLaVA-1.5's `ASSISTANT: {answer}</s>` and Qwen2-VL's real ChatML template, with no `{% generation %}`: each
    token overlapping an answer or its end of turn trains, as HF marks the same template with its answers in
    generation blocks (the answer's first token `Ġyes`, `Ġ(` included: a one-word answer trains it and `</s>`)."""
    from bpe_tokenizer import (
        LLAVA_15,
        LLAVA_15_MARKED,
        QWEN2_VL,
        QWEN2_VL_MARKED,
        QWEN2_VL_SPECIALS,
        make_bpe_tokenizer,
    )

    if family == "llava-1.5":
        template, marked, specials, eos = LLAVA_15, LLAVA_15_MARKED, ("</s>",), "</s>"
    else:
        template, marked, specials, eos = QWEN2_VL, QWEN2_VL_MARKED, QWEN2_VL_SPECIALS, "<|im_end|>"
    directory = make_bpe_tokenizer(tmp_path, template, specials, eos)
    ids, mask = _orch_mask(directory, BPE_CONVS[conv])
    hf_ids, hf_mask = _hf_mask(directory, marked, BPE_CONVS[conv])
    assert (ids, mask) == (hf_ids, hf_mask)
    if family == "llava-1.5" and conv in ("one word", "punctuation first"):
        import transformers

        trained = transformers.AutoTokenizer.from_pretrained(str(directory)).convert_ids_to_tokens(
            [i for i, m in zip(ids, mask, strict=True) if m]
        )
        assert trained == ["Ġyes", "</s>"] if conv == "one word" else trained[:3] == ["Ġ(", "a", ")"]
