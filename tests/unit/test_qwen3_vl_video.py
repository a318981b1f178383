"""Qwen3-VL's videos as orch takes them, one item of grid (1, h, w) per temporal step (docs/qwen_vl.md), held
against transformers' own model in float64:

* HF's vision tower on a video of grid (T, h, w) is exactly its tower on T items of (1, h, w) (attention, rotary
  and the position-embedding grid are per frame): merged rows and deepstack features, bit for bit; orch's tower
  on the T items gives them too;
* a data file of images and videos (two videos side by side, a video beside an image, text only), step 0's
  batch through orch's tower and LLM (rows, items, layouts and positions as the runtime makes them from the
  index) gives the loss and every gradient of HF's `Qwen3VLForConditionalGeneration` run sample by sample on the
  ids `orch data inspect` shows (tests/unit/test_qwen_vl_data.py holds those against HF's processor), orch's
  rows as `pixel_values` / `pixel_values_videos`, each video's own `video_grid_thw` (T, h, w) and
  `mm_token_type_ids`: HF computes its own positions (its get_rope_index splits each video by frame) and its
  deepstack (1e-9 relative).
"""

import pytest
import torch
import torch.nn.functional as F
from equivalence import assert_same_gradients
from qwen_vl_data import qwen_vl_spec, turn, write_conversations, write_image, write_video
from qwen_vl_models import make_qwen_vl

from orch.runtime.sample import MediaItem


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    directory = make_qwen_vl(tmp_path_factory.mktemp("qwen3-vl-video") / "model", "qwen3_vl", seed=2)
    return directory, qwen_vl_spec(directory)


def _hf(directory, attention=None):
    import transformers

    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(directory, dtype=torch.float64)
    if attention is not None:
        model.config.text_config._attn_implementation = attention
    return model


def test_the_tower_on_a_video_is_the_tower_on_its_frames(qwen3):
    from orch.runtime.models.qwen_vl.vision import QwenVisionTower

    directory, _ = qwen3
    hf = _hf(directory)
    gen = torch.Generator().manual_seed(0)
    for t, h, w in [(3, 4, 6), (2, 8, 4), (1, 6, 6)]:
        pixels = torch.randn(t * h * w, 1536, generator=gen, dtype=torch.float64)
        video = hf.model.visual(pixels, grid_thw=torch.tensor([[t, h, w]]))
        frames = hf.model.visual(pixels, grid_thw=torch.tensor([[1, h, w]] * t))
        assert torch.equal(video.pooler_output, frames.pooler_output)
        assert len(video.deepstack_features) == 2
        for a, b in zip(video.deepstack_features, frames.deepstack_features, strict=True):
            assert torch.equal(a, b)
        tower = QwenVisionTower(hf.model.visual, hf.config)
        mine = tower(pixels, [pixels.shape[0]], items=[[MediaItem((1, h, w), 0.5 + k) for k in range(t)]])
        want = torch.cat([video.pooler_output, *video.deepstack_features], dim=-1)
        torch.testing.assert_close(mine, want, rtol=1e-12, atol=1e-12)


def write_data(root):
    write_image(root / "i0.png", 100, 60, seed=1)
    write_image(root / "i1.png", 40, 90, seed=2)
    write_video(root / "v.mp4", frames=10, width=64, height=48, rate=4)  # 5 frames sampled: 3 steps
    write_video(root / "w.mp4", frames=8, width=40, height=72, rate=2)  # 8 frames: 4 steps
    records = [
        turn("<image>what happens<video>then", "it moves", images=["i0.png"], videos=["v.mp4"]),
        turn("<video><video>both", "the same <image> here", images=["i1.png"], videos=["w.mp4", "v.mp4"]),
        turn("just text", "fine"),
    ]
    return write_conversations(root / "data.jsonl", records)


def test_loss_and_gradients_on_a_data_file_equal_hf(qwen3, tmp_path):
    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.processing import as_json, process
    from orch.runtime.data.source import BatchSource
    from orch.runtime.models.hf.attention import register
    from orch.runtime.models.qwen_vl.language import DeepstackCausalLM
    from orch.runtime.models.qwen_vl.media import read_rule
    from orch.runtime.models.qwen_vl.vision import QwenVisionTower
    from orch.runtime.sample import scored_labels

    directory, model = qwen3
    data_file = write_data(tmp_path)
    data, _ = conversation_data(model, str(data_file), 3, None, None)  # the whole file in step 0
    source = BatchSource(model, data, 0).files
    assert source is not None
    batch = source.batch(0, 0)
    rule = read_rule(str(directory), "qwen3_vl")
    hf = _hf(directory)
    config = hf.config

    total, count = torch.zeros((), dtype=torch.float64), 0
    samples = [batch.sample(i, torch.float64) for i in range(batch.size)]
    for i, row in enumerate(batch.rows):  # HF: sample by sample, on the inspected ids and orch's rows
        conv = source.conversation(row)
        shown = as_json(process(conv, model, source.rules, source.counter, data.seq_len,
                                processors=source.processors), model, source.counter)  # fmt: skip
        ids = torch.tensor([shown["input_ids"]])
        types = (ids == config.image_token_id).long() + 2 * (ids == config.video_token_id).long()
        assert shown["text_ids"] == samples[i].text.tolist()
        kinds = [tag for tag, _, _ in conv.visual()]
        grids = [(1, *g[1:]) for g in (it.grid for it in samples[i].items["vision"])]
        rows = samples[i].feats["vision"].split([t * h * w for t, h, w in grids])
        pieces, images, videos, k = [], [], [], 0
        for tag, _, path in conv.visual():  # each placeholder's items: an image one, a video its steps
            n = rule.video_item(path)[0] if tag == "<video>" else 1
            (videos if tag == "<video>" else images).append((torch.cat(rows[k : k + n]), rule.video_item(path)[:3]
                                                            if tag == "<video>" else grids[k]))  # fmt: skip
            pieces.append(tag)
            k += n
        assert k == len(grids) and pieces == kinds
        kwargs = {}
        if images:
            kwargs |= {"pixel_values": torch.cat([p for p, _ in images]),
                       "image_grid_thw": torch.tensor([g for _, g in images])}  # fmt: skip
        if videos:
            kwargs |= {"pixel_values_videos": torch.cat([p for p, _ in videos]),
                       "video_grid_thw": torch.tensor([g for _, g in videos])}  # fmt: skip
        logits = hf(input_ids=ids, mm_token_type_ids=types, **kwargs).logits[0]
        target = torch.tensor(shown["labels"])
        total = total + F.cross_entropy(logits[:-1], target[1:], ignore_index=-100, reduction="sum")
        count += int((target[1:] != -100).sum())
    (total / count).backward()
    by_row = {row: len(samples[i].items["vision"]) for i, row in enumerate(batch.rows)}
    assert by_row == {0: 1 + 3, 1: 4 + 3 + 1, 2: 0}  # an image, a video's 3 steps; 4 + 3 steps, an image

    mine = _hf(directory, attention=register())
    tower = QwenVisionTower(mine.model.visual, mine.config)
    llm = DeepstackCausalLM(mine.model.language_model, mine.lm_head, mine.config.text_config, 2)
    feats = torch.cat([s.feats["vision"] for s in samples])
    out = tower(feats, [s.feats["vision"].shape[0] for s in samples], items=[s.items["vision"] for s in samples])
    layouts = [batch.layout(i) for i in range(batch.size)]
    prefixes = list(out.split([lay.prefix for lay in layouts]))
    logits = llm(prefixes, [s.text for s in samples], None, layouts)
    loss = F.cross_entropy(logits, torch.cat(scored_labels([s.labels for s in samples], layouts)), reduction="sum")
    loss = loss / count
    loss.backward()
    assert batch.label_tokens == count
    assert abs(loss.item() - (total / count).item()) <= 1e-9 * abs(loss.item())
    assert_same_gradients(mine, hf)
