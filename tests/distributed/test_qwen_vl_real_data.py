"""A Qwen2.5-VL trained on a data file of native-resolution images and a video, held against transformers' own
`Qwen2_5_VLForConditionalGeneration` in float64.

The file: images of many sizes (4 to 64 merged tokens each), several in one sample, one in an answer, text-only
samples, a video; the whole file is step 0's global batch. The reference runs HF's model sample by sample on the
`input_ids` and labels `orch data inspect --json` shows (tests/unit/test_qwen_vl_data.py holds those against
HF's processor), the images' `pixel_values` from HF's own image processor, the video's rows from orch's (HF's
video processor needs torchvision), its `second_per_grid_ts`, and `mm_token_type_ids` from the ids: HF computes
its own M-RoPE positions. Every plan gives HF's loss (1e-9 relative) and every parameter's gradient (1e-9).

And as a user holds one rank against HF: images at many aspect ratios (4 to 56 merged tokens, most larger than
the tower's 2x2-unit windows and of sides they do not divide), up to three per sample, through HF's own
processor (`Qwen2_5_VLProcessor` on the rendered text and the images) and `model(**inputs)`.
"""

import pytest
import torch
import torch.nn.functional as F
from equivalence import assert_matches_hf
from launching import train_tasks
from qwen_vl_data import hf_auto_images, hf_processor, turn, write_conversations, write_image, write_video
from qwen_vl_models import make_qwen_vl

from orch.cli.data_cmd import conversation_data
from orch.planner.plan import DataParallel, Layout
from orch.runtime.data.source import BatchSource
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

SEED = 3
ALL = [0, 1, 2, 3]
PLANS = {
    "homogeneous_dp4": {"llm": (Layout(dp=4), ALL)},
    "vision_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
    "vision_dp4_llm_cp2_dp2": {"llm": (Layout(cp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
    "vision_dp4_llm_pp2_dp2": {"llm": (Layout(pp=2, dp=2), ALL), "vision": (Layout(dp=4), ALL)},
}
SIZES = [(56, 56), (100, 60), (30, 200), (224, 224), (90, 150), (200, 40)]


def write_data(root):
    for i, (w, h) in enumerate(SIZES):
        write_image(root / f"i{i}.png", w, h, seed=i)
    write_video(root / "v.mp4", frames=10, width=64, height=64, rate=5)
    records = [
        turn("<image>what is it", "a red circle", images=["i0.png"]),
        turn("compare <image> with <image> please", "the second", images=["i1.png", "i2.png"]),
        turn("just text here", "fine"),
        turn("<image>", "big one", images=["i3.png"]),
        turn("what happens <video>", "it moves", videos=["v.mp4"]),
        turn("and this", "it is <image> here", images=["i4.png"]),
        turn("<image><image> two", "yes", images=["i5.png", "i0.png"]),
        turn("no image", "right"),
    ]
    return write_conversations(root / "data.jsonl", records)


def inspected(source, row) -> dict:
    from orch.runtime.data.processing import as_json, process

    conv = source.conversation(row)
    got = process(conv, source.model, source.rules, source.counter, source.data.seq_len, processors=source.processors)
    return as_json(got, source.model, source.counter)


def hf_reference(directory, model, data):
    """(loss, gradients) of step 0 by HF's model, sample by sample (module docstring)."""
    import transformers
    from PIL import Image

    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    images = hf_auto_images(directory)
    source = BatchSource(model, data, SEED).files
    assert source is not None
    batch = source.batch(SEED, 0)
    assert sorted(batch.rows) == list(range(len(batch.rows)))  # the whole file, each sample once
    config = hf.config
    total, count = torch.zeros((), dtype=torch.float64), 0
    for i, row in enumerate(batch.rows):
        conv, shown = source.conversation(row), inspected(source, row)
        ids = torch.tensor([shown["input_ids"]])
        types = (ids == config.image_token_id).long() + 2 * (ids == config.video_token_id).long()
        items = batch.items("vision", i)
        kwargs = {}
        if conv.images:
            got = images(images=[Image.open(f).convert("RGB") for f in conv.images], return_tensors="pt")
            kwargs |= {"pixel_values": got["pixel_values"].to(torch.float64), "image_grid_thw": got["image_grid_thw"]}
            assert got["image_grid_thw"].tolist() == [list(it.grid) for it in items if not it.is_video]
        if conv.videos:
            rows = batch.sample(i, torch.float64).feats["vision"]  # orch's rows: the video's are its only ones
            videos = [it for it in items if it.is_video]
            kwargs |= {"pixel_values_videos": rows, "video_grid_thw": torch.tensor([list(it.grid) for it in videos]),
                       "second_per_grid_ts": torch.tensor([it.seconds for it in videos])}  # fmt: skip
        logits = hf(input_ids=ids, mm_token_type_ids=types, **kwargs).logits[0]
        target = torch.tensor(shown["labels"])
        total = total + F.cross_entropy(logits[:-1], target[1:], ignore_index=-100, reduction="sum")
        count += int((target[1:] != -100).sum())
    loss = total / count
    loss.backward()
    return loss.item(), {k: v.grad for k, v in hf.named_parameters() if v.grad is not None}


def orch_keys(model):
    from orch.runtime.models.hf.build import build_hf_modules

    return {f"{n}.{local}": key for n, m in build_hf_modules(model).items() for local, key in m.hf_keys.items()}


@pytest.mark.slow
def test_qwen2_5_vl_on_a_data_file_matches_hf(tmp_path):
    directory = make_qwen_vl(tmp_path / "model", "qwen2_5_vl", seed=1)
    data_file = write_data(tmp_path / "data")
    model = model_spec_from_dir(directory)
    data, _ = conversation_data(model, str(data_file), 8, None, None)  # every sample in step 0
    want = (orch_keys(model), *hf_reference(directory, model, data))
    built = {n: hand_plan(model, data, lay, data_parallel=DataParallel.FSDP) for n, lay in PLANS.items()}
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    records = train_tasks(built, data, cfg, tmp_path / "runs")
    for name in built:
        assert_matches_hf(records, name, tmp_path / "runs", *want)
        assert records[name][0].data["failed"] == 0 and records[name][0].data["skipped"] == 0


ODD_SIZES = [(37, 245), (245, 37), (300, 20), (90, 150), (189, 95), (56, 56), (400, 130), (61, 333), (150, 150)]


def hf_processor_reference(directory, source, batch):
    """(loss, gradients) of step 0 by HF's processor and forward, sample by sample: `proc(text, images)` on the
    rendered conversation (its image processor as `AutoImageProcessor` picks it, as a user's `AutoProcessor`
    has it), `model(**inputs)`, the labels `orch data inspect` shows (its ids asserted HF's)."""
    import transformers
    from PIL import Image

    hf = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    proc = hf_processor(directory)
    total, count = torch.zeros((), dtype=torch.float64), 0
    for row in batch.rows:
        conv, shown = source.conversation(row), inspected(source, row)
        pad = "<|vision_start|><|image_pad|><|vision_end|>"
        messages = [{"role": role, "content": content.replace("<image>", pad)} for role, content in conv.messages]
        text = proc.tokenizer.apply_chat_template(messages, tokenize=False)
        images = [Image.open(f).convert("RGB") for f in conv.images] or None
        inputs = proc(text=[text], images=images, return_tensors="pt")
        assert inputs["input_ids"][0].tolist() == shown["input_ids"]
        logits = hf(**inputs).logits[0]
        target = torch.tensor(shown["labels"])
        total = total + F.cross_entropy(logits[:-1], target[1:], ignore_index=-100, reduction="sum")
        count += int((target[1:] != -100).sum())
    loss = total / count
    loss.backward()
    return loss.item(), {k: v.grad for k, v in hf.named_parameters() if v.grad is not None}


@pytest.mark.slow
def test_qwen2_5_vl_on_odd_images_matches_hfs_processor_and_forward_on_one_rank(tmp_path):
    root = tmp_path / "data"
    for i, (w, h) in enumerate(ODD_SIZES):
        write_image(root / f"o{i}.png", w, h, seed=10 + i)
    records = [
        turn("<image>what is it", "a tall strip", images=["o0.png"]),
        turn("compare <image> with <image>", "the wide one", images=["o1.png", "o2.png"]),
        turn("plain text", "yes"),
        turn("<image><image> and <image>", "three", images=["o3.png", "o4.png", "o5.png"]),
        turn("look <image>", "it is <image> too", images=["o6.png", "o7.png"]),
        turn("<image>", "square", images=["o8.png"]),
    ]
    data_file = write_conversations(root / "data.jsonl", records)
    directory = make_qwen_vl(tmp_path / "model", "qwen2_5_vl", seed=2)
    model = model_spec_from_dir(directory)
    data, _ = conversation_data(model, str(data_file), len(records), None, None)
    source = BatchSource(model, data, SEED).files
    assert source is not None
    batch = source.batch(SEED, 0)
    assert sorted(batch.rows) == list(range(len(records)))
    grids = [it.grid for i in range(len(records)) for it in batch.items("vision", i)]
    assert len(grids) == 9 and all(4 <= h * w // 4 <= 64 for _, h, w in grids)  # the model's limits
    assert sum((h // 2) % 2 or (w // 2) % 2 for _, h, w in grids) >= 6  # sides the 2-unit window does not divide
    want = (orch_keys(model), *hf_processor_reference(directory, source, batch))
    plan = hand_plan(model, data, {"llm": (Layout(dp=1), [0])})
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    got = train_tasks({"one_rank": plan}, data, cfg, tmp_path / "runs")
    assert_matches_hf(got, "one_rank", tmp_path / "runs", *want)
