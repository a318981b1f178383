"""LLaMA-Factory's dataset description read as LLaMA-Factory reads it: columns and tags renamed, alpaca's and
sharegpt's defaults, a folder as file_name, media_dir; each source keeps its layout through the index to the
samples every rank reads."""

import json

import pytest

from orch.planner.errors import SpecError
from orch.runtime.data.conversations import Conversation, SampleFile, read_conversations, read_sources


def _describe(folder, entries: dict) -> str:
    (folder / "dataset_info.json").write_text(json.dumps(entries))
    return str(folder / "dataset_info.json")


def test_columns_tags_and_media_dir(tmp_path):
    (tmp_path / "pics").mkdir()
    records = [{"dialog": [{"who": "me", "said": "<image>hi"}, {"who": "bot", "said": "yo"}], "sys": "be brief",
                "pictures": ["a.png"]}]  # fmt: skip
    (tmp_path / "chat.json").write_text(json.dumps(records))
    (tmp_path / "qa.jsonl").write_text(json.dumps({"q": "why", "ctx": "sky", "a": "blue", "sys": "s"}) + "\n")
    info = _describe(tmp_path, {
        "chat": {"file_name": "chat.json", "formatting": "sharegpt", "media_dir": "pics",
                 "columns": {"messages": "dialog", "system": "sys", "images": "pictures"},
                 "tags": {"role_tag": "who", "content_tag": "said", "user_tag": "me", "assistant_tag": "bot"}},
        "qa": {"file_name": "qa.jsonl", "columns": {"prompt": "q", "query": "ctx", "response": "a", "system": "sys"}},
    })  # fmt: skip
    chat, qa = read_sources(f"{info}:chat,qa")
    first = next(read_conversations(chat.path, chat))
    assert isinstance(first, Conversation)
    assert first.messages == (("system", "be brief"), ("user", "<image>hi"), ("assistant", "yo"))
    assert first.images == (str(tmp_path / "pics" / "a.png"),)
    conv = next(read_conversations(qa.path, qa))
    assert isinstance(conv, Conversation)
    assert conv.messages == (("system", "s"), ("user", "why\nsky"), ("assistant", "blue"))
    # without the description the same file is no conversation; its recipe in the index's summary reads it again
    assert not isinstance(next(read_conversations(chat.path)), Conversation)
    assert SampleFile.of({"path": chat.path, **chat.as_json()}).get(1) == first
    # --media-root wins over the description's media_dir
    moved = next(read_conversations(chat.path, chat, media_root=str(tmp_path / "elsewhere")))
    assert isinstance(moved, Conversation) and moved.images == (str(tmp_path / "elsewhere" / "a.png"),)
    assert SampleFile.of({"path": chat.path, **chat.as_json()}, str(tmp_path / "elsewhere")).get(1) == moved


def test_a_folder_as_file_name_and_the_index_keeps_the_layout(tmp_path):
    from orch.runtime.data.demo_data import make_tokenizer
    from orch.runtime.data.index import build_index
    from orch.runtime.models.registry import load_model

    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(2):
        (parts / f"{i}.jsonl").write_text(json.dumps({"ask": f"q{i}", "say": "a red circle"}) + "\n")
    info = _describe(tmp_path, {"d": {"file_name": "parts", "columns": {"prompt": "ask", "response": "say"}}})
    tok = make_tokenizer(tmp_path / "tok" / "tokenizer.json")
    idx = build_index(f"{info}:d", load_model("tiny"), str(tok))
    assert [s["samples"] for s in idx.sources] == [1, 1] and not idx.bad
    assert [s["layout"]["columns"] for s in idx.sources] == [{"prompt": "ask", "response": "say"}] * 2
    renamed = _describe(tmp_path, {"d": {"file_name": "parts", "columns": {"prompt": "ask", "response": "nope"}}})
    with pytest.raises(SpecError, match="no usable sample: 0.jsonl:1: nope: expected a string"):
        build_index(f"{renamed}:d", load_model("tiny"), str(tok))  # another layout keys another index


@pytest.mark.parametrize(
    ("entry", "what"),
    [
        ({"file_name": "x.json", "formatting": "chatml"}, "d.formatting: expected one of alpaca, sharegpt, openai"),
        ({"file_name": "x.json", "columns": {"chosen": "c"}}, "d.columns.chosen: not one orch reads"),
        ({"file_name": "x.json", "num_samples": 5}, "d.num_samples: not read by orch"),
        ({"file_name": "missing.json"}, "d.file_name: "),
        ({"ms_hub_url": "a/b"}, "d.ms_hub_url: a hub dataset: orch reads local files"),
    ],
)
def test_what_a_bad_entry_is_told(tmp_path, entry, what):
    (tmp_path / "x.json").write_text("[]")
    info = _describe(tmp_path, {"d": entry})
    with pytest.raises(SpecError) as err:
        read_sources(f"{info}:d")
    assert what in str(err.value) and str(err.value).startswith(info)


def test_a_run_reads_a_described_dataset_as_the_index_did(tmp_path):
    """What a training rank opens (BatchSource over the plan's data spec) reads each row by its source's layout and
    media folder, and tokenizes it to the text the index counted."""
    from orch.cli.data_cmd import conversation_data
    from orch.planner.data import read_manifest
    from orch.runtime.data.demo_data import make_tokenizer
    from orch.runtime.data.source import BatchSource
    from orch.runtime.models.registry import load_model

    records = [{"ask": f"what is {w}", "say": f"a {w} circle", "sys": "be brief"} for w in ("red", "blue", "green")]
    (tmp_path / "d.json").write_text(json.dumps(records))
    info = _describe(tmp_path, {"d": {"file_name": "d.json", "columns": {"prompt": "ask", "response": "say",
                                                                          "system": "sys"}}})  # fmt: skip
    tok = make_tokenizer(tmp_path / "tok" / "tokenizer.json")
    model = load_model("tiny")
    data, _ = conversation_data(model, f"{info}:d", 3, None, str(tok))
    files = BatchSource(model, data, seed=0).files
    assert files is not None
    rows = read_manifest(data.manifest)
    for row in range(3):
        conv = files.conversation(row)
        assert isinstance(conv, Conversation) and conv.messages[0] == ("system", "be brief")
        text = files.text(row)
        assert text is not None and len(text.ids) == dict(rows[row])["llm"]
