"""A Hugging Face LLaVA trained on a data file, through its own image processor and tokenizer (chat template):
orch's step-0 loss (float64, lr 0) under several plans equals the loss LlavaForConditionalGeneration computes
in one process from the input_ids and labels `orch data inspect --json` shows (each image's tokens where its
placeholder stood, one sample with two images, one with its image in the answer) and pixel_values, the
cross-entropy over the trained labels taken in float64 (HF's loss_function would upcast the logits to
float32), 1e-9. The same for a Qwen2-Audio against Qwen2AudioForConditionalGeneration's forward on its
processor's features, its clips before or after the request."""

import pytest
import torch
import torch.nn.functional as F
from hf_models import IMAGE_TOKEN, TEMPLATE, make_llava, save_processor
from launching import train_tasks

from orch.cli.data_cmd import conversation_data
from orch.planner.plan import DataParallel, Layout
from orch.runtime.data.demo_data import make_dataset, make_tokenizer
from orch.runtime.data.source import BatchSource
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.plans import hand_plan
from orch.runtime.train.config import TrainConfig

SEED = 2
PLANS = {
    "vision_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "vision": (Layout(dp=4), [0, 1, 2, 3])},
    "llm_pp2_dp2": {"llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]), "vision": (Layout(dp=4), [0, 1, 2, 3])},
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-real")
    model_dir = make_llava(root / "llava", "clip", "llama")
    save_processor(model_dir, make_tokenizer(root / "tok" / "tokenizer.json"))
    data_file = make_dataset(root / "data", images=7, tones=0)
    model = model_spec_from_dir(model_dir)
    data, _ = conversation_data(model, str(data_file), 8, None, None)  # every sample in step 0
    return model_dir, model, data


def inspected(source, row) -> dict:
    """What `orch data inspect --json` prints for the row's sample."""
    from orch.runtime.data.processing import as_json, process

    conv = source.conversation(row)
    got = process(conv, source.model, source.rules, source.counter, source.data.seq_len, processors=source.processors)
    return as_json(got, source.model, source.counter)


def hf_loss(model_dir, model, data) -> float:
    """Step 0's loss by the HF model's own forward, sample by sample: summed over the trained tokens, over
    their count in the global batch."""
    import transformers

    hf = transformers.LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float64)
    source = BatchSource(model, data, SEED).files
    assert source is not None
    batch = source.batch(SEED, 0)
    total, count = torch.zeros((), dtype=torch.float64), 0
    for row in batch.rows:
        conv = source.conversation(row)
        shown = inspected(source, row)
        input_ids, target = torch.tensor([shown["input_ids"]]), torch.tensor([shown["labels"]])
        assert int((input_ids == IMAGE_TOKEN).sum()) == 16 * len(conv.images)  # CLIP's 4x4 patches, no class token
        pixels = None
        if conv.images:
            from PIL import Image

            proc = transformers.AutoImageProcessor.from_pretrained(model_dir)
            pixels = proc(images=[Image.open(f) for f in conv.images], return_tensors="pt")
            pixels = pixels["pixel_values"].to(torch.float64)
        # HF's own loss_function upcasts the logits to float32: the cross-entropy of its float64 logits here
        logits = hf(input_ids=input_ids, pixel_values=pixels).logits[0]
        total = total + F.cross_entropy(logits[:-1], target[0, 1:], ignore_index=-100, reduction="sum")
        count += int((target[0, 1:] != -100).sum())
    return float(total.detach() / count)


@pytest.mark.slow
def test_llava_on_a_data_file_matches_hf(setup, tmp_path):
    model_dir, model, data = setup
    want = hf_loss(model_dir, model, data)
    plans = {n: hand_plan(model, data, lay, data_parallel=DataParallel.FSDP) for n, lay in PLANS.items()}
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    plans["replicate_dp4"] = hand_plan(model, data, {"llm": (Layout(dp=4), [0, 1, 2, 3])})
    records = train_tasks(plans, data, cfg, tmp_path)
    for name in plans:
        assert records[name][0].loss == pytest.approx(want, rel=1e-9), name
        assert records[name][0].data["failed"] == 0


def test_inspect_shows_the_hf_tokens(setup, cli):
    model_dir, model, data = setup
    r = cli("data", "inspect", data.source, "--model", str(model_dir), "--sample", "1", "--json")
    assert r.exit_code == 0, r.output
    import json

    shown = json.loads(r.output[r.output.index("{") :])
    assert shown["encoder_inputs"]["vision"] == [16, 147]  # 16 patches of 3x7x7
    assert shown["trained_tokens"] > 0 and shown["labels"][0] == -100
    # the 16 image tokens where the template put the placeholder: after "user :", ahead of the question
    at = shown["input_ids"].index(IMAGE_TOKEN)
    assert at == shown["placeholders"][0]["before_token"] > 0
    assert shown["input_ids"][at : at + 16] == [IMAGE_TOKEN] * 16 and IMAGE_TOKEN not in shown["input_ids"][at + 16 :]
    assert [t for t in shown["input_ids"] if t != IMAGE_TOKEN] == shown["text_ids"]


@pytest.fixture(scope="module")
def audio_setup(tmp_path_factory):
    import transformers
    from hf_models import make_qwen2_audio

    root = tmp_path_factory.mktemp("hf-audio")
    # a 2 s window (200 frames) that holds the longest tone whole, so HF's own forward takes every clip
    model_dir = make_qwen2_audio(root / "qwen2-audio", max_source_positions=100)
    tok_file = make_tokenizer(root / "tok" / "tokenizer.json")
    transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=2).save_pretrained(model_dir)  # 16 mel bins
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tok_file), unk_token="[UNK]")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model_dir)
    data_file = make_dataset(root / "data", images=0, tones=7)
    model = model_spec_from_dir(model_dir)
    data, _ = conversation_data(model, str(data_file), 4, None, None)
    return model_dir, model, data


def hf_audio_loss(model_dir, model, data) -> float:
    """Step 0's loss by Qwen2AudioForConditionalGeneration's own forward, sample by sample: the inspected
    input_ids, its processor's `input_features` and `feature_attention_mask` of the sample's clips; the
    cross-entropy of the float64 logits over the trained labels."""
    import transformers

    from orch.runtime.sample import waveform_16k

    hf = transformers.Qwen2AudioForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float64)
    extractor = transformers.AutoFeatureExtractor.from_pretrained(model_dir)
    source = BatchSource(model, data, SEED).files
    assert source is not None
    batch = source.batch(SEED, 0)
    total, count = torch.zeros((), dtype=torch.float64), 0
    for row in batch.rows:
        conv = source.conversation(row)
        shown = inspected(source, row)
        ids = torch.tensor([shown["input_ids"]])
        audio = {}
        if conv.audios:
            feats = extractor([waveform_16k(f).numpy() for f in conv.audios], sampling_rate=16000,
                              padding="max_length", return_attention_mask=True, return_tensors="pt")  # fmt: skip
            audio = {"input_features": feats["input_features"].to(torch.float64),
                     "feature_attention_mask": feats["attention_mask"]}  # fmt: skip
        with torch.no_grad():
            logits = hf(input_ids=ids, **audio).logits[0]
        target = torch.tensor(shown["labels"])
        total = total + F.cross_entropy(logits[:-1], target[1:], ignore_index=-100, reduction="sum")
        count += int((target[1:] != -100).sum())
    return float(total / count)


@pytest.mark.slow
def test_qwen2_audio_on_a_data_file_matches_hf(audio_setup, tmp_path):
    model_dir, model, data = audio_setup
    want = hf_audio_loss(model_dir, model, data)
    plans = {
        "audio_dp4_llm_tp2_dp2": {"llm": (Layout(tp=2, dp=2), [0, 1, 2, 3]), "audio": (Layout(dp=4), [0, 1, 2, 3])},
        "audio_tp2_dp2_llm_pp2_dp2": {
            "llm": (Layout(pp=2, dp=2), [0, 1, 2, 3]),
            "audio": (Layout(tp=2, dp=2), [0, 1, 2, 3]),
        },
    }
    built = {n: hand_plan(model, data, lay, data_parallel=DataParallel.FSDP) for n, lay in plans.items()}
    cfg = TrainConfig(optimizer="sgd", steps=1, seed=SEED, dtype="float64", lr=0.0, calibrate=False)
    records = train_tasks(built, data, cfg, tmp_path)
    for name in plans:
        assert records[name][0].loss == pytest.approx(want, rel=1e-9), name
        assert records[name][0].data["failed"] == 0
