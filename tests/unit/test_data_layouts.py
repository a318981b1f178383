"""Records in every layout LLaMA-Factory and ms-swift write read as the same conversation; a `system` and tool
turns rendered by the model's chat template exactly as `apply_chat_template` renders them, with the tool calls
trained and the tool answers not; what an unknown layout is told."""

import json
from pathlib import Path

import pytest

from orch.runtime.data.conversations import BadSample, Conversation, parse_sample
from orch.runtime.data.demo_data import make_tokenizer as demo_tokenizer
from orch.runtime.data.index import IGNORE, TextCounter

BASE = Path("/data")
TURNS = (("user", "<image>what is in the picture?"), ("assistant", "a red circle"), ("user", "and now?"),
         ("assistant", "a blue square"))  # fmt: skip
SAME = {
    "messages": {"messages": [{"role": r, "content": c} for r, c in TURNS], "images": ["a.png"]},
    "sharegpt": {
        "conversations": [{"from": {"user": "human", "assistant": "gpt"}[r], "value": c} for r, c in TURNS],
        "images": ["a.png"],
    },
    "swift conversation": {
        "conversation": [
            {"human": TURNS[0][1], "assistant": TURNS[1][1]},
            {"human": TURNS[2][1], "assistant": TURNS[3][1]},
        ],
        "images": ["a.png"],
    },
    "swift query": {
        "query": "and now?",
        "response": "a blue square",
        "history": [[TURNS[0][1], TURNS[1][1]]],
        "images": ["a.png"],
    },
    "alpaca": {
        "instruction": "and",
        "input": "now?",
        "output": "a blue square",
        "images": ["a.png"],
        "history": [[TURNS[0][1], TURNS[1][1]]],
    },
    "typed parts": {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "what is in the picture?"}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "a red circle"}]},
            {"role": "user", "content": "and now?"},
            {"role": "assistant", "content": "a blue square"},
        ]
    },
    "image_url parts": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "a.png"}},
                    {"type": "text", "text": "what is in the picture?"},
                ],
            },
            {"role": "assistant", "content": "a red circle"},
            {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
            {"role": "assistant", "content": "a blue square"},
        ]
    },
    "llamafactory v1 parts": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "value": "a.png"},
                    {"type": "text", "value": "what is in the picture?"},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "value": "a red circle"}]},
            {"role": "user", "content": [{"type": "text", "value": "and now?"}]},
            {"role": "assistant", "content": [{"type": "text", "value": "a blue square"}]},
        ]
    },
    "swift path objects": {
        "messages": [{"role": r, "content": c} for r, c in TURNS],
        "images": [{"path": "a.png"}],
    },
    "parts without paths": {
        "messages": [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is in the picture?"}]},
            {"role": "assistant", "content": "a red circle"},
            {"role": "user", "content": "and now?"},
            {"role": "assistant", "content": "a blue square"},
        ],
        "images": ["a.png"],
    },
}


@pytest.mark.parametrize("layout", list(SAME))
def test_every_layout_reads_as_the_same_conversation(layout):
    conv = parse_sample(SAME[layout], "d.jsonl:1", BASE)
    assert isinstance(conv, Conversation), conv
    want = TURNS if layout not in ("swift query", "alpaca") else (*TURNS[:2], ("user", "and\nnow?"), TURNS[3])
    assert conv.messages == (want if layout != "swift query" else TURNS)
    assert conv.images == ("/data/a.png",)


def test_system_key_and_system_turn():
    """A record's `system` (LLaMA-Factory's sharegpt column, ms-swift's key) is the first turn; a system turn of
    its own wins over it, as LLaMA-Factory's converter reads them."""
    rec = {"system": "be brief", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    conv = parse_sample(rec, "d:1", BASE)
    assert isinstance(conv, Conversation) and conv.messages[0] == ("system", "be brief")
    rec["conversations"].insert(0, {"from": "system", "value": "be kind"})
    conv = parse_sample(rec, "d:1", BASE)
    assert isinstance(conv, Conversation)
    assert conv.messages == (("system", "be kind"), ("user", "hi"), ("assistant", "yo"))
    swift = parse_sample({"system": "s", "conversation": [{"human": "q", "assistant": "r"}]}, "d:1", BASE)
    assert isinstance(swift, Conversation) and swift.messages == (("system", "s"), ("user", "q"), ("assistant", "r"))


@pytest.mark.parametrize(
    ("record", "what"),
    [
        (
            {"prompt": "hi", "answer": "yo"},
            "no conversation: expected messages or conversations (turns of role/content"
            " or from/value), conversation ({human, assistant} pairs), query/response, or instruction/output; the record"
            " has answer, prompt",
        ),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role: expected one of user, human, assistant"),
        (
            {"messages": [{"role": "user", "content": [{"type": "pdf", "pdf": "a.pdf"}]}]},
            "messages[0].content[0].type: expected text, image, image_url, audio, audio_url, video or video_url, got 'pdf'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}], "images": ["b.png"]},
            "images: files both in content parts and in the images list",
        ),
        ({"conversation": [{"user": "q"}]}, "conversation[0]: expected an object with human and assistant strings"),
        ({"messages": [{"role": "user", "content": "hi"}], "tools": "{not json"}, "tools: expected a list of tool"),
        (  # LLaMA-Factory's converter drops it ("Invalid role tag"): nothing asked, the answer would train alone
            {"conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}]},
            "conversations[0]: the conversation opens with the assistant's turn (from: 'gpt'): expected a user turn",
        ),
        (
            {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}]},
            "messages[1]: the conversation opens with the assistant's turn (role: 'assistant'): expected a user",
        ),
    ],
)
def test_what_a_bad_record_is_told(record, what):
    got = parse_sample(record, "d.jsonl:3", BASE)
    assert isinstance(got, BadSample) and got.where == "d.jsonl:3" and got.what.startswith(what), got


QWEN_LIKE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}You are a helpful assistant.{% endif %}\n\n# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{%- else %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{%- endif %}\n"
    "{%- for m in messages %}\n"
    "{%- if m.role == 'system' %}\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}\n"
    "{%- endfor %}"
)
TOOLS = [{"type": "function", "function": {"name": "search_recipes", "description": "find <recipes>",
          "parameters": {"type": "object", "properties": {"ingredients": {"type": "array"}}}}}]  # fmt: skip
GLAIVE = {  # LLaMA-Factory's glaive_toolcall_en_demo.json layout
    "conversations": [
        {"from": "human", "value": "I have chicken and rice."},
        {
            "from": "function_call",
            "value": json.dumps({"name": "search_recipes", "arguments": {"ingredients": ["chicken", "rice"]}}),
        },
        {"from": "observation", "value": '{"recipes": ["stir fry"]}'},
        {"from": "gpt", "value": "Try a stir fry."},
    ],
    "tools": json.dumps(TOOLS),
    "system": "You cook.",
}


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory):
    """A fast tokenizer whose chat template renders system prompts, tool definitions, calls and answers."""
    import transformers
    from tokenizers import Tokenizer

    folder = tmp_path_factory.mktemp("tok")
    path = demo_tokenizer(folder / "tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tok.save(str(path))
    transformers.logging.set_verbosity_error()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), unk_token="[UNK]", eos_token="<|im_end|>")
    fast.chat_template = QWEN_LIKE
    return fast, path


def _hf_messages(conv: Conversation) -> list[dict]:
    out = []
    for role, content in conv.messages:
        if role == "function_call":
            call = json.loads(content)
            out.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]})
        else:
            out.append({"role": role, "content": content})
    return out


def test_a_system_prompt_replaces_the_templates_default(hf_tokenizer):
    tok, path = hf_tokenizer
    counter = TextCounter(str(path), QWEN_LIKE, eos_token="<|im_end|>")
    conv = parse_sample({"system": "be brief", "messages": [{"role": "user", "content": "hi"},
                                                            {"role": "assistant", "content": "yo"}]}, "d:1", BASE)  # fmt: skip
    assert isinstance(conv, Conversation)
    text = counter.render(conv).text
    assert text == tok.apply_chat_template(_hf_messages(conv), tokenize=False)
    assert "be brief" in text and "You are a helpful assistant." not in text


def test_tool_turns_render_as_the_template_writes_them_and_calls_train(hf_tokenizer):
    """LLaMA-Factory's function_call / observation turns (and the OpenAI layout's tool_calls / role tool) render
    as `apply_chat_template` renders the HF messages with `tools`; the call and the answer after it train, the
    tool's answer and the user's turn do not."""
    tok, path = hf_tokenizer
    counter = TextCounter(str(path), QWEN_LIKE, eos_token="<|im_end|>")
    conv = parse_sample(GLAIVE, "d:1", BASE)
    assert isinstance(conv, Conversation) and [r for r, _ in conv.messages] == [
        "system", "user", "function_call", "tool", "assistant"]  # fmt: skip
    rendering = counter.render(conv)
    want = tok.apply_chat_template(_hf_messages(conv), tools=TOOLS, tokenize=False)
    assert rendering.text == want and "<recipes>" in want  # transformers' tojson: no HTML escapes
    trained = [rendering.text[a:b] for a, b in rendering.spans]
    call = '<tool_call>\n{"name": "search_recipes", "arguments": {"ingredients": ["chicken", "rice"]}}\n</tool_call>'
    assert trained == [call + "<|im_end|>", "Try a stir fry.<|im_end|>"]

    openai = {"system": "You cook.", "tools": TOOLS, "messages": [
        {"role": "user", "content": "I have chicken and rice."},
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {
            "name": "search_recipes", "arguments": json.dumps({"ingredients": ["chicken", "rice"]})}}]},
        {"role": "tool", "content": '{"recipes": ["stir fry"]}'},
        {"role": "assistant", "content": "Try a stir fry."}]}  # fmt: skip
    other = parse_sample(openai, "d:2", BASE)
    assert isinstance(other, Conversation)
    assert counter.render(other).text == want
    swift = {"system": "You cook.", "tools": json.dumps(TOOLS), "messages": [  # ms-swift's agent layout
        {"role": "user", "content": "I have chicken and rice."},
        {"role": "tool_call", "content": GLAIVE["conversations"][1]["value"]},
        {"role": "tool_response", "content": '{"recipes": ["stir fry"]}'},
        {"role": "assistant", "content": "Try a stir fry."}]}  # fmt: skip
    third = parse_sample(swift, "d:3", BASE)
    assert isinstance(third, Conversation) and third.messages == conv.messages and counter.render(third).text == want

    ids = counter.tokens(conv)
    trained_ids = [t for t, y in zip(ids.ids, ids.labels, strict=True) if y != IGNORE]
    assert trained_ids == tok(call + "<|im_end|>" + "Try a stir fry.<|im_end|>", add_special_tokens=False)["input_ids"]


def test_a_template_without_tool_calls_trains_the_calls_json(hf_tokenizer):
    _, path = hf_tokenizer
    plain = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    counter = TextCounter(str(path), plain, eos_token="<|im_end|>")
    conv = parse_sample(GLAIVE, "d:1", BASE)
    assert isinstance(conv, Conversation)
    rendering = counter.render(conv)
    trained = [rendering.text[a:b] for a, b in rendering.spans]
    assert trained == [conv.messages[2][1] + "<|im_end|>", "Try a stir fry.<|im_end|>"]


def test_a_sample_the_template_refuses_is_a_bad_sample(tmp_path, hf_tokenizer):
    from orch.runtime.data.index import build_index
    from orch.runtime.models.registry import load_model

    tok, path = hf_tokenizer
    folder = tmp_path / "tok"
    folder.mkdir()
    strict = "{% if messages | length > 2 %}{{ raise_exception('one exchange a sample') }}{% endif %}" + (
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    )
    (folder / "tokenizer.json").write_text(path.read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": strict}))
    data = tmp_path / "d.jsonl"
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}] * 2}]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    idx = build_index(str(data), load_model("tiny"), str(folder))
    assert idx.samples == 1
    assert idx.bad == ["d.jsonl:2: the chat template refuses it: one exchange a sample"]


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_a_data_file_in_no_layout_is_told_the_keys_orch_reads(cli, tmp_path, suffix):
    """Given to `orch plan --data`, samples in an unknown layout are read as samples (not as a data spec's
    fields), and the one line says which keys orch accepts and which the record has."""
    record = {"prompt": "hi", "answer": "yo"}
    data = tmp_path / f"d{suffix}"
    data.write_text(json.dumps(record) + "\n" if suffix == ".jsonl" else json.dumps([record]))
    tok = demo_tokenizer(tmp_path / "tok" / "tokenizer.json")
    r = cli("plan", "--model", "tiny", "--cluster", "local-cpu", "--data", str(data), "--tokenizer", str(tok))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"d{suffix}:1: no conversation: expected messages or conversations" in r.output
    assert "the record has answer, prompt" in r.output and "unknown field" not in r.output
