"""LLaMA-Factory's own demo data (tests/data/llamafactory: its files as they are, its dataset_info.json entries)
through `orch data index` and `orch data inspect`, by `--data dataset_info.json:NAME`, by file and by directory,
with a LLaVA (SigLIP + Qwen2) and a Qwen2-Audio whose processors transformers saved, and a Qwen2-VL
(tests/qwen_vl_models.py). The media they name are written here (images, clips and videos of those names). The
token ids of every image, audio and video sample equal each family's HF processor's; the refusals are the
documented ones (a video or audio the model has no encoder for, a hub dataset, preference data)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hf_models import CHATML, make_chat_tokenizer, make_llava, make_qwen2_audio
from qwen_vl_data import hf_processor, write_image, write_video
from qwen_vl_models import make_qwen_vl

from orch.runtime.models.qwen_vl.media import read_rule

DEMO = Path(__file__).resolve().parent.parent / "data" / "llamafactory"
CLIPS = {"1.mp3": 16000, "2.wav": 21930, "3.flac": 11690, "4.mp3": 8000}  # 16 kHz samples


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """LLaMA-Factory's layout: data/ with the demo files and their media, v1_multimodal_demo.jsonl at the root (its
    paths are relative to LLaMA-Factory's root, `data/mllm_demo_data/...`), and the three models."""
    import soundfile
    import transformers

    root = tmp_path_factory.mktemp("llamafactory")
    data = root / "data"
    shutil.copytree(DEMO, data)
    shutil.copy(DEMO / "v1_multimodal_demo.jsonl", root)
    media = data / "mllm_demo_data"
    for i, (w, h) in enumerate([(64, 48), (40, 60), (100, 30)], start=1):
        write_image(media / f"{i}.png", w, h, seed=i)
        (media / f"{i}.png").rename(media / f"{i}.jpg")  # the demo's names (Pillow reads a PNG by its header)
    for i, (name, n) in enumerate(CLIPS.items()):
        wave = (0.3 * np.random.default_rng(i).standard_normal(n)).astype(np.float32)
        soundfile.write(media / name, wave, 16000)
    for name in ("1.mp4", "2.avi", "3.mp4", "4.mp4"):
        write_video(media / name, frames=8, width=56, height=56, rate=4)

    tok = make_chat_tokenizer(root / "tok")
    llava = make_llava(root / "llava", "siglip", "qwen2", image_token=tok.convert_tokens_to_ids("<image>"),
                       vocab_size=len(tok))  # fmt: skip
    images = transformers.SiglipImageProcessorPil(size={"height": 28, "width": 28})
    transformers.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=7, chat_template=CHATML,
                                vision_feature_select_strategy="full").save_pretrained(llava)  # fmt: skip
    audio = make_qwen2_audio(root / "qwen2-audio", audio_token=tok.convert_tokens_to_ids("<|AUDIO|>"), vocab=len(tok),
                             max_source_positions=1500)  # fmt: skip
    transformers.Qwen2AudioProcessor(feature_extractor=transformers.WhisperFeatureExtractor(feature_size=16),
                                     tokenizer=tok, chat_template=CHATML).save_pretrained(audio)  # fmt: skip
    qwen = make_qwen_vl(root / "qwen2-vl", "qwen2_vl")
    return root, {"llava": llava, "audio": audio, "qwen": qwen}


def _ok(cli, *args) -> str:
    r = cli(*args)
    assert r.exit_code == 0, r.output
    return r.output


def _inspect(cli, data: str, model: Path, sample: int) -> dict:
    out = _ok(cli, "data", "inspect", data, "--model", str(model), "--sample", str(sample), "--json")
    return json.loads(out[out.index("{") :])


def _records(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def test_images_by_dataset_info_file_and_v1_parts_equal_llava_processors(demo, cli):
    import transformers
    from PIL import Image

    root, models = demo
    info = str(root / "data" / "dataset_info.json")
    assert "6 samples" in _ok(cli, "data", "index", f"{info}:mllm_demo", "--model", str(models["llava"]))
    # LLaMA-Factory's dataset_dir and dataset name the same, its index kept beside the description
    out = _ok(cli, "data", "index", f"{root / 'data'}:mllm_demo", "--model", str(models["llava"]), "--json")
    summary = json.loads(out[out.index("{") :])
    assert summary["samples"] == 6 and Path(summary["manifest"]).parent == root / "data" / ".orch-index"
    assert Path(summary["manifest"]).name.startswith("dataset_info-")
    processor = transformers.AutoProcessor.from_pretrained(models["llava"])
    for k, record in enumerate(_records(root / "data" / "mllm_demo.json"), start=1):
        text = processor.apply_chat_template(record["messages"], tokenize=False)
        pil = [Image.open(root / "data" / f).convert("RGB") for f in record["images"]]
        want = processor(text=text, images=pil, return_tensors="np")["input_ids"][0].tolist()
        assert _inspect(cli, f"{info}:mllm_demo", models["llava"], k)["input_ids"] == want
        # the same conversation as typed parts (v1_multimodal_demo.jsonl), read by its keys
        v1 = _inspect(cli, str(root / "v1_multimodal_demo.jsonl"), models["llava"], k)["input_ids"]
        assert v1 == want


def test_audio_equals_qwen2_audio_processors(demo, cli):
    import soundfile
    import transformers

    root, models = demo
    info = str(root / "data" / "dataset_info.json")
    assert "3 samples" in _ok(cli, "data", "index", f"{info}:mllm_audio_demo", "--model", str(models["audio"]))
    processor = transformers.AutoProcessor.from_pretrained(models["audio"])
    for k, record in enumerate(_records(root / "data" / "mllm_audio_demo.json"), start=1):
        messages = [{**m, "content": m["content"].replace("<audio>", "<|audio_bos|><|AUDIO|><|audio_eos|>")}
                    for m in record["messages"]]  # fmt: skip
        waves = [soundfile.read(root / "data" / f, dtype="float32")[0] for f in record["audios"]]
        out = processor(text=processor.apply_chat_template(messages, tokenize=False), audio=waves,
                        sampling_rate=16000, return_tensors="np")  # fmt: skip
        assert _inspect(cli, f"{info}:mllm_audio_demo", models["audio"], k)["input_ids"] == out["input_ids"][0].tolist()


def test_qwen2_vl_takes_the_images_and_videos(demo, cli):
    from PIL import Image

    root, models = demo
    info = str(root / "data" / "dataset_info.json")
    assert "3 samples" in _ok(cli, "data", "index", f"{info}:mllm_video_demo", "--model", str(models["qwen"]))
    processor = hf_processor(models["qwen"], "Qwen2VLProcessor")
    video_id = json.loads((models["qwen"] / "config.json").read_text())["video_token_id"]
    rule = read_rule(str(models["qwen"]), "qwen2_vl")
    for k, record in enumerate(_records(root / "data" / "mllm_video_demo.json"), start=1):
        # HF's processor around the video (its video processor needs torchvision): the text before and after it,
        # and the video's pads by its grid between <|vision_start|> and <|vision_end|>
        messages = [{**m, "content": m["content"].replace("<video>", "<|vision_start|>\x00<|vision_end|>")}
                    for m in record["messages"]]  # fmt: skip
        before, after = processor.tokenizer.apply_chat_template(messages, tokenize=False).split("\x00")
        t, h, w, _ = rule.video_item(str(root / "data" / record["videos"][0]))
        want = [*processor(text=[before])["input_ids"][0], *[video_id] * (t * h * w // 4),
                *processor(text=[after])["input_ids"][0]]  # fmt: skip
        assert _inspect(cli, f"{info}:mllm_video_demo", models["qwen"], k)["input_ids"] == want
    for k, record in enumerate(_records(root / "data" / "mllm_demo.json"), start=1):
        messages = [{**m, "content": m["content"].replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")}
                    for m in record["messages"]]  # fmt: skip
        pil = [Image.open(root / "data" / f).convert("RGB") for f in record["images"]]
        text = processor.tokenizer.apply_chat_template(messages, tokenize=False)
        want = processor(text=[text], images=pil, return_tensors="np")["input_ids"][0].tolist()
        assert _inspect(cli, f"{info}:mllm_demo", models["qwen"], k)["input_ids"] == want


def test_text_tool_calls_and_several_names(demo, cli):
    """alpaca and the glaive tool-call demo (function_call trained as the template writes it: this one's template
    has no tool calls, so their JSON text), several names at once."""
    root, models = demo
    info = str(root / "data" / "dataset_info.json")
    out = _ok(cli, "data", "index", f"{info}:alpaca_en_demo,glaive_toolcall_en_demo,mllm_demo", "--model",
              str(models["llava"]), "--json")  # fmt: skip
    summary = json.loads(out[out.index("{") :])
    assert [s["samples"] for s in summary["sources"]] == [3, 3, 6] and not any(s["bad"] for s in summary["sources"])
    record = _records(root / "data" / "glaive_toolcall_en_demo.json")[0]
    tok = make_chat_tokenizer(root / "tok2")
    trained = sum(len(tok(t["value"] + "<|im_end|>", add_special_tokens=False)["input_ids"])
                  for t in record["conversations"] if t["from"] in ("gpt", "function_call"))  # fmt: skip
    assert _inspect(cli, f"{info}:glaive_toolcall_en_demo", models["llava"], 1)["trained_tokens"] == trained


def test_documented_refusals(demo, cli):
    root, models = demo
    info = str(root / "data" / "dataset_info.json")
    model = ("--model", str(models["llava"]))
    cases = {
        info: f"{info}: name the datasets to read: {info}:NAME[,NAME] (it describes alpaca_en_demo, ",
        f"{info}:nope": f"{info}: nope: no such dataset (it describes alpaca_en_demo, ",
        f"{info}:alpaca_en": f"{info}: alpaca_en.hf_hub_url: a hub dataset: orch reads local files",
        f"{info}:dpo_en_demo": f"{info}: dpo_en_demo.ranking: preference (ranking) data",
        f"{info}:mllm_video_demo": "mllm_video_demo.json:1: videos: the model takes no video (its vision encoder "
        "takes images only)",
    }
    for data, what in cases.items():
        r = cli("data", "index", data, *model)
        assert r.exit_code == 1 and what in r.output and "Traceback" not in r.output, r.output
    r = cli("data", "index", f"{info}:mllm_video_audio_demo", "--model", str(models["qwen"]))
    assert r.exit_code == 1 and "audios: the model has no audio encoder to take them" in r.output


def test_a_directory_reads_its_data_files_or_says_what_it_expected(demo, cli, tmp_path):
    root, models = demo
    folder = tmp_path / "two"
    folder.mkdir()
    shutil.copy(root / "data" / "mllm_demo.json", folder)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(_records(root / "data" / "alpaca_en_demo.json")), folder / "alpaca.parquet")
    (folder / "mllm_demo_data").symlink_to(root / "data" / "mllm_demo_data")
    out = _ok(cli, "data", "index", str(folder), "--model", str(models["llava"]), "--json")
    summary = json.loads(out[out.index("{") :])
    sources = summary["sources"]
    assert summary["samples"] == 9  # a folder's files concatenated, as LLaMA-Factory reads a folder
    assert [(Path(s["path"]).name, s["samples"]) for s in sources] == [
        ("alpaca.parquet", 3),
        ("mllm_demo.json", 6),
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("data", "index", str(empty), "--model", str(models["llava"]))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"{empty}: a directory as DATA: expected .jsonl, .json or .parquet data files in it, found none" in r.output
    described = tmp_path / "described"
    described.mkdir()
    shutil.copy(root / "data" / "dataset_info.json", described)
    r = cli("data", "index", str(described), "--model", str(models["llava"]))
    assert r.exit_code == 1 and f"name its datasets, {described}/dataset_info.json:NAME" in r.output
