"""The Qwen-VL family's data side against Hugging Face's own processing: image grids by `smart_resize` (HF's
image processor's `image_grid_thw`, its errors), video grids from container headers (HF's samplers), the
index's rows (`items` in placeholder order), `orch data inspect --json` ids (HF's Qwen2_5_VLProcessor), the
video rows (HF's image processor's patches of the same frames), bad inputs skipped with `file:line:`, a
`<video>` refused where the model takes none, and Qwen3-VL's videos (its sampler, resize and timestamps from HF's
own source, the index's per-step items, the inspected ids against HF's expansion)."""

import json
from pathlib import Path

import pytest
from qwen_vl_data import hf_auto_images, hf_processor, qwen_vl_spec, turn, write_conversations, write_image, write_video
from qwen_vl_data import hf_images as _hf_images
from qwen_vl_models import make_qwen_vl

from orch.runtime.data.index import build_index
from orch.runtime.models.qwen_vl.media import VisionGrids, read_rule, smart_resize

SIZES = [(1, 1), (5, 3), (27, 29), (28, 28), (56, 57), (100, 60), (60, 100), (30, 500), (333, 222), (799, 801),
         (3000, 2000), (2000, 11), (1000, 5), (13, 2600)]  # fmt: skip


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-vl")
    directory = make_qwen_vl(root / "model", "qwen2_5_vl")
    return directory, qwen_vl_spec(directory)


def _hf_processor(directory):
    return hf_processor(directory, "Qwen2_5_VLProcessor")


@pytest.mark.parametrize("limits", ["pixels", "size"])
def test_image_grids_are_hfs(qwen, tmp_path, limits):
    """Every size's grid is HF's image processor's `image_grid_thw` (tiny images scaled up, huge ones down), for
    limits given as min/max_pixels or, as newer files write them, `size`."""
    from PIL import Image

    directory, _ = qwen
    if limits == "size":  # a copy of the directory whose preprocessor_config.json has size {shortest, longest}
        import shutil

        directory = Path(shutil.copytree(directory, tmp_path / "sized"))
        cfg = json.loads((directory / "preprocessor_config.json").read_text())
        cfg["size"] = {"shortest_edge": cfg.pop("min_pixels") * 2, "longest_edge": cfg.pop("max_pixels") // 2}
        (directory / "preprocessor_config.json").write_text(json.dumps(cfg))
    rule = read_rule(str(directory), "qwen2_5_vl")
    hf = _hf_images(directory)
    for w, h in SIZES:
        want = hf(images=[Image.new("RGB", (w, h))], return_tensors="np")["image_grid_thw"][0].tolist()
        assert list(rule.image_grid(w, h)) == want, (w, h)


def test_smart_resize_is_hfs_with_its_errors():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf

    for w, h in [(201, 1), (1, 1000), (4020, 20)]:
        with pytest.raises(ValueError, match="absolute aspect ratio must be smaller than 200"):
            smart_resize(h, w)
    for w, h in [*SIZES, (2000, 10), (10, 2000), (7, 1400), (50000, 300)]:  # 200 exactly is fine
        for limits in [(56 * 56, 28 * 28 * 1280), (4 * 28 * 28, 64 * 28 * 28), (128 * 28 * 28, 28 * 28 * 768)]:
            assert smart_resize(h, w, 28, *limits) == hf(h, w, 28, *limits), (w, h, limits)


def test_video_frame_sampling_is_hfs():
    """Qwen2-VL's sampler: fps frames a second, clamped to min/max frames, rounded down to the temporal patch,
    `torch.arange(0, total, total / n)`; Qwen3-VL's: `int(total / rate · fps)` clamped, linspace rounded."""
    import numpy as np
    import torch

    rule = VisionGrids("qwen2", 14, 2, 2, 3136, 50176, 3136, 50176, fps=2.0, min_frames=4, max_frames=16)
    assert rule.frame_count(10, 4.0) == 4  # 2.5 s: 5 frames, even: 4
    assert rule.frame_count(300, 30.0) == 16  # 20, capped at max_frames
    assert rule.frame_count(3, 30.0) == 2  # min_frames 4, at most the 3 there are, even: 2
    for total in range(2, 200, 7):
        for rate in (1.0, 7.5, 24.0, 29.97, 60.0):
            n = rule.frame_count(total, rate)
            want = math_floor_even(min(max(total / rate * 2.0, 4), (min(16, total) // 2) * 2, total))
            hf = torch.arange(0, total, total / want).int()
            assert rule.frame_indices(total, rate) == hf.tolist() and n == len(hf)
    q3 = VisionGrids("qwen3", 16, 2, 2, 4096, 10**7, 4096, 10**7, fps=2.0, min_frames=4, max_frames=16)
    for total, rate in [(10, 4.0), (300, 30.0), (7, 24.0), (1000, 10.0)]:
        n = min(max(int(total / rate * 2.0), 4), 16, total)
        assert q3.frame_indices(total, rate) == np.linspace(0, total - 1, n).round().astype(int).tolist()


def math_floor_even(x: float) -> int:
    return int(x // 2) * 2


def test_video_grid_from_the_header(qwen, tmp_path):
    directory, _ = qwen
    rule = read_rule(str(directory), "qwen2_5_vl")
    video = write_video(tmp_path / "v.mp4", frames=10, width=100, height=60, rate=4)
    t, h, w, seconds = rule.video_item(str(video))
    assert (t, h, w) == (2, 4, 8)  # 4 frames of 10 at 4 fps sampled at 2 fps; 60x100 -> 56x112
    assert seconds == pytest.approx(2 / (4 / 10 * 4))  # temporal patch over the sampled fps (HF's)


def test_index_rows_keep_items_in_placeholder_order(qwen, tmp_path, cli):
    """`orch data index`: per sample its items (images and videos interleaved as their placeholders stand),
    its tokens per item, and the LLM's text (with the vision start/end tokens) plus t·h·w/4 rows per item."""
    from tokenizers import Tokenizer

    directory, model = qwen
    write_image(tmp_path / "a.png", 100, 60)
    write_image(tmp_path / "b.png", 30, 500)
    write_video(tmp_path / "v.mp4", frames=10, width=64, height=48, rate=4)
    data = write_conversations(tmp_path / "d.jsonl", [
        turn("<image>what is<video>and<image>", images=["a.png", "b.png"], videos=["v.mp4"]),
        turn("<video>describe", videos=["v.mp4"]),
        turn("no media"),
    ])  # fmt: skip
    r = cli("data", "index", str(data), "--model", str(directory))
    assert r.exit_code == 0, r.output
    idx = build_index(str(data), model)
    assert idx.cached
    rows = [json.loads(line) for line in Path(idx.manifest).read_text().splitlines()]
    words = Tokenizer.from_file(str(directory / "tokenizer.json"))

    def text(*pieces: str) -> int:
        return sum(len(words.encode(p, add_special_tokens=False).ids) for p in pieces)

    chat = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\na red circle<|im_end|>\n")
    wrap = ("<|vision_start|>", "<|vision_end|>")
    assert rows[0] == {
        "lengths": {"vision": 32 + 32 + 72, "llm": text(chat[0], *wrap, "what is", *wrap, "and", *wrap, chat[1])
                    + (32 + 32 + 72) // 4},
        "where": "d.jsonl:1", "source": 0, "sample": 1,
        "media": {"vision": [32, 32, 72]},
        "items": {"vision": [[1, 4, 8, 0.0], [2, 4, 4, 1.25], [1, 36, 2, 0.0]]},
    }  # fmt: skip
    assert rows[1]["items"] == {"vision": [[2, 4, 4, 1.25]]} and "media" not in rows[1]
    assert rows[1]["lengths"] == {"vision": 32, "llm": text(chat[0], *wrap, "describe", chat[1]) + 8}
    assert "items" not in rows[2] and rows[2]["lengths"]["vision"] == 0

    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.source import ConversationData
    from orch.runtime.sample import MediaItem

    source = ConversationData(model, conversation_data(model, str(data), 3, None, None)[0])
    assert source.items(0) == {"vision": [MediaItem((1, 4, 8)), MediaItem((2, 4, 4), 1.25), MediaItem((1, 36, 2))]}
    assert source.items(2) == {"vision": []}


def test_changed_processor_limits_reindex(qwen, tmp_path):
    import shutil

    directory = Path(shutil.copytree(qwen[0], tmp_path / "model"))
    model = qwen_vl_spec(directory)
    write_image(tmp_path / "a.png", 300, 200)
    data = write_conversations(tmp_path / "d.jsonl", [turn("<image>hi", images=["a.png"])])
    first = build_index(str(data), model)
    cfg = json.loads((directory / "preprocessor_config.json").read_text())
    (directory / "preprocessor_config.json").write_text(json.dumps({**cfg, "max_pixels": 16 * 28 * 28}))
    second = build_index(str(data), model)
    assert not second.cached and second.manifest != first.manifest
    rows = [json.loads(line) for line in Path(second.manifest).read_text().splitlines()]
    assert rows[0]["items"]["vision"][0][0] == 1 and rows[0]["lengths"]["vision"] <= 16 * 4


def test_inspect_ids_are_hfs(qwen, tmp_path, cli):
    """`orch data inspect --json`: input_ids of a conversation with three images and a video equal HF's
    Qwen2_5_VLProcessor's for the same rendered text (the video's pads expanded beforehand by its grid: HF's
    video path needs torchvision), the image rows HF's pixel_values."""
    import numpy as np
    import torch
    from PIL import Image

    directory, model = qwen
    sizes = [(100, 60), (30, 500), (333, 222)]
    for i, (w, h) in enumerate(sizes):
        write_image(tmp_path / f"i{i}.png", w, h, seed=i)
    write_video(tmp_path / "v.mp4", frames=12, width=80, height=80, rate=6)
    record = turn("<image>see<image>and<video>then<image>", "it is <image>", images=["i0.png", "i1.png", "i2.png",
                  "i1.png"], videos=["v.mp4"])  # fmt: skip
    data = write_conversations(tmp_path / "d.jsonl", [record])
    r = cli("data", "inspect", str(data), "--model", str(directory), "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output[r.output.index("{") :])

    config = json.loads((directory / "config.json").read_text())
    rule = read_rule(str(directory), "qwen2_5_vl")
    t, h, w, _ = rule.video_item(str(tmp_path / "v.mp4"))
    proc = _hf_processor(directory)
    messages = [{"role": m["role"], "content": m["content"]
                 .replace("<image>", "<|vision_start|><|image_pad|><|vision_end|>")
                 .replace("<video>", "<|vision_start|>\x00<|vision_end|>")} for m in record["messages"]]  # fmt: skip
    text = proc.tokenizer.apply_chat_template(messages, tokenize=False)
    images = [Image.open(tmp_path / f).convert("RGB") for f in record["images"]]
    # HF's processor around the video (its video path needs torchvision): the text before it and its images,
    # the video's pads by its grid, the text after it and its images (the tokenizer splits at the pads)
    before, after = text.split("\x00")
    k = before.count("<|image_pad|>")
    first = proc(text=[before], images=images[:k], return_tensors="np")
    second = proc(text=[after], images=images[k:], return_tensors="np")
    video = [config["video_token_id"]] * (t * h * w // 4)
    assert shown["input_ids"] == first["input_ids"][0].tolist() + video + second["input_ids"][0].tolist()
    want = {"image_grid_thw": np.concatenate([first["image_grid_thw"], second["image_grid_thw"]]),
            "pixel_values": np.concatenate([first["pixel_values"], second["pixel_values"]])}  # fmt: skip
    assert shown["labels"][-3:] != [-100] * 3 and all(
        y == -100 for i, y in zip(shown["input_ids"], shown["labels"], strict=True) if i == config["image_token_id"]
    )

    from orch.runtime.data.conversations import read_conversations
    from orch.runtime.models.qwen_vl.processing import VisionMedia

    conv = next(read_conversations(str(data)))
    media = VisionMedia(model.modules["vision"])
    grids = want["image_grid_thw"].tolist()
    rows = media.image_rows(list(conv.images))
    assert [list(x.shape) for x in rows] == [[a * b * c, 1176] for a, b, c in grids]
    assert torch.equal(torch.cat(rows), torch.from_numpy(np.asarray(want["pixel_values"], dtype=np.float32)))
    assert shown["encoder_inputs"]["vision"] == [sum(a * b * c for a, b, c in grids) + t * h * w, 1176]


def test_image_rows_come_from_the_image_processor_hf_picks(qwen, tmp_path, monkeypatch):
    """An image's rows are those of the image processor AutoImageProcessor picks for the directory (as a user's
    AutoProcessor does: torchvision's backend where it is installed, whose bicubic differs from PIL's), not a
    fixed class's. Stood in for here (no torchvision) by a picked processor that resamples otherwise."""
    import torch
    import transformers
    from PIL import Image

    directory, model = qwen
    write_image(tmp_path / "odd.png", 189, 95, seed=4)
    pick = transformers.AutoImageProcessor.from_pretrained

    def picked(path, *args, **kwargs):  # the backend HF would pick: another resampling
        proc = pick(path, *args, **kwargs)
        proc.resample = 2  # bilinear where the directory's config says bicubic
        return proc

    monkeypatch.setattr(transformers.AutoImageProcessor, "from_pretrained", picked)
    want = picked(directory)(images=[Image.open(tmp_path / "odd.png").convert("RGB")], return_tensors="pt")
    rows = VisionMedia_of(model).image_rows([str(tmp_path / "odd.png")])
    assert len(rows) == 1 and torch.equal(rows[0], want["pixel_values"])


@pytest.mark.parametrize("codec", ["mpeg4", "libx264rgb"])
def test_video_rows_are_the_image_processors_patches_of_its_frames(qwen, tmp_path, codec):
    """A video's rows, per temporal step and slot, are HF's image processor's patches of the decoded frame
    sampled there (the image processor repeats one image over the temporal patch); identical frames of a
    lossless codec give exactly the image's own rows in every slot."""
    import av
    import torch
    from PIL import Image

    directory, model = qwen
    path = write_video(tmp_path / f"v-{codec}.mkv", frames=9, width=100, height=60, rate=3, codec=codec,
                       same=codec == "libx264rgb")  # fmt: skip
    media = VisionMedia_of(model)
    got = media.video_rows(str(path))
    rule = media.rule
    t, h, w, _ = rule.video_item(str(path))
    assert got.shape == (t * h * w, 1176)
    wanted = rule.frame_indices(9, 3.0)
    with av.open(str(path)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    picked = [frames[i] for i in wanted] + [frames[wanted[-1]]] * (-len(wanted) % 2)
    hf = _hf_images(directory)
    slots = got.view(t, h * w, 3, 2, 14, 14)
    for k, frame in enumerate(picked):
        image = hf(images=[Image.fromarray(frame)], return_tensors="pt")
        assert image["image_grid_thw"][0].tolist() == [1, h, w]
        ref = image["pixel_values"].view(h * w, 3, 2, 14, 14)
        assert torch.equal(slots[k // 2, :, :, k % 2], ref[:, :, 0]), k
    if codec == "libx264rgb":  # one image: every slot of every step is the image processor's row of it
        image = hf(images=[Image.fromarray(frames[0])], return_tensors="pt")["pixel_values"]
        assert all(torch.equal(got.view(t, h * w, 1176)[s], image) for s in range(t))


def VisionMedia_of(model):
    from orch.runtime.models.qwen_vl.processing import VisionMedia

    return VisionMedia(model.modules["vision"])


def test_processed_sample_has_the_indexed_tokens(qwen, tmp_path):
    from orch.runtime.data.conversations import read_conversations
    from orch.runtime.data.index import TextCounter, TokenRules, find_tokenizer
    from orch.runtime.data.media import media_processors
    from orch.runtime.data.processing import process

    directory, model = qwen
    write_image(tmp_path / "a.png", 90, 70)
    write_video(tmp_path / "v.mp4", frames=20, width=70, height=90, rate=8)
    data = write_conversations(tmp_path / "d.jsonl", [turn("<video><image>q", images=["a.png"], videos=["v.mp4"])])
    idx = build_index(str(data), model)
    row = json.loads(Path(idx.manifest).read_text())
    out = process(next(read_conversations(str(data))), model, TokenRules.of(model),
                  TextCounter(*find_tokenizer(model, None)), 4096, processors=media_processors(model))  # fmt: skip
    assert out.media == {"vision": [t * h * w for t, h, w, _ in row["items"]["vision"]]} == row["media"]
    assert out.features["vision"].shape[0] == row["lengths"]["vision"]
    assert len(out.input_ids) + row["lengths"]["vision"] // 4 == row["lengths"]["llm"]


def test_llama_factory_video_demo_is_indexed(qwen, tmp_path, cli):
    """LLaMA-Factory's mllm_video_demo.json layout (a JSON list, `messages`, `videos` beside the text's
    `<video>`) and ShareGPT's `conversations`: the videos counted."""
    directory, model = qwen
    write_video(tmp_path / "mllm_demo_data" / "1.mp4", frames=16, rate=8)
    write_video(tmp_path / "mllm_demo_data" / "2.avi", frames=6, rate=2)
    demo = [
        {"messages": [{"content": "<video>Why is this video funny?", "role": "user"},
                      {"content": "Because a baby is reading, and he is so cute!", "role": "assistant"}],
         "videos": ["mllm_demo_data/1.mp4"]},
        {"conversations": [{"from": "human", "value": "What is in it? <video>"}, {"from": "gpt", "value": "A cat."}],
         "videos": ["mllm_demo_data/2.avi"]},
    ]  # fmt: skip
    data = tmp_path / "mllm_video_demo.json"
    data.write_text(json.dumps(demo))
    r = cli("data", "index", str(data), "--model", str(directory))
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in Path(build_index(str(data), model).manifest).read_text().splitlines()]
    assert [len(r["items"]["vision"]) for r in rows] == [1, 1]
    assert all(r["lengths"]["vision"] > 0 and r["items"]["vision"][0][3] > 0 for r in rows)


def test_bad_inputs_are_skipped_and_named(qwen, tmp_path, cli):
    directory, model = qwen
    write_image(tmp_path / "thin.png", 1000, 4)
    write_image(tmp_path / "ok.png", 50, 50)
    (tmp_path / "broken.mp4").write_bytes(b"not a video at all")
    write_video(tmp_path / "one.mp4", frames=1)
    data = write_conversations(tmp_path / "d.jsonl", [
        turn("<image>x", images=["thin.png"]),
        turn("<video>x", videos=["broken.mp4"]),
        turn("<video>x", videos=["gone.mp4"]),
        turn("<image>x", images=["gone.png"]),
        turn("<video><video>x", videos=["one.mp4"]),
        turn("<image>x", images=["ok.png"], videos=["one.mp4"]),
        turn("<video>x", videos=["one.mp4"]),
        turn("<image>fine", images=["ok.png"]),
    ])  # fmt: skip
    r = cli("data", "index", str(data), "--model", str(directory), "--strict")
    assert r.exit_code == 1
    out = " ".join(r.output.split()).replace(f"{tmp_path}/", "")  # each message names the path tried, whole
    assert "d.jsonl:1: images[0]: thin.png: absolute aspect ratio must be smaller than 200, got 250.0" in out
    assert "d.jsonl:2: videos[0]: broken.mp4: cannot open (InvalidDataError)" in out
    assert "d.jsonl:3: videos[0]: gone.mp4: file not found" in out
    assert "d.jsonl:4: images[0]: gone.png: file not found" in out
    assert "d.jsonl:5: 1 videos for 2 <video> placeholders" in out
    assert "d.jsonl:6: 1 videos for 0 <video> placeholders" in out
    assert "d.jsonl:7: videos[0]: one.mp4: 1 frames: fewer than a temporal patch (2) to sample" in out
    assert "7 samples skipped: 7 malformed" in out
    assert build_index(str(data), model).samples == 1


def test_a_model_without_a_video_path_refuses_videos(tmp_path, cli):
    """LLaVA (and orch's reference model) take no video: a `<video>` sample is skipped and counted, never
    trained as text."""
    import transformers
    from hf_models import make_llava

    from orch.runtime.data.demo_data import make_tokenizer

    llava = make_llava(tmp_path / "llava")
    transformers.CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}).save_pretrained(
        llava
    )
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(make_tokenizer(tmp_path / "t" / "tokenizer.json")),
                                               unk_token="[UNK]")  # fmt: skip
    tok.save_pretrained(llava)
    write_video(tmp_path / "mllm_demo_data" / "1.mp4", frames=8)
    write_image(tmp_path / "a.png", 40, 40)
    data = tmp_path / "mllm_video_demo.json"
    data.write_text(json.dumps([turn("<video>Why is this video funny?", videos=["mllm_demo_data/1.mp4"]),
                                turn("<image>and this?", images=["a.png"])]))  # fmt: skip
    r = cli("data", "index", str(data), "--model", str(llava), "--strict")
    assert r.exit_code == 1
    assert "mllm_video_demo.json:1: videos: the model takes no video (its vision encoder takes images only)" in r.output
    assert "1 samples skipped: 1 malformed" in r.output
    r = cli("data", "index", str(data), "--model", "tiny", "--tokenizer", str(tmp_path / "t" / "tokenizer.json"))
    assert r.exit_code == 0 and "mllm_video_demo.json:1: videos: the model takes no video" in r.output


def test_qwen3_vl_images_by_its_patch(tmp_path):
    from PIL import Image

    directory = make_qwen_vl(tmp_path / "q3", "qwen3_vl")
    rule = read_rule(str(directory), "qwen3_vl")
    hf = _hf_images(directory)
    for w, h in SIZES[:8]:
        want = hf(images=[Image.new("RGB", (w, h))], return_tensors="np")["image_grid_thw"][0].tolist()
        assert list(rule.image_grid(w, h)) == want


# Qwen3-VL's videos. HF's Qwen3VLVideoProcessor needs torchvision (absent here): its `sample_frames`,
# `get_num_of_video_patches` and its module's `smart_resize` are compiled from transformers' own source file, and
# Qwen3VLProcessor's `replace_video_token` / `_calculate_timestamps` (importable) write the video's text.


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    directory = make_qwen_vl(tmp_path_factory.mktemp("qwen3-vl") / "model", "qwen3_vl")
    return directory, qwen_vl_spec(directory)


def _hf_qwen3_video_code() -> dict:
    """transformers 5.24's Qwen3-VL video processor functions, compiled from its source (module comment)."""
    import ast
    import logging
    import math

    import numpy as np
    import transformers.models.qwen3_vl as package

    tree = ast.parse((Path(package.__file__).parent / "video_processing_qwen3_vl.py").read_text())
    methods = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen3VLVideoProcessor").body
    wanted = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize"]
    wanted += [n for n in methods if isinstance(n, ast.FunctionDef) and n.name in ("sample_frames",
                                                                                   "get_num_of_video_patches")]  # fmt: skip
    for f in wanted:  # annotations name torch / torchvision types
        f.returns = None
        for a in (*f.args.args, *f.args.kwonlyargs):
            a.annotation = None
    ns: dict = {"np": np, "math": math, "logger": logging.getLogger("hf")}
    exec(compile(ast.Module(wanted, []), "video_processing_qwen3_vl.py", "exec"), ns)
    assert {"smart_resize", "sample_frames", "get_num_of_video_patches"} <= set(ns)
    return ns


def _hf_qwen3_processor(directory, rule):
    """HF's Qwen3VLProcessor of the directory's PIL image processor and tokenizer; as its video processor, the
    attributes `replace_video_token` reads (the real one needs torchvision)."""
    import types

    import transformers

    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    check = transformers.ProcessorMixin.check_argument_for_proper_class
    transformers.ProcessorMixin.check_argument_for_proper_class = lambda self, name, arg: None  # type: ignore
    try:
        proc = transformers.Qwen3VLProcessor(image_processor=hf_auto_images(directory), tokenizer=tokenizer)
    finally:
        transformers.ProcessorMixin.check_argument_for_proper_class = check  # type: ignore
    proc.video_processor = types.SimpleNamespace(merge_size=rule.merge, temporal_patch_size=rule.temporal_patch)
    return proc


def _hf_video_text(proc, rule, head) -> str:
    """HF's text of one video (Qwen3VLProcessor.replace_video_token) of this header: its grid and metadata as
    HF's video processor and PyAV reader give them."""
    import torch
    from transformers.video_utils import VideoMetadata

    hf = _hf_qwen3_video_code()
    meta = VideoMetadata(total_num_frames=head.frames, fps=head.rate, width=head.width, height=head.height)
    meta.frames_indices = hf["sample_frames"](_hf_video_self(rule), meta)
    t, h, w, _ = rule.video_grid(head)
    return proc.replace_video_token({"video_grid_thw": torch.tensor([[t, h, w]]), "video_metadata": [meta]}, 0)


def _hf_video_self(rule, cap=False):
    """The attributes of a Qwen3VLVideoProcessor configured as `rule` is."""
    import types

    return types.SimpleNamespace(fps=rule.fps, min_frames=rule.min_frames, max_frames=rule.max_frames, num_frames=None,
                                 size={"shortest_edge": rule.video_min_pixels, "longest_edge": rule.video_max_pixels},
                                 patch_size=rule.patch, merge_size=rule.merge, temporal_patch_size=rule.temporal_patch,
                                 cap_pixels_per_frame=cap, max_video_tokens=rule.max_video_tokens)  # fmt: skip


@pytest.mark.parametrize("cap", [False, True])
def test_qwen3_vl_video_sampling_grid_and_timestamps_are_hfs(cap):
    """Qwen3-VL's sampler, its 3-D resize (the frames in the pixel budget; `cap_pixels_per_frame`), the patches and
    each temporal step's timestamp are HF's (its own source's functions), and a video's items write the text
    HF's `replace_video_token` writes: per step `<t seconds>` and its pads between vision start and end."""
    import dataclasses
    import types

    import torch
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.video_utils import VideoMetadata

    from orch.runtime.models.qwen_vl.media import VideoHeader

    hf = _hf_qwen3_video_code()
    rule = VisionGrids("qwen3", 16, 2, 2, 4096, 10**6, 4096, 20 * 32 * 32 * 6, fps=2.0, min_frames=4,
                       max_frames=24, cap_pixels_per_frame=cap, max_video_tokens=12)  # fmt: skip
    attrs = _hf_video_self(rule, cap)

    def timestamps(indices, fps, merge):
        return Qwen3VLProcessor._calculate_timestamps(None, indices, fps, merge)

    proc = types.SimpleNamespace(video_processor=attrs, vision_start_token="<|vision_start|>",
                                 vision_end_token="<|vision_end|>", video_token="<|video_pad|>",
                                 _calculate_timestamps=timestamps)  # fmt: skip
    checked = 0
    for total in (1, 2, 3, 5, 8, 13, 40, 301):
        for rate in (1.0, 4.0, 7.5, 24.0, 29.97):
            for w, h in ((64, 48), (48, 640), (1920, 1080), (20, 20), (33, 500)):
                meta = VideoMetadata(total_num_frames=total, fps=rate)
                indices = hf["sample_frames"](attrs, meta).tolist()
                assert rule.frame_indices(total, rate) == indices
                head = VideoHeader(total, rate, w, h)
                try:
                    want = hf["get_num_of_video_patches"](attrs, len(indices), h, w)
                except ValueError as exc:  # fewer frames than a temporal patch: HF's smart_resize refuses it
                    with pytest.raises(ValueError, match=str(exc)):
                        rule.video_grid(head)
                    continue
                t, gh, gw, _ = rule.video_grid(head)
                assert t * gh * gw == want and t == -(-len(indices) // 2)
                times = timestamps(list(indices), rate, 2)
                assert rule.timestamps(head) == times
                items = rule.header_items(head)
                assert items == tuple((1, gh, gw, at) for at in times)
                meta.frames_indices = indices
                grid = {"video_grid_thw": torch.tensor([[t, gh, gw]]), "video_metadata": [meta]}
                hf_text = Qwen3VLProcessor.replace_video_token(proc, grid, 0)
                pads = "<|video_pad|>" * (gh * gw // 4)
                assert hf_text == "".join(
                    f"{rule.video_prefix(i, j)}<|vision_start|>{pads}<|vision_end|>" for j, i in enumerate(items)
                )
                checked += 1
    assert checked > 100
    assert dataclasses.replace(rule, variant="qwen2").video_prefix((2, 4, 4, 1.0), 0) == ""


def test_qwen3_vl_video_limits_are_its_size_alone(qwen3, tmp_path):
    """Qwen3VLVideoProcessor has no min/max_pixels keys: its `size` sets the limits (else its class defaults)."""
    import shutil

    directory = Path(shutil.copytree(qwen3[0], tmp_path / "model"))
    cfg = json.loads((directory / "video_preprocessor_config.json").read_text())
    assert cfg["video_processor_type"] == "Qwen3VLVideoProcessor"
    rule = read_rule(str(directory), "qwen3_vl")
    assert (rule.video_min_pixels, rule.video_max_pixels) == (cfg["size"]["shortest_edge"], cfg["size"]["longest_edge"])
    del cfg["size"]
    (directory / "video_preprocessor_config.json").write_text(json.dumps({**cfg, "min_pixels": 1, "max_pixels": 2}))
    rule = read_rule(str(directory), "qwen3_vl")
    assert (rule.video_min_pixels, rule.video_max_pixels) == (128 * 32 * 32, 32 * 32 * 768)


def test_qwen3_vl_video_index_rows_and_inspect_ids_are_hfs(qwen3, tmp_path, cli):
    """A conversation with images and a video: the index's items (the video one item per temporal step, its
    timestamp as seconds), its tokens, and `orch data inspect --json` ids equal to HF's: the chat template's text
    with each image's pads (Qwen3VLProcessor.replace_image_token on HF's image grids) and the video's text
    (replace_video_token, HF's sampler's metadata), through HF's tokenizer. The runtime's text (every rank's,
    from the index's items) is the inspected one; its rows are the video's, step after step; a one-frame video is
    skipped with HF's own error."""
    import torch
    from PIL import Image

    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.source import ConversationData
    from orch.runtime.models.qwen_vl.media import video_header

    directory, model = qwen3
    for i, (w, h) in enumerate([(100, 60), (30, 500)]):
        write_image(tmp_path / f"i{i}.png", w, h, seed=i)
    write_video(tmp_path / "v.mp4", frames=25, width=80, height=60, rate=6)
    write_video(tmp_path / "one.mp4", frames=1)
    record = turn("<image>see<video>then<image>", "it is <image>", images=["i0.png", "i1.png", "i0.png"],
                  videos=["v.mp4"])  # fmt: skip
    data = write_conversations(tmp_path / "d.jsonl", [record, turn("<video>x", videos=["one.mp4"])])
    r = cli("data", "inspect", str(data), "--model", str(directory), "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.output[r.output.index("{") :])

    rule = read_rule(str(directory), "qwen3_vl")
    proc = _hf_qwen3_processor(directory, rule)
    images = [Image.open(tmp_path / f).convert("RGB") for f in record["images"]]
    got = proc.image_processor(images=images, return_tensors="pt")
    grids = got["image_grid_thw"]
    k = iter(range(3))
    video_text = _hf_video_text(proc, rule, video_header(str(tmp_path / "v.mp4")))
    messages = []
    for m in record["messages"]:
        pieces = m["content"].split("<image>")
        content = pieces[0] + "".join(
            "<|vision_start|>" + proc.replace_image_token({"image_grid_thw": grids}, next(k)) + "<|vision_end|>" + p
            for p in pieces[1:]
        )
        messages.append({"role": m["role"], "content": content.replace("<video>", video_text)})
    text = proc.tokenizer.apply_chat_template(messages, tokenize=False)
    want = proc.tokenizer(text)["input_ids"]
    assert shown["input_ids"] == want
    config = json.loads((directory / "config.json").read_text())
    t, h, w, _ = rule.video_item(str(tmp_path / "v.mp4"))
    assert want.count(config["video_token_id"]) == t * h * w // 4 and t == 4 and "<1.4 seconds>" in text
    assert all(y == -100 for i, y in zip(shown["input_ids"], shown["labels"], strict=True)
               if i in (config["image_token_id"], config["video_token_id"]))  # fmt: skip

    # the index: the video as t items (1, h, w, timestamp), the text counted with its timestamps
    r = cli("data", "index", str(data), "--model", str(directory), "--strict")
    assert (
        r.exit_code == 1
        and f"d.jsonl:2: videos[0]: {tmp_path / 'one.mp4'}: t:1 must be larger than temporal_factor:2" in r.output
    )
    idx = build_index(str(data), model)
    assert idx.cached and idx.samples == 1
    row = json.loads(Path(idx.manifest).read_text().splitlines()[0])
    times = rule.timestamps(video_header(str(tmp_path / "v.mp4")))
    image_items = [[1, *g[1:], 0.0] for g in grids.tolist()]
    assert row["items"] == {"vision": [image_items[0], *[[1, h, w, at] for at in times], *image_items[1:]]}
    assert row["placeholder_items"] == {"vision": [1, t, 1, 1]}
    assert row["media"] == {"vision": [it[1] * it[2] for it in row["items"]["vision"]]}
    assert row["lengths"] == {"vision": sum(row["media"]["vision"]), "llm": len(want)}

    # the runtime's text from the index's items: the inspected ids; its rows the inspected inputs
    source = ConversationData(model, conversation_data(model, str(data), 1, None, None)[0])
    assert source.text(0).ids == shown["text_ids"]
    batch = source.batch(0, 0)
    assert [it.grid for it in batch.items("vision", 0)] == [tuple(it[:3]) for it in row["items"]["vision"]]
    rows = batch.sample(0, torch.float32).feats["vision"]
    assert list(rows.shape) == shown["encoder_inputs"]["vision"] == [sum(row["media"]["vision"]), 1536]
    video = VisionMedia_of(model).video_rows(str(tmp_path / "v.mp4"))
    first = row["media"]["vision"][0]
    assert torch.equal(rows[first : first + video.shape[0]], video)  # the steps' rows, step after step
    assert torch.equal(rows[:first], got["pixel_values"][:first].to(torch.float32))
