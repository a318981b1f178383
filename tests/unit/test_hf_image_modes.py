"""Images in the modes users' files come in, read as Hugging Face reads them: each family's pixel rows equal to
its own image processor's `pixel_values` of the opened file (`Image.open`; the processor converts it to RGB,
compositing RGBA's, LA's and a palette's transparency onto white, an animated GIF's first frame), for LLaVA's
CLIP processor and Qwen2-VL's; and a LLaVA's step-0 loss on an RGBA image equal to
LlavaForConditionalGeneration's forward on the processor's pixels, float64."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hf_models import IMAGE_TOKEN, make_llava
from qwen_vl_data import hf_images, qwen_vl_spec
from qwen_vl_models import make_qwen_vl

from orch.runtime.data.index import TokenRules
from orch.runtime.models.registry import model_spec_from_dir

SIZE = (37, 23)  # width, height: neither the towers' side nor a multiple of their patch


def _write(path: Path, mode: str, seed: int) -> Path:
    """An image of `mode` at `path` (its suffix the format), noisy, with transparency where the mode has it."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    w, h = SIZE

    def noise(*shape: int) -> np.ndarray:
        return rng.integers(0, 256, (h, w, *shape), dtype=np.uint8)

    if mode == "P":  # a palette, one of its colours transparent
        im = Image.fromarray(rng.integers(0, 16, (h, w), dtype=np.uint8), "P")
        im.putpalette(rng.integers(0, 256, 16 * 3, dtype=np.uint8).tolist())
        im.save(path, transparency=3)
    elif mode == "GIF":  # animated: three frames of their own palettes, index 0 transparent
        frames = [Image.fromarray(noise(3)).quantize(colors=8) for _ in range(3)]
        frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0, transparency=0)
    elif mode == "I;16":
        Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16)).save(path)
    elif mode == "1":
        Image.fromarray(noise() > 127).save(path)
    else:
        bands = {"RGBA": 4, "LA": 2, "L": 1, "CMYK": 4}[mode]
        Image.fromarray(noise(bands) if bands > 1 else noise(), mode).save(path)
    with Image.open(path) as im:
        assert im.mode == ("P" if mode == "GIF" else mode) and (mode != "GIF" or im.n_frames == 3), im.mode
    return path


MODES = {"RGBA": "png", "LA": "png", "P": "png", "CMYK": "jpg", "L": "png", "1": "png", "I;16": "png", "GIF": "gif"}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("modes")
    return [str(_write(root / f"{i}.{ext}", mode, i)) for i, (mode, ext) in enumerate(MODES.items())]


def _hf_pixels(processor, path: str) -> torch.Tensor:
    from PIL import Image

    with Image.open(path) as im:
        return processor(images=[im], return_tensors="pt")["pixel_values"].to(torch.float32)


def _save_clip_processor(directory: Path) -> None:
    import transformers

    crop = {"height": 28, "width": 28}
    transformers.CLIPImageProcessor(size={"shortest_edge": 28}, crop_size=crop).save_pretrained(directory)


@pytest.fixture(scope="module")
def llava(tmp_path_factory) -> Path:
    directory = make_llava(tmp_path_factory.mktemp("llava") / "m", "clip", "llama")
    _save_clip_processor(directory)
    return directory


def test_llava_pixels_are_its_processors_in_every_mode(llava, images):
    import transformers

    from orch.runtime.models.llava.processing import TowerImages

    spec = model_spec_from_dir(llava)
    tiles = TowerImages(spec.modules["vision"]).inputs(tuple(images), TokenRules.of(spec).encoders[0], 1024)
    hf = transformers.AutoImageProcessor.from_pretrained(llava)
    for path, (mode, got) in zip(images, zip(MODES, tiles, strict=True), strict=True):
        # 4 x 4 patches of [3, 7, 7], row-major: the image [3, 28, 28]
        image = got.view(4, 4, 3, 7, 7).permute(2, 0, 3, 1, 4).reshape(3, 28, 28)
        assert torch.equal(image, _hf_pixels(hf, path)[0]), mode


def test_qwen2_vl_pixels_are_its_processors_in_every_mode(tmp_path_factory, images):
    from orch.runtime.models.qwen_vl.processing import VisionMedia

    directory = make_qwen_vl(tmp_path_factory.mktemp("qwen2-vl") / "m", "qwen2_vl")
    rows = VisionMedia(qwen_vl_spec(directory).modules["vision"]).image_rows(images)
    hf = hf_images(directory)
    for path, mode, got in zip(images, MODES, rows, strict=True):
        assert torch.equal(got, _hf_pixels(hf, path)), mode


def test_llava_loss_on_an_rgba_image_is_hfs(llava, tmp_path):
    """orch's step-0 loss (one process, float64) on a sample whose image is RGBA with partial transparency equals
    the cross-entropy of LlavaForConditionalGeneration's logits given the processor's pixels of the opened file
    and the input_ids and labels `orch data inspect --json` shows."""
    import transformers
    from PIL import Image

    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.demo_data import make_tokenizer
    from orch.runtime.data.processing import as_json, process
    from orch.runtime.data.source import BatchSource
    from orch.runtime.train.single_process import run_reference

    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(make_tokenizer(tmp_path / "tok" / "tokenizer.json")),
                                               unk_token="[UNK]")  # fmt: skip
    tok.chat_template = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} ?\n{% endfor %}"
    tok.save_pretrained(llava)
    _write(tmp_path / "rgba.png", "RGBA", 7)
    record = {"messages": [{"role": "user", "content": "<image>what is in the picture ?"},
                           {"role": "assistant", "content": "a red circle"}], "images": ["rgba.png"]}  # fmt: skip
    (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n")
    model = model_spec_from_dir(llava)
    data, _ = conversation_data(model, str(tmp_path / "d.jsonl"), 1, None, None)

    got = run_reference(model, data, seed=0, steps=1, dtype=torch.float64, optimizer="sgd", lr=0.0).losses[0]

    source = BatchSource(model, data, 0).files
    assert source is not None
    conv = source.conversation(0)
    shown = as_json(process(conv, model, source.rules, source.counter, data.seq_len, processors=source.processors),
                    model, source.counter)  # fmt: skip
    ids, labels = torch.tensor([shown["input_ids"]]), torch.tensor(shown["labels"])
    assert int((ids == IMAGE_TOKEN).sum()) == 16
    hf = transformers.LlavaForConditionalGeneration.from_pretrained(llava, dtype=torch.float64)
    with Image.open(conv.images[0]) as im:
        pixels = transformers.AutoImageProcessor.from_pretrained(llava)(images=[im], return_tensors="pt")
    with torch.no_grad():
        logits = hf(input_ids=ids, pixel_values=pixels["pixel_values"].to(torch.float64)).logits[0]
    want = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100)
    assert got == pytest.approx(float(want), rel=1e-9)
