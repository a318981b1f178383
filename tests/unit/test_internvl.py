"""InternVL against Hugging Face itself: its config read as transformers 5.24 reads it, each image's tiles counted
from its header as GotOcr2ImageProcessor tiles it, `orch data inspect`'s input_ids equal to InternVLProcessor's,
the media processor's rows equal to HF's pixel_values (a video frame: one tile of the image processor), the
tower's output and gradients equal to `get_image_features`' in float64, and bad media skipped and counted."""

import json
from pathlib import Path

import numpy as np
import pytest
from internvl_models import MAX_TILES, TILE, hf_norms_in_float64, hf_processor, make_internvl

# (width, height): one tile, wide, tall, a tie in aspect, a large one at the tile limit
SIZES = [(28, 28), (90, 20), (40, 130), (56, 28), (300, 200), (17, 61)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_internvl(tmp_path_factory.mktemp("internvl") / "m")


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    out = []
    for i, (w, h) in enumerate(SIZES):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(root / f"{i}.png")
        out.append(root / f"{i}.png")
    return out


def test_config_defaults_are_transformers():
    import transformers

    from orch.runtime.models.internvl.config import INTERNVL_DEFAULTS, VISION_DEFAULTS

    vision = transformers.InternVLVisionConfig()
    for key, value in VISION_DEFAULTS.items():
        got = getattr(vision, key)
        assert (got[0] if isinstance(got, (list, tuple)) else got) == value, key
    top = transformers.InternVLConfig()
    for key, value in INTERNVL_DEFAULTS.items():
        assert getattr(top, key) == value, key
    assert top.text_config.model_type == "qwen2"


def test_reads_the_modules(model_dir):
    from orch.runtime.models.registry import model_spec_from_dir

    model = model_spec_from_dir(model_dir)
    vision, llm = model.modules["vision"], model.modules["llm"]
    assert (vision.layers, vision.hidden, vision.heads, vision.ffn) == (3, 32, 4, 64)
    assert (vision.image_tokens, vision.downsample, vision.input_dim, vision.projector_hidden) == (16, 4, 147, 48)
    assert (llm.layers, llm.hidden, llm.kv_heads, llm.tied_embeddings) == (4, 48, 2, False)


def test_llama_text_and_class_defaults(tmp_path):
    """A Llama LLM reads and builds; a config.json naming nothing but its type takes InternVLConfig's defaults
    (InternVL3-1B's tower, Qwen2's LLM, the head tied to the embedding: one pipeline stage)."""
    from orch.runtime.models.hf.build import build_hf_modules
    from orch.runtime.models.registry import model_spec_from_dir

    model = model_spec_from_dir(make_internvl(tmp_path / "llama", "llama"))
    assert model.modules["llm"].hf.part == "text" and model.modules["llm"].layers == 4
    built = build_hf_modules(model)
    assert type(built["llm"]).__name__ == "HFCausalLM" and built["vision"].output_dim == 48
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps({"model_type": "internvl"}))
    bare = model_spec_from_dir(tmp_path / "bare")
    vision, llm = bare.modules["vision"], bare.modules["llm"]
    assert (vision.layers, vision.hidden, vision.image_tokens, vision.downsample) == (24, 1024, 32 * 32, 4)
    assert llm.tied_embeddings and llm.refuses("pp", 2)


def test_config_errors_name_the_field(tmp_path):
    from orch.planner.errors import SpecError
    from orch.runtime.models.registry import model_spec_from_dir

    d = tmp_path / "m"
    d.mkdir()
    cases = [
        ({"downsample_ratio": 0.3}, "downsample_ratio"),
        ({"vision_feature_select_strategy": "full"}, "vision_feature_select_strategy"),
        ({"vision_feature_layer": [-1, -2]}, "vision_feature_layer"),
        ({"text_config": {"model_type": "gemma"}}, "text_config.model_type"),
        ({"vision_config": {"image_size": 30, "patch_size": 7}}, "vision_config.patch_size"),
    ]
    for extra, field in cases:
        (d / "config.json").write_text(json.dumps({"model_type": "internvl", **extra}))
        with pytest.raises(SpecError) as err:
            model_spec_from_dir(d)
        assert err.value.field == field, (extra, str(err.value))


def test_tiles_are_hfs():
    """Every size from 1 to 400 px a side in steps, under several limits: the count HF's image processor gives."""
    import transformers

    from orch.runtime.models.internvl.media import Tiles

    proc = transformers.GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE})
    for lo, hi in ((1, 12), (1, 6), (2, 4), (1, 1)):
        rule = Tiles(4, TILE, lo, hi, True, False, None, None, True)
        kw = {"crop_to_patches": True, "min_patches": lo, "max_patches": hi}
        for h in range(1, 400, 13):
            for w in range(1, 400, 11):
                assert rule.image_tiles(w, h) == proc.get_number_of_image_patches(h, w, kw), (lo, hi, w, h)


def _conversations(root: Path, images: list[Path]) -> dict[str, tuple[list[dict], list[Path]]]:
    return {
        "one image": ([{"role": "user", "content": "<image>what is in the picture ?"},
                       {"role": "assistant", "content": "a blue square"}], images[1:2]),
        "several images": ([{"role": "system", "content": "a red circle"},
                            {"role": "user", "content": "<image>what is in <image> the picture ?"},
                            {"role": "assistant", "content": "a blue square"},
                            {"role": "user", "content": "and <image> <image>"},
                            {"role": "assistant", "content": "a green circle"}], images[2:6]),
        "text": ([{"role": "user", "content": "what is in the picture ?"},
                  {"role": "assistant", "content": "a blue square"}], []),
    }  # fmt: skip


def test_inspect_ids_are_internvl_processors(cli, tmp_path, model_dir, images):
    """`<image>` becomes `<img>` + 4 `<IMG_CONTEXT>` a tile + `</img>`, each image's tiles HF's, as
    InternVLProcessor expands its image token in the chat template's text."""
    from PIL import Image

    processor = hf_processor(model_dir)
    image_id = processor.tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")
    for name, (messages, files) in _conversations(tmp_path, images).items():
        data = tmp_path / f"{name}.jsonl"
        data.write_text(json.dumps({"messages": messages, "images": [str(f) for f in files]}) + "\n")
        text = processor.apply_chat_template(messages, tokenize=False).replace("<image>", "<IMG_CONTEXT>")
        pil = [Image.open(f).convert("RGB") for f in files] or None
        want = processor(text=text, images=pil, return_tensors="np")["input_ids"][0].tolist()
        r = cli("data", "inspect", str(data), "--model", str(model_dir), "--json")
        assert r.exit_code == 0, r.output
        got = json.loads(r.output[r.output.index("{") :])["input_ids"]
        assert got == want, name
        tiles = sum(processor.image_processor.get_number_of_image_patches(
            Image.open(f).height, Image.open(f).width, {"crop_to_patches": True, "max_patches": MAX_TILES})
            for f in files)  # fmt: skip
        assert got.count(image_id) == 4 * tiles


def test_image_rows_are_hfs_pixels(model_dir, images):
    """The media processor's rows, reassembled into tiles by the tower, are HF's pixel_values, tile for tile."""
    import torch
    from PIL import Image

    from orch.planner.specs import Modality
    from orch.runtime.models.internvl.vision import InternVisionEncoder
    from orch.runtime.models.registry import family_of_dir, model_spec_from_dir

    model = model_spec_from_dir(model_dir)
    media = family_of_dir(str(model_dir)).media_processor(model.modules["vision"], Modality.VISION)
    rows = media.inputs(tuple(str(f) for f in images), None, 0)
    hf = hf_processor(model_dir).image_processor
    pil = [Image.open(f).convert("RGB") for f in images]
    want = hf(images=pil, crop_to_patches=True, max_patches=MAX_TILES, return_tensors="pt")
    assert [r.shape[0] for r in rows] == [16 * int(n) for n in want["num_patches"]]
    fake = InternVisionEncoder.__new__(InternVisionEncoder)
    fake.grid, fake.patch, fake.channels, fake.image_tokens = 4, 7, 3, 16
    assert torch.equal(InternVisionEncoder.tiles(fake, torch.cat(rows)), want["pixel_values"].to(torch.float32))


def _video(path: Path, frames: int, size=(40, 30), rate: int = 4) -> np.ndarray:
    import av

    rng = np.random.default_rng(frames)
    pixels = rng.integers(0, 255, (frames, size[1], size[0], 3), dtype=np.uint8)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(
            "png", rate=rate
        )  # lossless in a QuickTime file: the frames decode to these pixels
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "rgb24"
        for frame in pixels:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return pixels


def test_video_frames_are_one_tile_each(tmp_path, model_dir):
    """A video's frames (every one, or those the processor samples) each one tile of the image processor, and
    the text around them InternVLProcessor's `Frame{i}: <img>...</img>` joined by newlines."""
    import dataclasses

    import torch
    from PIL import Image

    from orch.planner.specs import Modality
    from orch.runtime.models.internvl.media import IMAGE_END, IMAGE_START
    from orch.runtime.models.registry import family_of_dir, model_spec_from_dir

    pixels = _video(tmp_path / "v.mov", 6)
    model = model_spec_from_dir(model_dir)
    family = family_of_dir(str(model_dir))
    media = family.media_processor(model.modules["vision"], Modality.VISION)
    rule = family.token_rule(model.modules["vision"], Modality.VISION)
    hf = hf_processor(model_dir).image_processor
    for sampled, kept in ((rule, list(range(6))), (dataclasses.replace(rule, sample_frames=True, num_frames=3),
                                                   [1, 3, 5])):  # fmt: skip
        media.rule = sampled
        items = sampled.video_items(str(tmp_path / "v.mov"))
        assert [it[:3] for it in items] == [(1, 4, 4)] * len(kept)
        got = media.inputs((str(tmp_path / "v.mov"),), None, 0, kinds=("<video>",))
        want = hf(images=[Image.fromarray(pixels[i]) for i in kept], crop_to_patches=False, return_tensors="pt")
        assert len(got) == len(kept)
        for rows, tile in zip(got, want["pixel_values"], strict=True):
            assert torch.equal(media.rows(tile[None].to(torch.float32)), rows)
    text = "".join(rule.video_prefix(it, j) + IMAGE_START + "X" + IMAGE_END for j, it in enumerate(items))
    assert text == "\n".join(f"Frame{i + 1}: <img>X</img>" for i in range(3))


@pytest.mark.parametrize("variant", ["plain", "feature_layer_-2_qk_norm"])
def test_tower_is_get_image_features(tmp_path, variant):
    """The wrapped tower, pixel shuffle and projector on packed tiles: HF's `get_image_features` output and every
    gradient, float64, to 1e-12 (the same modules in the same order)."""
    import torch

    from orch.runtime.models.hf.build import build_hf_modules
    from orch.runtime.models.registry import model_spec_from_dir

    extra = {"vision_feature_layer": -2, "vision_extra": {"use_qk_norm": True,
                                                          "use_mean_pooling": False}} if variant != "plain" else {}  # fmt: skip
    d = make_internvl(tmp_path / "m", **extra)
    model = model_spec_from_dir(d)
    tower = build_hf_modules(model, ["vision"])["vision"]
    tower.materialize(torch.device("cpu"), 0, "vision")
    tower.to(torch.float64)
    import transformers

    hf = transformers.InternVLForConditionalGeneration.from_pretrained(d, dtype=torch.float64)
    rows = torch.randn(3 * 16, 147, dtype=torch.float64)
    got = tower(rows, [3 * 16])
    pixels = tower.tiles(rows)
    with hf_norms_in_float64():
        want = hf.model.get_image_features(pixel_values=pixels, return_dict=True).pooler_output
    assert got.shape == (12, 48)
    torch.testing.assert_close(got, want.reshape(-1, 48), rtol=0, atol=1e-12)
    weights = torch.randn_like(got)
    (got * weights).sum().backward()
    (want.reshape(-1, 48) * weights).sum().backward()
    named = dict(hf.named_parameters())
    checked = 0
    for local, key in tower.hf_keys.items():
        p = dict(tower.named_parameters())[local]
        if p.grad is None:
            assert named[key].grad is None or not named[key].grad.any(), key
            continue
        torch.testing.assert_close(p.grad, named[key].grad, rtol=0, atol=1e-12)
        checked += 1
    assert checked > 20


def test_bad_media_are_skipped_and_counted(cli, tmp_path, model_dir, images, monkeypatch):
    """An image over the limit the image processor opens images under (Pillow's decompression limit, lowered here
    so a small file crosses it) and a video that does not open: each sample skipped and counted with
    file:line: what; the good one kept."""
    from PIL import Image

    from orch.runtime.data.index import build_index
    from orch.runtime.models.registry import model_spec_from_dir

    Image.new("RGB", (60, 60)).save(tmp_path / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # over twice the limit: Pillow refuses to open it
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 not a video")
    rows = [{"messages": [{"role": "user", "content": "<image>what"}, {"role": "assistant", "content": "a"}],
             "images": [str(images[0])]},
            {"messages": [{"role": "user", "content": "<image>what"}, {"role": "assistant", "content": "a"}],
             "images": [str(tmp_path / "huge.png")]},
            {"messages": [{"role": "user", "content": "<video>what"}, {"role": "assistant", "content": "a"}],
             "videos": [str(tmp_path / "broken.mp4")]}]  # fmt: skip
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("data", "index", str(data), "--model", str(model_dir))
    assert r.exit_code == 0, r.output
    assert "2 samples skipped" in r.output
    bad = build_index(str(data), model_spec_from_dir(model_dir)).bad
    assert bad[0].startswith(f"{data.name}:2: images[0]: {tmp_path / 'huge.png'}: too large to decode"), bad
    assert bad[1].startswith(f"{data.name}:3: videos[0]: {tmp_path / 'broken.mp4'}: cannot open"), bad


def test_inspect_video_text_is_internvl_processors(cli, tmp_path, model_dir):
    """A `<video>` of 3 frames: `Frame{i}: <img>` + 4 tokens + `</img>` per frame, joined by newlines, as
    InternVLProcessor.replace_video_token writes it (its video processor needs torchvision: the frames' count is
    what it would give). orch marks a video's rows with the `<video>` token's id where HF writes `<IMG_CONTEXT>`
    (the model takes the rows, not the ids)."""
    import torch

    processor = hf_processor(model_dir)
    _video(tmp_path / "v.mov", 3)
    messages = [{"role": "user", "content": "<video>what is in it ?"}, {"role": "assistant", "content": "a square"}]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": messages, "videos": [str(tmp_path / "v.mov")]}) + "\n")
    frames = processor.replace_video_token({"pixel_values_videos": [torch.zeros(3, 3, TILE, TILE)]}, 0)
    text = processor.apply_chat_template(messages, tokenize=False).replace("<video>", frames)
    want = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    r = cli("data", "inspect", str(data), "--model", str(model_dir), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output[r.output.index("{") :])["input_ids"]
    video_id, image_id = (processor.tokenizer.convert_tokens_to_ids(t) for t in ("<video>", "<IMG_CONTEXT>"))
    assert [image_id if t == video_id else t for t in got] == want
    assert got.count(video_id) == 3 * 4
