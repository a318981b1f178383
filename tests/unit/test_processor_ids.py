"""Each family's token ids as its Hugging Face processor makes them: a model directory whose processor was saved
by transformers' own classes (`save_pretrained`: transformers 5 writes processor_config.json and
chat_template.jinja; older versions preprocessor_config.json and chat_template.json), read by orch, and the
`input_ids` of `orch data inspect --json` equal to the processor's on the same conversation (its chat template
rendered by `apply_chat_template`, then the processor's call expanding each placeholder). Qwen-VL's comparison
is tests/unit/test_qwen_vl_data.py (`test_inspect_ids_are_hfs_processors`)."""

import json
from pathlib import Path

import numpy as np
import pytest
from hf_models import CHATML, make_llava, make_qwen2_audio
from hf_models import make_chat_tokenizer as tokenizer

# clip lengths (16 kHz samples) whose log-mel frames l = ceil(n / 160) are 100, 101, 102, 103, 107 and 73: every
# remainder of l mod 4 ((l + 1) // 4 tokens), and lengths where counting whole frames rounds otherwise
CLIPS = [16000, 16001, 16161, 16330, 16990, 11530]


def save_processor(processor, directory: Path, layout: str) -> None:
    """transformers 5's layout (`processor.save_pretrained`), or the older one: the image processor's or feature
    extractor's own preprocessor_config.json, the tokenizer, and the template in chat_template.json."""
    if layout == "processor":
        processor.save_pretrained(directory)
        assert (directory / "processor_config.json").is_file() and (directory / "chat_template.jinja").is_file()
        assert not (directory / "preprocessor_config.json").exists()
        return
    part = getattr(processor, "image_processor", None) or processor.feature_extractor
    part.save_pretrained(directory)
    processor.tokenizer.save_pretrained(directory)
    (directory / "chat_template.jinja").unlink(missing_ok=True)
    (directory / "chat_template.json").write_text(json.dumps({"chat_template": processor.chat_template}))


def inspect_ids(cli, data: Path, model: Path) -> list[int]:
    r = cli("data", "inspect", str(data), "--model", str(model), "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{") :])["input_ids"]


@pytest.mark.parametrize("layout", ["processor", "parts"])
@pytest.mark.parametrize("vision", ["clip", "siglip"])
def test_llava_ids_are_llava_processors(cli, tmp_path, vision, layout):
    import transformers
    from PIL import Image

    tok = tokenizer(tmp_path / "tok")
    image_id = tok.convert_tokens_to_ids("<image>")
    model = make_llava(tmp_path / "m", vision, "qwen2", image_token=image_id, vocab_size=len(tok))
    pixels = {"size": {"height": 28, "width": 28}} if vision == "siglip" else {
        "size": {"shortest_edge": 28}, "crop_size": {"height": 28, "width": 28}}  # fmt: skip
    images = (transformers.SiglipImageProcessorPil if vision == "siglip" else transformers.CLIPImageProcessorPil)(
        **pixels
    )
    strategy = "default" if vision == "clip" else "full"
    processor = transformers.LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=7, chat_template=CHATML,
                                            vision_feature_select_strategy=strategy,
                                            num_additional_image_tokens=1 if vision == "clip" else 0)  # fmt: skip
    save_processor(processor, model, layout)

    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate([(40, 30), (28, 28), (90, 20)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    messages = [{"role": "system", "content": "a red circle"},
                {"role": "user", "content": "<image>what is in <image> the picture ?"},
                {"role": "assistant", "content": "a blue square"},
                {"role": "user", "content": "and <image>"}, {"role": "assistant", "content": "a green circle"}]  # fmt: skip
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": messages, "images": ["0.png", "1.png", "2.png"]}) + "\n")

    text = processor.apply_chat_template(messages, tokenize=False)
    pil = [Image.open(tmp_path / f"{i}.png").convert("RGB") for i in range(3)]
    want = processor(text=text, images=pil, return_tensors="np")["input_ids"][0].tolist()
    got = inspect_ids(cli, data, model)
    assert got == want
    assert got.count(image_id) == 3 * 16  # 4x4 patches an image (CLIP's class token dropped)


def _wav(path: Path, samples: int, seed: int) -> np.ndarray:
    import soundfile

    wave = (0.3 * np.random.default_rng(seed).standard_normal(samples)).astype(np.float32)
    soundfile.write(path, wave, 16000, subtype="FLOAT")
    return wave


@pytest.mark.parametrize("layout", ["processor", "parts"])
def test_qwen2_audio_ids_are_qwen2_audio_processors(cli, tmp_path, layout):
    """Each clip's `<|AUDIO|>` count is the processor's ((l + 1) // 4 of its l frames) between `<|audio_bos|>`
    and `<|audio_eos|>`, as LLaMA-Factory's qwen2_audio plugin places them for an `<audio>` placeholder."""
    import transformers

    from orch.runtime.sample import mel_frames

    tok = tokenizer(tmp_path / "tok")
    audio_id = tok.convert_tokens_to_ids("<|AUDIO|>")
    model = make_qwen2_audio(tmp_path / "m", audio_token=audio_id, vocab=len(tok), max_source_positions=1500)
    processor = transformers.Qwen2AudioProcessor(feature_extractor=transformers.WhisperFeatureExtractor(feature_size=16),
                                                 tokenizer=tok, chat_template=CHATML)  # fmt: skip
    save_processor(processor, model, layout)

    waves = [_wav(tmp_path / f"{i}.wav", n, i) for i, n in enumerate(CLIPS)]
    messages = [{"role": "user", "content": "<audio><audio>transcribe the sound"},
                {"role": "assistant", "content": "a red circle"},
                {"role": "user", "content": "and <audio> then <audio><audio>"},
                {"role": "assistant", "content": "a blue square"},
                {"role": "user", "content": "<audio>"}, {"role": "assistant", "content": "200"}]  # fmt: skip
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": messages, "audios": [f"{i}.wav" for i in range(len(CLIPS))]}) + "\n")

    expanded = [{**m, "content": m["content"].replace("<audio>", "<|audio_bos|><|AUDIO|><|audio_eos|>")}
                for m in messages]  # fmt: skip
    text = processor.apply_chat_template(expanded, tokenize=False)
    out = processor(text=text, audio=waves, sampling_rate=16000, return_tensors="np")
    want = out["input_ids"][0].tolist()
    got = inspect_ids(cli, data, model)
    assert got == want
    per_clip = [(int(np.ceil(n / 160)) + 1) // 4 for n in CLIPS]
    frames = out["feature_attention_mask"].sum(-1).tolist()
    assert per_clip == [(((m - 1) // 2 + 1) - 2) // 2 + 1 for m in frames]  # the processor's own formula
    assert got.count(audio_id) == sum(per_clip)
    assert got.count(tok.convert_tokens_to_ids("<|audio_bos|>")) == len(CLIPS)
    # each clip's frames the tower gets (4 a token, then the 3 its stem reads past them) are the processor's
    # input_features, and its last row the clip's real frames past its tokens' (runtime/models/qwen2_audio/media.py)
    from orch.runtime.data.index import TokenRules
    from orch.runtime.data.media import media_processors
    from orch.runtime.models.registry import model_spec_from_dir

    spec = model_spec_from_dir(model)
    rows = media_processors(spec)["audio"].inputs(tuple(str(tmp_path / f"{i}.wav") for i in range(len(CLIPS))),
                                                  TokenRules.of(spec).encoders[0], 1024)  # fmt: skip
    for clip, n, feats, m in zip(rows, per_clip, out["input_features"], frames, strict=True):
        assert clip.shape == (4 * n + 4, 16) and np.array_equal(clip[:-1].numpy(), feats.T[: 4 * n + 3])
        assert (clip[-1] == m - 4 * n).all()
    # the common rule (whole frames, pooled pairs rounded) would have given other counts for some of these clips
    common = [round(mel_frames(n, 16000) // 2 / 2) for n in CLIPS]
    assert common != per_clip


def test_qwen_vl_reads_processor_config_json(tmp_path):
    """A Qwen-VL directory whose processor configs are transformers 5's one processor_config.json gives the rule
    its preprocessor_config.json and video_preprocessor_config.json gave."""
    from qwen_vl_models import make_qwen_vl

    from orch.runtime.models.qwen_vl.media import read_rule

    directory = make_qwen_vl(tmp_path / "m", "qwen2_5_vl")
    image = json.loads((directory / "preprocessor_config.json").read_text())
    video = json.loads((directory / "video_preprocessor_config.json").read_text())
    video["fps"] = 3.0  # not the default: the value must come from the file
    (directory / "video_preprocessor_config.json").write_text(json.dumps(video))
    before = read_rule(str(directory), "qwen2_5_vl")
    combined = {"image_processor": image, "video_processor": video, "processor_class": "Qwen2_5_VLProcessor"}
    (directory / "processor_config.json").write_text(json.dumps(combined))
    (directory / "preprocessor_config.json").unlink()
    (directory / "video_preprocessor_config.json").unlink()
    assert read_rule(str(directory), "qwen2_5_vl") == before and before.fps == 3.0


def test_a_directory_without_a_processor_says_what_it_looked_for(cli, tmp_path):
    tok = tokenizer(tmp_path / "tok")
    model = make_llava(tmp_path / "m", "siglip", "qwen2", image_token=tok.convert_tokens_to_ids("<image>"),
                       vocab_size=len(tok))  # fmt: skip
    tok.save_pretrained(model)
    from PIL import Image

    Image.new("RGB", (28, 28)).save(tmp_path / "0.png")
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "<image>"},
                                             {"role": "assistant", "content": "a"}], "images": ["0.png"]}) + "\n")  # fmt: skip
    r = cli("data", "inspect", str(data), "--model", str(model))
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert "processor_config.json: image_processor: no processor config (neither processor_config.json nor " \
           "preprocessor_config.json holds its image processor" in r.output  # fmt: skip
