"""The text a model is trained on (runtime/data/index.py): the chat template rendered with the tokenizer's
special tokens, and labels on the assistant's contents through the template's end-of-turn token."""

import json

import pytest

from orch.planner.errors import SpecError
from orch.planner.loading import load_model
from orch.runtime.data.conversations import Conversation
from orch.runtime.data.index import IGNORE, TextCounter, find_tokenizer

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
