"""`orch data index` and conversation data wherever a data spec goes (`orch plan --data`, `orch analyze`):
each sample's tokens per module from the files' headers, the bad samples as file:line, the cache."""

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from orch.planner.data import read_manifest
from orch.runtime.data.conversations import is_conversation_data, read_conversations
from orch.runtime.data.demo_data import make_dataset, make_tokenizer
from orch.runtime.data.index import build_index
from orch.runtime.models.registry import load_model


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("conversations")
    data = make_dataset(root)
    tok = make_tokenizer(root / "tok" / "tokenizer.json")
    return root, data, tok


def _rows(manifest):
    return [dict(r) for r in read_manifest(manifest)]


def test_index_counts_each_module_from_the_headers(dataset):
    import soundfile
    from PIL import Image
    from tokenizers import Tokenizer

    root, data, tok = dataset
    model = load_model("tiny")  # vision: 4x4 RGB patches (input_dim 48); audio: 2 mel frames a token, downsample 2
    idx = build_index(str(data), model, str(tok))
    rows = _rows(idx.manifest)
    convs = list(read_conversations(str(data)))
    assert len(rows) == len(convs) == idx.samples == 11 and not idx.bad
    words = Tokenizer.from_file(str(tok))
    for row, conv in zip(rows, convs, strict=True):
        vision = sum(math.ceil(w / 4) * math.ceil(h / 4) for w, h in (Image.open(f).size for f in conv.images))
        audio = sum(soundfile.info(f).frames // 160 // 2 for f in conv.audios)  # 16 kHz: 160 samples a mel frame
        text = sum(len(words.encode(c.replace("<image>", "").replace("<audio>", "")).ids) for _, c in conv.messages)
        assert row == {"vision": vision, "audio": audio, "llm": text + vision + math.ceil(audio / 2)}
    assert {r["vision"] > 0 for r in rows} == {True, False}  # images of several sizes, and samples without


def test_bad_samples_are_named_and_the_rest_indexed(dataset, cli, tmp_path):
    root, data, tok = dataset
    bad = root / "bad.jsonl"
    (root / "media" / "corrupt.png").write_text("not an image")
    extra = [
        '{"messages": [{"role": "user", "content": "<image>hi"}], "images": ["media/missing.png"]}',
        "not json",
        '{"messages": [{"role": "user", "content": "<image><image>hi"}], "images": ["media/corrupt.png"]}',
        '{"messages": [{"role": "user", "content": "<image>hi"}], "images": ["media/corrupt.png"]}',
        '{"messages": [{"role": "robot", "content": "hi"}]}',
        '{"conversations": [{"from": "gpt", "value": "hello"}, {"from": "human", "value": "hi"}]}',
    ]
    bad.write_text(data.read_text() + "\n".join(extra) + "\n")
    r = cli("data", "index", str(bad), "--model", "tiny", "--tokenizer", str(tok))
    assert r.exit_code == 0  # listed and skipped: a script that indexes before training goes on
    out = " ".join(r.output.split())
    missing = root / "media" / "missing.png"  # the path tried, whole
    assert f"warning: bad.jsonl:12: images[0]: {missing}: file not found" in out
    assert "warning: bad.jsonl:13: not valid JSON" in out
    assert "warning: bad.jsonl:14: 1 images for 2 <image> placeholders" in out
    assert (
        "bad.jsonl:15: images[0]: " + str(root / "media" / "corrupt.png") + ": cannot read (UnidentifiedImageError)"
        in out
    )
    assert (
        "warning: bad.jsonl:16: messages[0].role: expected one of user, human, assistant, gpt, system, function_call,"
        " tool_call, observation, tool, tool_response, function, got 'robot'"
    ) in out
    assert ("warning: bad.jsonl:17: conversations[0]: the conversation opens with the assistant's turn (from: 'gpt'):"
            " expected a user turn first") in out  # fmt: skip
    assert "warning: 6 samples skipped: 6 malformed (--strict: exit 1)" in out and "Traceback" not in out
    strict = cli("data", "index", str(bad), "--model", "tiny", "--tokenizer", str(tok), "--strict")
    assert strict.exit_code == 1 and "error: bad.jsonl:13: not valid JSON" in strict.output
    assert build_index(str(bad), load_model("tiny"), str(tok)).samples == 11  # the good ones, cached


def test_the_index_is_cached_until_the_data_changes(dataset, tmp_path):
    root, data, tok = dataset
    copy = tmp_path / "copy.jsonl"
    copy.write_text(data.read_text().replace("media/", f"{root}/media/"))
    model = load_model("tiny")
    first = build_index(str(copy), model, str(tok))
    assert not first.cached and Path(first.manifest).parent == tmp_path / ".orch-index"
    assert build_index(str(copy), model, str(tok)).cached
    with copy.open("a") as f:
        f.write('{"messages": [{"role": "user", "content": "say"}, {"role": "assistant", "content": "a"}]}\n')
    os.utime(copy, ns=(1, 1))
    again = build_index(str(copy), model, str(tok))
    assert not again.cached and again.samples == 12
    other = build_index(str(copy), model, str(tok), max_image_tokens=8)  # other rules: another index
    per_image = [n for r in map(json.loads, Path(other.manifest).read_text().splitlines())
                 for n in r.get("media", {}).get("vision", [r["lengths"]["vision"]])]  # fmt: skip
    assert not other.cached and max(per_image) == 8


def test_json_parquet_sharegpt_and_mix_files_read_alike(dataset, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root, data, tok = dataset
    records = [json.loads(line) for line in data.read_text().splitlines()]
    (root / "data.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist([{**r, "images": r.get("images", []), "audios": r.get("audios", [])}
                                         for r in records]), root / "data.parquet")  # fmt: skip
    share = [
        {"conversations": [{"from": {"user": "human", "assistant": "gpt"}[m["role"]], "value": m["content"]}
                           for m in r["messages"]], **{k: v for k, v in r.items() if k != "messages"}}
        for r in records
    ]  # fmt: skip
    (root / "share.jsonl").write_text("".join(json.dumps(r) + "\n" for r in share))
    model = load_model("tiny")
    want = _rows(build_index(str(data), model, str(tok)).manifest)
    for name in ("data.json", "data.parquet", "share.jsonl"):
        assert is_conversation_data(str(root / name))
        assert _rows(build_index(str(root / name), model, str(tok)).manifest) == want, name
    mix = root / "mix.yaml"
    mix.write_text(
        yaml.safe_dump({"sources": [{"path": "data.jsonl", "weight": 3}, {"path": "share.jsonl", "weight": 1}]})
    )
    assert is_conversation_data(str(mix)) and not is_conversation_data("templates/manifests/omni-sample.jsonl")
    mixed = build_index(str(mix), model, str(tok))
    assert mixed.samples == 22 and mixed.strategy == "interleave_over"  # every row of each source, once
    assert [s["share"] for s in mixed.sources] == [0.75, 0.25]


def test_chat_template_tokens_are_counted(dataset, tmp_path):
    root, data, tok = dataset
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(tok.read_text())
    template = "{% for m in messages %}{{ m['role'] }} ? {{ m['content'] }} ? {% endfor %}"
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    model = load_model("tiny")
    plain = _rows(build_index(str(data), model, str(tok)).manifest)
    templated = _rows(build_index(str(data), model, str(folder)).manifest)
    # each turn adds its role word and two "?" (user -> [UNK], assistant -> [UNK]): 3 tokens a turn, 2 turns
    assert [t["llm"] - p["llm"] for t, p in zip(templated, plain, strict=True)] == [6] * len(plain)


def test_plan_and_analyze_take_a_data_file(dataset, cli, tmp_path):
    root, data, tok = dataset
    out = tmp_path / "plan.yaml"
    r = cli("plan", "--model", "tiny", "--cluster", "local-cpu", "--data", str(data), "--tokenizer", str(tok),
            "--global-batch", "8", "--out", str(out))  # fmt: skip
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())  # rich wraps at the terminal's width
    assert "data: 11 samples of" in said and "seq_len 256 (--seq-len; the longest sample)" in said
    plan = yaml.safe_load(out.read_text())
    assert plan["data"]["global_batch"] == 8 and plan["data"]["seq_len"] == 256
    assert Path(plan["data"]["manifest"]).parent == root / ".orch-index"
    a = cli("analyze", str(data), "--model", "tiny", "--tokenizer", str(tok), "--dp", "8", "--micro-batch", "2")
    assert a.exit_code == 0, a.output
    refused = cli("analyze", str(data), "--dp", "8", "--micro-batch", "2")
    assert refused.exit_code == 1 and "pass --model" in " ".join(refused.output.split())
    missing = cli("data", "index", str(tmp_path / "none.jsonl"), "--model", "tiny", "--tokenizer", str(tok))
    assert missing.exit_code == 1 and "none.jsonl: data file not found" in " ".join(missing.output.split())
    no_tok = cli("data", "index", str(data), "--model", "tiny")
    assert no_tok.exit_code == 1 and "--tokenizer" in no_tok.output


def test_profile_times_blocks_at_the_lengths_a_data_file_has(dataset):
    from orch.cli.data_cmd import data_spec_for
    from orch.runtime.profile.cases import ProfileConfig, data_lengths

    root, data, tok = dataset
    model = load_model("tiny")
    spec, hint = data_spec_for(model, str(data), "profiling on", 8, None, str(tok))  # as `orch profile --data`
    assert spec.manifest is not None and hint is not None and spec.global_batch == 8
    rows = _rows(spec.manifest)
    vision = sorted(r["vision"] for r in rows if r.get("vision"))
    cfg = ProfileConfig(model.model_dump_json(), spec.model_dump_json(), ranks_per_node=1)
    assert data_lengths(cfg.data_json, "vision", "llm")[-1] == vision[-1]  # the longest sample is timed
    assert set(cfg.seq_lengths("vision", "llm")) >= {vision[len(vision) // 2], vision[-1]}


def test_processing_gives_the_index_counts_and_labels_on_assistant_turns_only(dataset, cli):
    from tokenizers import Tokenizer

    from orch.runtime.data.index import IGNORE, TextCounter, TokenRules
    from orch.runtime.data.processing import process

    root, data, tok = dataset
    model = load_model("tiny")
    rules, counter = TokenRules.of(model), TextCounter(str(tok), None)
    words = Tokenizer.from_file(str(tok))
    rows = _rows(build_index(str(data), model, str(tok)).manifest)
    for conv, row in zip(read_conversations(str(data)), rows, strict=True):
        out = process(conv, model, rules, counter, seq_len=4096)
        assert out.features["vision"].shape == (row["vision"], 48)  # 4x4 RGB patches
        assert out.features["audio"].shape == (2 * row["audio"], 16)  # 2 mel frames a token, 16 bins
        assert len(out.input_ids) + row["vision"] + -(-row["audio"] // 2) == row["llm"]
        answer = [c.replace("<image>", " ") for r, c in conv.messages if r == "assistant"]
        assert [y for y in out.labels if y != IGNORE] == words.encode("".join(answer), add_special_tokens=False).ids
        pixels = out.features["vision"]
        assert pixels.numel() == 0 or (pixels.min() >= 0 and pixels.max() <= 1)
    r = cli("data", "inspect", str(data), "--model", "tiny", "--tokenizer", str(tok), "--sample", "2", "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output)
    assert len(shown["input_ids"]) == len(shown["labels"]) and shown["encoder_inputs"]["vision"][1] == 48
    assert shown["labels"][0] == -100 and shown["trained_tokens"] == sum(1 for y in shown["labels"] if y != -100) > 0
    short = cli("data", "inspect", str(data), "--model", "tiny", "--tokenizer", str(tok), "--seq-len", "52", "--json")
    assert json.loads(short.output)["truncated"]  # 48 image tokens leave 4 of the 52 for its 9 text tokens
    bad = cli("data", "inspect", str(data), "--model", "tiny", "--tokenizer", str(tok), "--sample", "99")
    assert bad.exit_code == 1 and "no sample at line 99 (numbered by file line from 1" in bad.output


def test_token_rules_of_windowed_towers_and_capped_images():
    from orch.runtime.data.index import image_tokens
    from orch.runtime.sample import EncoderRule, audio_tokens

    whisper = EncoderRule("audio", "audio", 2, clip_tokens=1500, frames_per_token=2)  # 30 s windows, pooled by 2
    assert audio_tokens(whisper, 16000 * 30, 16000) == 1500  # the clip's own frames, not padded windows
    assert audio_tokens(whisper, 16000 * 31, 16000) == 1550
    assert audio_tokens(whisper, 8000 * 10, 8000) == 500  # any rate: the 16 kHz mel frames count
    assert audio_tokens(whisper, 16000 * 31 + 160 * 2, 16000) == 1552  # 1551 tokens: whole LLM tokens of 2
    plain = EncoderRule("audio", "audio", 2, frames_per_token=2)
    assert audio_tokens(plain, 16000, 16000) == 50  # 100 frames a second, 2 a token
    patches = EncoderRule("vision", "vision", 1, patch=14)
    assert image_tokens(patches, 224, 224, 1024) == 256
    assert image_tokens(patches, 1400, 700, 1024) <= 1024 < 100 * 50  # scaled down, aspect kept
    assert image_tokens(EncoderRule("vision", "vision", 1, image_tokens=576), 1400, 700, 1024) == 576


def test_the_demo_llava_inspects_with_its_own_image_token(tmp_path, cli):
    from orch.runtime.data.demo_data import make_dataset, make_tokenizer
    from orch.runtime.data.demo_model import make_demo_llava

    data = make_dataset(tmp_path / "data", images=6, tones=0)
    model_dir = make_demo_llava(tmp_path / "llava", make_tokenizer(tmp_path / "tok" / "tokenizer.json"))
    image_id = json.loads((model_dir / "config.json").read_text())["image_token_index"]  # what LlavaConfig saves
    for sample, images in ((2, 1), (5, 2)):  # sample 5: two images
        r = cli("data", "inspect", str(data), "--model", str(model_dir), "--sample", str(sample), "--json")
        assert r.exit_code == 0, r.output
        shown = json.loads(r.output[r.output.index("{") :])
        assert shown["input_ids"].count(image_id) == 16 * images  # 4x4 patches an image, CLIP's class token dropped
        assert len(shown["placeholders"]) == images


def test_an_epoch_smaller_than_a_step_is_said_so(dataset, cli):
    root, data, tok = dataset
    rows = len([ln for ln in data.read_text().splitlines() if ln.strip()])
    r = cli("data", "index", str(data), "--model", "tiny", "--tokenizer", str(tok), "--global-batch", str(4 * rows))
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert f"an epoch is {rows} draws, less than a step (a step of {4 * rows} draws spans 4.0 epochs)" in out
    r = cli("data", "index", str(data), "--model", "tiny", "--tokenizer", str(tok), "--global-batch", "2")
    assert f"an epoch is {rows} draws, {rows / 2:.1f} steps" in " ".join(r.output.split())


@pytest.mark.parametrize("command", [("data", "inspect"), ("data", "index"), ("plan",), ("profile",)])
def test_every_model_option_says_it_takes_a_hugging_face_directory(cli, command):
    """Users pass `--model ./Qwen2-VL-2B-Instruct`: every command's help says so (inspect's said spec or preset)."""
    shown = " ".join(cli(*command, "--help").output.replace("│", " ").split())
    assert "--model -m <str> Model spec file, preset, or Hugging Face model directory" in shown


def test_inspect_lights_a_byte_level_answers_first_token(cli, tmp_path):
    """`orch data inspect` over a byte-level BPE tokenizer and LLaVA-1.5's `ASSISTANT: {answer}</s>`: a one-word
    answer's `Ġyes` (the template's space merged in) and `</s>` are trained, as HF's assistant mask marks them."""
    import transformers
    from bpe_tokenizer import LLAVA_15, LLAVA_15_MARKED, make_bpe_tokenizer

    tok = make_bpe_tokenizer(tmp_path / "tok", LLAVA_15, ("</s>",), "</s>")
    turns = [("human", "user", "What is in the picture?"), ("gpt", "assistant", "A tall strip"),
             ("human", "user", "Is the cat on the mat?"), ("gpt", "assistant", "yes")]  # fmt: skip
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"conversations": [{"from": f, "value": v} for f, _, v in turns]}) + "\n")
    args = ("data", "inspect", str(data), "--model", "tiny", "--tokenizer", str(tok), "--sample", "1")
    got = json.loads(cli(*args, "--json").stdout)
    hf = transformers.AutoTokenizer.from_pretrained(str(tok))
    ref = hf.apply_chat_template([{"role": r, "content": v} for _, r, v in turns], chat_template=LLAVA_15_MARKED,
                                 tokenize=True, return_dict=True, return_assistant_tokens_mask=True)  # fmt: skip
    assert got["input_ids"] == ref["input_ids"]
    assert got["labels"] == [i if m else -100 for i, m in zip(ref["input_ids"], ref["assistant_masks"], strict=True)]
    trained = hf.convert_ids_to_tokens([y for y in got["labels"] if y != -100])
    assert trained == ["A", "Ġta", "ll", "Ġs", "tri", "p", "</s>", "Ġyes", "</s>"]
    shown = " ".join(cli(*args).output.split())
    assert f"{len(trained)} trained (green)" in shown and "Ġyes </s>" in shown


@pytest.fixture(scope="module")
def data_forms(tmp_path_factory):
    """The one dataset as each form `--data` takes: a file, a mix file, a directory, a dataset_info.json entry, a
    data spec file and a preset; name -> (the --data value, whether it is conversation data); and its tokenizer."""
    root = tmp_path_factory.mktemp("forms")
    data = make_dataset(root / "set")
    tok = make_tokenizer(root / "tok" / "tokenizer.json")
    (root / "set" / "mix.yaml").write_text(yaml.safe_dump({"sources": [{"path": "data.jsonl", "weight": 1}]}))
    info = {"captions": {"file_name": "data.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages",
            "images": "images", "audios": "audios"}, "tags": {"role_tag": "role", "content_tag": "content",
            "user_tag": "user", "assistant_tag": "assistant"}}}  # fmt: skip
    (root / "set" / "dataset_info.json").write_text(json.dumps(info))
    folder = root / "folder"
    folder.mkdir()
    (folder / "data.jsonl").write_text(data.read_text().replace('"media/', f'"{root / "set" / "media"}/'))
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump({"name": "two tasks", "global_batch": 6, "seq_len": 128,
                                    "tasks": [{"name": "caption", "weight": 1.0, "tokens": {"llm": 100, "vision": 16}}]}))  # fmt: skip
    forms = {
        "file": (str(data), True),
        "mix": (str(root / "set" / "mix.yaml"), True),
        "directory": (str(folder), True),
        "dataset_info": (f"{root / 'set' / 'dataset_info.json'}:captions", True),
        "spec file": (str(spec), False),
        "preset": ("tiny-mix", False),
    }
    return forms, tok


@pytest.mark.parametrize("form", ["file", "mix", "directory", "dataset_info", "spec file", "preset"])
def test_plan_and_launch_take_every_form_of_data_alike(data_forms, form, cli, tmp_path, launched_tasks):
    """`--data` means one thing to `orch plan` and `orch launch`: conversation data (its index; trained at the
    plan's batch and seq_len), else a data spec file or preset (as it is)."""
    from orch.planner.loading import load_data
    from orch.planner.plan import Plan

    forms, tok = data_forms
    ref, conversations = forms[form]
    out = tmp_path / "plan.yaml"
    planned = cli("plan", "--model", "tiny", "--cluster", "local-cpu", "--data", ref, "--tokenizer", str(tok),
                  "--global-batch", "8", "--time-limit", "2", "--out", str(out))  # fmt: skip
    assert planned.exit_code == 0, planned.output
    plan = Plan.model_validate(yaml.safe_load(out.read_text()))
    run = tmp_path / "run"
    launched = cli("launch", str(out), "--data", ref, "--workdir", str(run))  # the plan's tokenizer
    assert launched.exit_code == 0, launched.output
    (task,) = launched_tasks
    if conversations:
        assert plan.data.source is not None and _rows(plan.data.manifest)
        assert plan.data.global_batch == 8 and len(_rows(plan.data.manifest)) == 11
        assert task.data == plan.data  # the same index, at the plan's batch and seq_len
        assert f"data: 11 samples of {ref}" in " ".join(launched.output.split())
    else:
        assert plan.data == load_data(ref).model_copy(update={"global_batch": 8})
        assert task.data == load_data(ref)  # a spec trains as it says
