"""Qwen2.5-Omni's thinker (runtime/models/qwen_omni/) against transformers 5.24: its config.json read into the
three modules without torch (every field against the config classes, the class defaults, bad fields named), the
LLM built to attend with orch's varlen attention, TMRoPE positions equal to HF's `get_rope_index`, and `orch
data inspect`'s input_ids and encoder inputs equal to Qwen2_5OmniProcessor's for text, image, audio and
image+audio conversations."""

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from qwen_omni_models import make_processor, make_qwen_omni

from orch.planner.errors import SpecError
from orch.planner.hf_config import describe
from orch.planner.specs import HFPart, Modality, ModuleKind
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.sample import MediaItem

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def omni(tmp_path_factory) -> Path:
    return make_qwen_omni(tmp_path_factory.mktemp("omni") / "m")


def check_against(directory: Path, config) -> None:
    """Every derived field of the three modules against the transformers config object's own values."""
    spec = model_spec_from_dir(directory)
    th = config.thinker_config
    a, v, t = th.audio_config, th.vision_config, th.text_config
    audio, vision, llm = spec.modules["audio"], spec.modules["vision"], spec.modules["llm"]
    assert (audio.kind, spec.modality("audio"), audio.feeds) == (ModuleKind.ENCODER, Modality.AUDIO, "llm")
    assert (audio.layers, audio.hidden, audio.heads, audio.ffn, audio.input_dim) == (
        a.encoder_layers, a.d_model, a.encoder_attention_heads, a.encoder_ffn_dim, a.num_mel_bins)  # fmt: skip
    assert (audio.clip_tokens, audio.downsample, audio.refuses("cp", 2) is not None) == (a.n_window, 2, True)
    assert (vision.layers, vision.hidden, vision.heads, vision.ffn) == (
        v.depth, v.hidden_size, v.num_heads, v.intermediate_size)  # fmt: skip
    assert vision.input_dim == v.in_channels * v.temporal_patch_size * v.patch_size**2
    side = v.window_size // v.spatial_merge_size // v.patch_size
    assert vision.window_tokens == (side * v.spatial_merge_size) ** 2 and vision.mlp_kind == "swiglu"
    assert vision.full_attention_blocks == tuple(v.fullatt_block_indexes)
    assert (llm.layers, llm.hidden, llm.heads, llm.num_kv_heads, llm.ffn, llm.vocab, llm.tied_embeddings) == (
        t.num_hidden_layers, t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.intermediate_size,
        t.vocab_size, th.tie_word_embeddings)  # fmt: skip
    path = str(directory.resolve())
    assert [m.hf for m in (audio, vision, llm)] == [HFPart(path=path, part=p) for p in ("audio", "vision", "text")]


def test_tiny_config_gives_the_thinkers_modules(omni):
    check_against(omni, transformers.AutoConfig.from_pretrained(omni))


def test_default_config_and_class_defaults(tmp_path):
    """transformers' default Qwen2.5-Omni as saved, and a config.json naming nothing but its type (the reader's
    class defaults), give the same modules."""
    config = transformers.Qwen2_5OmniConfig()
    config.save_pretrained(tmp_path / "saved")
    check_against(tmp_path / "saved", config)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    got, want = model_spec_from_dir(bare).modules, model_spec_from_dir(tmp_path / "saved").modules
    assert {n: m.model_copy(update={"hf": None}) for n, m in got.items()} == {
        n: m.model_copy(update={"hf": None}) for n, m in want.items()
    }
    assert describe(model_spec_from_dir(bare))[0] == (
        "audio: 32 layers, hidden 1280, 20 heads, ffn 5120, 128 mel bins, 2 tokens per LLM token, clips of 100 tokens"
    )


@pytest.mark.parametrize(
    ("thinker", "field"),
    [
        ({"audio_config": {"output_dim": 64}}, "thinker_config.audio_config.output_dim"),
        ({"vision_config": {"out_hidden_size": 64}}, "thinker_config.vision_config.out_hidden_size"),
        ({"audio_config": {"model_type": "whisper"}}, "thinker_config.audio_config.model_type"),
        ({"text_config": {"num_attention_heads": 0}}, "thinker_config.text_config.num_attention_heads"),
        ({"audio_config": {"n_window": 7}}, "thinker_config.audio_config.n_window"),
        ([], "thinker_config"),
    ],
)
def test_bad_fields_are_named(tmp_path, thinker, field):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni", "thinker_config": thinker}))
    with pytest.raises(SpecError) as got:
        model_spec_from_dir(tmp_path)
    assert got.value.field == field and str(tmp_path / "config.json") in str(got.value)


def test_the_thinkers_llm_attends_with_orchs_varlen_attention(omni):
    """Only the thinker's LLM attends with orch's varlen attention; its towers keep HF's own (the audio tower's
    chunks and the vision tower's windows by their cu_seqlens). The composite's top config has no text_config:
    setting the attention on the top config set it on every sub-config, the towers' included."""
    from orch.runtime.models.hf.attention import register
    from orch.runtime.models.hf.build import build_full

    full = build_full(str(omni))
    assert full.thinker.model.language_model.config._attn_implementation == register()
    assert full.thinker.model.audio_tower.config._attn_implementation != register()
    assert full.thinker.model.visual.config._attn_implementation != register()


def hf_rope_index(config):
    """transformers' own `get_rope_index` of Qwen2.5-Omni, bound to a thinker config."""
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as m

    cls = m.Qwen2_5OmniPreTrainedModelForConditionalGeneration
    owner = SimpleNamespace(config=config, spatial_merge_size=config.vision_config.spatial_merge_size)
    owner.get_llm_pos_ids_for_vision = lambda *a: cls.get_llm_pos_ids_for_vision(owner, *a)
    owner.get_chunked_index = lambda *a: cls.get_chunked_index(owner, *a)
    return lambda **kw: cls.get_rope_index(owner, **kw)


def test_positions_are_hfs_get_rope_index(omni):
    """Text, an image, a clip, a video (its time axis at position_id_per_seconds, past its height and width) and
    another image, in one sequence: orch's positions from its layout equal HF's from the input_ids."""
    import torch

    from orch.runtime.models.qwen_omni.rope import omni_positions
    from orch.runtime.sample import MediaItem, SequenceLayout

    config = transformers.AutoConfig.from_pretrained(omni).thinker_config
    ids = SimpleNamespace(**{k: getattr(config, k) for k in ("image_token_id", "video_token_id", "audio_token_id")})
    vs, ve, ab, ae = (config.vision_start_token_id, config.vision_end_token_id, config.audio_start_token_id,
                      config.audio_end_token_id)  # fmt: skip
    items = [MediaItem((1, 4, 6)), MediaItem((3, 4, 4), seconds=1.0), MediaItem((1, 2, 2))]
    clip_frames = 45  # 11 LLM tokens
    clip_rows = ((clip_frames - 1) // 2 + 1 - 2) // 2 + 1
    seq, text, inserts = [], [], []
    vision_first = clip_rows  # the prefix: the clip's rows, then the vision items' (encoder order)

    def words(n):
        for _ in range(n):
            text.append(len(text))
            seq.append(7)

    def rows(token, n, first):
        inserts.append((len(text), first, n))
        seq.extend([token] * n)

    words(3)
    for item, token in zip(items, (ids.image_token_id, ids.video_token_id, ids.image_token_id), strict=True):
        seq.append(vs), text.append(len(text))
        rows(token, item.patches // 4, vision_first)
        vision_first += item.patches // 4
        seq.append(ve), text.append(len(text))
        words(2)
        if item.is_video:  # the clip after the video
            seq.append(ab), text.append(len(text))
            rows(ids.audio_token_id, clip_rows, 0)
            seq.append(ae), text.append(len(text))
            words(1)
    prefix = clip_rows + sum(it.patches // 4 for it in items)
    layout = SequenceLayout.interleaved(prefix, len(text), inserts)
    got = omni_positions(layout, items, 2, config.position_id_per_seconds)
    want, _ = hf_rope_index(config)(
        input_ids=torch.tensor([seq]),
        image_grid_thw=torch.tensor([items[0].grid, items[2].grid]),
        video_grid_thw=torch.tensor([items[1].grid]),
        attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        audio_seqlens=torch.tensor([clip_frames]),
        second_per_grids=torch.tensor([1.0]),
    )
    assert torch.equal(got, want[:, 0])
    # Qwen2.5-VL's rule (text after a video at start + max(h, w) / merge) would not do
    video_end = int(want[0, 0, seq.index(ve, seq.index(ids.video_token_id))])
    assert video_end > int(want[1, 0, seq.index(ids.video_token_id)]) + 2 + 1


def _wav(path: Path, samples: int, seed: int) -> np.ndarray:
    import soundfile

    wave = (0.3 * np.random.default_rng(seed).standard_normal(samples)).astype(np.float32)
    soundfile.write(path, wave, 16000, subtype="FLOAT")
    return wave


CONVERSATIONS = {
    "text": ([{"role": "user", "content": "a red circle ?"}, {"role": "assistant", "content": "a blue square"}], 0, 0),
    "image": ([{"role": "user", "content": "<image>what is in <image> the picture ?"},
               {"role": "assistant", "content": "a blue square"}], 2, 0),
    "audio": ([{"role": "user", "content": "<audio><audio>transcribe"}, {"role": "assistant", "content": "a red"},
               {"role": "user", "content": "and <audio>"}, {"role": "assistant", "content": "200"}], 0, 3),
    "image_audio": ([{"role": "user", "content": "<image>what is <audio> in the picture ?"},
                     {"role": "assistant", "content": "a blue square"},
                     {"role": "user", "content": "and <audio><image> then <audio>"},
                     {"role": "assistant", "content": "a green circle"}], 2, 3),
}  # fmt: skip
# clip lengths whose log-mel frames are 100, 102, 103 and 73: every remainder mod 4 of the processor's formula
CLIPS = [16000, 16161, 16330, 11530]


@pytest.mark.parametrize("kind", list(CONVERSATIONS))
def test_inspect_ids_and_inputs_are_the_processors(cli, omni, tmp_path, kind):
    """`orch data inspect --json`'s input_ids are Qwen2_5OmniProcessor's on the conversation LLaMA-Factory's
    qwen2_omni plugin renders (`<image>` -> `<|vision_bos|><|IMAGE|><|vision_eos|>`, `<audio>` ->
    `<|audio_bos|><|AUDIO|><|audio_eos|>`), and each encoder's inputs are the processor's: the image's patch rows
    its pixel_values, a clip's real frames its input_features where its feature_attention_mask is set."""
    import torch
    from PIL import Image

    from orch.runtime.data.index import TokenRules
    from orch.runtime.data.media import media_processors

    messages, n_images, n_clips = CONVERSATIONS[kind]
    rng = np.random.default_rng(0)
    for i, (w, h) in enumerate([(40, 30), (90, 20)][:n_images]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    waves = [_wav(tmp_path / f"{i}.wav", n, i) for i, n in enumerate(CLIPS[:n_clips])]
    record = {"messages": messages, "images": [f"{i}.png" for i in range(n_images)],
              "audios": [f"{i}.wav" for i in range(n_clips)]}  # fmt: skip
    (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n")
    r = cli("data", "inspect", str(tmp_path / "d.jsonl"), "--model", str(omni), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output[r.output.index("{") :])["input_ids"]

    processor = make_processor(transformers.AutoTokenizer.from_pretrained(omni))
    tags = {"<image>": "<|vision_bos|><|IMAGE|><|vision_eos|>", "<audio>": "<|audio_bos|><|AUDIO|><|audio_eos|>"}
    rendered = [{**m, "content": m["content"].replace("<image>", tags["<image>"]).replace("<audio>", tags["<audio>"])}
                for m in messages]  # fmt: skip
    text = processor.apply_chat_template(rendered, tokenize=False)
    images = [Image.open(tmp_path / f"{i}.png").convert("RGB") for i in range(n_images)] or None
    out = processor(text=text, images=images, audio=waves or None, sampling_rate=16000, return_tensors="np")
    assert got == out["input_ids"][0].tolist()

    spec = model_spec_from_dir(omni)
    rules = {r.name: r for r in TokenRules.of(spec).encoders}
    procs = media_processors(spec)
    if n_images:
        rows = procs["vision"].inputs(tuple(str(tmp_path / f"{i}.png") for i in range(n_images)), rules["vision"],
                                      1024, kinds=("<image>",) * n_images)  # fmt: skip
        assert np.allclose(torch.cat(rows).numpy(), out["pixel_values"], rtol=0, atol=1e-6)
    if n_clips:
        from orch.runtime.models.qwen_omni.audio import OmniAudioTower

        clips = procs["audio"].inputs(tuple(str(tmp_path / f"{i}.wav") for i in range(n_clips)), rules["audio"], 1024)
        real = OmniAudioTower.clips(None, torch.cat(clips), [0] * n_clips,
                                    [[_clip_item(c)] for c in clips])  # fmt: skip
        for frames, features, mask in zip(real, out["input_features"], out["feature_attention_mask"], strict=True):
            assert frames.shape[0] == mask.sum() and np.array_equal(frames.numpy(), features[:, : mask.sum()].T)


def _clip_item(rows):
    from orch.runtime.sample import MediaItem

    return MediaItem((1, 1, rows.shape[0]))


def test_a_clip_too_short_for_one_token_is_refused():
    from orch.runtime.models.qwen_omni.media import OmniClips

    assert OmniClips().tokens(480, 16000) == 2  # 3 frames: one LLM token
    with pytest.raises(ValueError, match="too short for one audio token"):
        OmniClips().tokens(320, 16000)


def test_the_published_7b_config_is_read(tmp_path):
    """bench/configs/qwen2_5_omni_7b (Qwen2.5-Omni-7B's published config.json, the `orch plan` table's input): the
    thinker's three modules as transformers reads the same file."""
    import shutil

    src = Path(__file__).resolve().parents[2] / "bench" / "configs" / "qwen2_5_omni_7b"
    shutil.copytree(src, tmp_path / "m")
    check_against(tmp_path / "m", transformers.AutoConfig.from_pretrained(tmp_path / "m"))
    assert describe(model_spec_from_dir(tmp_path / "m"))[1:] == [
        "vision: 32 blocks (4 full-attention, the rest in 64-patch windows), width 1280, 16 heads, ffn 3420 swiglu, "
        "merge 2x2 → 4 patches per LLM token, 1176 values per patch",
        "llm: 28 layers, hidden 3584, 28 heads (4 KV), ffn 18944, vocab 152064",
    ]


@dataclass(frozen=True)
class Sound:
    """A video's own audio as the data side hands it (runtime/sample.py `Sound`): its clip and LLM rows."""

    clip: int
    rows: int


@dataclass(frozen=True)
class SoundingItem(MediaItem):
    """A video's first item with its sound (runtime/sample.py `MediaItem.sound`)."""

    sound: Sound | None = None


def omni_grids(omni):
    from orch.runtime.models.qwen_omni.media import OmniGrids

    rule = model_spec_from_dir(omni)
    from orch.runtime.data.index import TokenRules

    grids = next(r.grids for r in TokenRules.of(rule).encoders if r.grids is not None)
    assert isinstance(grids, OmniGrids) and grids.wrap == ("<|vision_bos|>", "<|vision_eos|>")
    return grids


# (t, h, w, seconds per step, audio rows): chunks of 50 positions; more video chunks, more audio chunks, equal
VIDEOS = [(4, 4, 4, 1.0, 30), (3, 4, 6, 0.5, 140), (8, 2, 2, 0.8, 90), (2, 4, 4, 2.0, 100)]


@pytest.mark.parametrize("video", VIDEOS)
def test_sound_chunks_are_the_processors(omni, video):
    """A video with its sound: the (video rows, audio rows) chunks orch places write the text
    Qwen2_5OmniProcessor's `replace_video_with_audio_token` writes."""

    t, h, w, seconds, audio = video
    processor = make_processor(transformers.AutoTokenizer.from_pretrained(omni))
    processor.video_processor = SimpleNamespace(merge_size=2)  # the one field of it the method reads
    text = processor.replace_video_with_audio_token(
        {"video_grid_thw": [[t, h, w]], "video_second_per_grid": [seconds]}, 0, {"num_audio_tokens": [audio]}, 0,
        position_id_per_seconds=25, seconds_per_chunk=2.0,
    )  # fmt: skip
    item = SoundingItem((t, h, w), seconds, Sound(0, audio))
    got = omni_grids(omni).sound_chunks(item)
    assert text == "<|audio_bos|>" + "".join("<|VIDEO|>" * v + "<|AUDIO|>" * a for v, a in got) + "<|audio_eos|>"
    assert len(got) > 1
    assert sum(v for v, _ in got) == t * h * w // 4 and sum(a for _, a in got) == audio


@pytest.mark.parametrize("video", VIDEOS)
def test_positions_of_a_video_with_its_sound_are_hfs(omni, video):
    """An image, a clip and a video used with its own audio (its rows and its clip's interleaved chunk by chunk)
    in one sequence: orch's TMRoPE positions equal HF's `get_rope_index(use_audio_in_video=True)`."""
    import torch

    from orch.runtime.models.qwen_omni.media import clip_llm_tokens
    from orch.runtime.models.qwen_omni.rope import omni_positions
    from orch.runtime.sample import SequenceLayout

    config = transformers.AutoConfig.from_pretrained(omni).thinker_config
    t, h, w, seconds, audio = video
    frames = 4 * audio  # a clip of `audio` LLM rows
    assert clip_llm_tokens(frames) == audio
    image = MediaItem((1, 4, 6))
    sounding = SoundingItem((t, h, w), seconds, Sound(1, audio))
    plain_frames = 45
    plain = clip_llm_tokens(plain_frames)
    ids = config
    seq, text, inserts = [], [], []
    audio_first = {0: 0, 1: plain}  # the prefix: the clips' rows (placeholder order), then the vision items'
    vision_first = plain + audio

    def token(tok):
        text.append(len(text))
        seq.append(tok)

    def rows(tok, n, first):
        inserts.append((len(text), first, n))
        seq.extend([tok] * n)

    for _ in range(3):
        token(7)
    token(ids.vision_start_token_id), rows(ids.image_token_id, 6, vision_first), token(ids.vision_end_token_id)
    token(7)
    token(ids.audio_start_token_id), rows(ids.audio_token_id, plain, audio_first[0]), token(ids.audio_end_token_id)
    token(ids.vision_start_token_id), token(ids.audio_start_token_id)
    v_at, a_at = vision_first + 6, audio_first[1]
    for v, a in omni_grids(omni).sound_chunks(sounding):
        if v:
            rows(ids.video_token_id, v, v_at)
        if a:
            rows(ids.audio_token_id, a, a_at)
        v_at, a_at = v_at + v, a_at + a
    token(ids.audio_end_token_id), token(ids.vision_end_token_id)
    for _ in range(2):
        token(7)
    prefix = plain + audio + 6 + t * h * w // 4
    layout = SequenceLayout.interleaved(prefix, len(text), inserts)
    got = omni_positions(layout, [image, sounding], 2, config.position_id_per_seconds)
    want, _ = hf_rope_index(config)(
        input_ids=torch.tensor([seq]),
        image_grid_thw=torch.tensor([image.grid]),
        video_grid_thw=torch.tensor([sounding.grid]),
        attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        use_audio_in_video=True,
        audio_seqlens=torch.tensor([plain_frames, frames]),
        second_per_grids=torch.tensor([seconds]),
    )
    assert torch.equal(got, want[:, 0])


def test_a_data_files_positions_are_hfs(cli, omni, tmp_path):
    """Through the data path: a conversation of text, an image, clips and a video (no sound) read from a data file;
    the TMRoPE positions of its batch's layout equal HF's `get_rope_index` on the input_ids `orch data inspect`
    gives, with the index's grids and the clips' frames."""
    import math

    import torch
    from PIL import Image
    from qwen_vl_data import write_video

    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.source import ConversationData

    Image.fromarray(np.random.default_rng(0).integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(tmp_path / "0.png")
    write_video(tmp_path / "v.mp4", frames=12, width=80, height=80, rate=2)
    clips = [16330, 11530]
    for i, n in enumerate(clips):
        _wav(tmp_path / f"{i}.wav", n, i)
    messages = [{"role": "user", "content": "<audio>what is <image> in <video> the picture ?"},
                {"role": "assistant", "content": "a blue square"}, {"role": "user", "content": "and <audio>"},
                {"role": "assistant", "content": "a green circle"}]  # fmt: skip
    record = {"messages": messages, "images": ["0.png"], "videos": ["v.mp4"], "audios": ["0.wav", "1.wav"]}
    (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n")
    r = cli("data", "inspect", str(tmp_path / "d.jsonl"), "--model", str(omni), "--json")
    assert r.exit_code == 0, r.output
    ids = json.loads(r.output[r.output.index("{") :])["input_ids"]

    model = model_spec_from_dir(omni)
    batch = ConversationData(model, conversation_data(model, str(tmp_path / "d.jsonl"), 1, None, None)[0]).batch(0, 0)
    image, video = batch.items("vision", 0)
    assert video.is_video and video.grid[0] > 1
    config = transformers.AutoConfig.from_pretrained(omni).thinker_config
    want, _ = hf_rope_index(config)(
        input_ids=torch.tensor([ids]),
        image_grid_thw=torch.tensor([image.grid]),
        video_grid_thw=torch.tensor([video.grid]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        audio_seqlens=torch.tensor([math.ceil(n / 160) for n in clips]),
        second_per_grids=torch.tensor([video.seconds]),
    )
    assert torch.equal(batch.layout(0).positions, want[:, 0])


def test_a_clip_too_short_for_one_token_is_skipped_and_named(cli, omni, tmp_path):
    """A clip under 3 log-mel frames gives Qwen2.5-Omni no audio token: `orch data index` skips its sample and
    says `file:line: audios[i]: path: what`, and indexes the rest."""
    _wav(tmp_path / "short.wav", 200, 0)
    _wav(tmp_path / "ok.wav", 16000, 1)
    turn = [{"role": "user", "content": "<audio>hi"}, {"role": "assistant", "content": "a red"}]
    records = [{"messages": turn, "audios": ["short.wav"]}, {"messages": turn, "audios": ["ok.wav"]}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    r = cli("data", "index", str(tmp_path / "d.jsonl"), "--model", str(omni))
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    said = " ".join(r.output.split())
    assert (
        f"d.jsonl:1: audios[0]: {tmp_path / 'short.wav'}: a clip of 2 log-mel frames is too short for one audio "
        "token (3 frames, 30 ms)" in said
    )
    assert "1 samples skipped: 1 malformed" in said


def test_orch_profile_times_both_towers_real_blocks(omni):
    """`orch profile`'s block cases (runtime/models/hf/parts.py) of the thinker: the audio tower's first block
    attending within each chunk of n_window tokens of each sample, the vision tower's first (windowed) block."""
    import torch

    from orch.runtime.models.hf.parts import bare_module, layer_case

    spec = model_spec_from_dir(omni)
    case = layer_case(spec, "audio", torch.float64, torch.device("cpu"), 0, None)
    layer = case.module.audio_tower.layers[0]
    assert type(layer).__name__ == "Qwen2_5OmniAudioEncoderLayer" and len(case.module.audio_tower.layers) == 1
    x = torch.randn(30, spec.modules["audio"].hidden, dtype=torch.float64)
    parts = [layer(c, cu_seqlens=torch.tensor([0, c.shape[0]], dtype=torch.int32))[0] for c in x.split([8, 4, 8, 8, 2])]
    assert torch.allclose(case(x, [12, 18]), torch.cat(parts), rtol=0, atol=1e-12)  # chunks of 8 (n_window)
    vision = layer_case(spec, "vision", torch.float64, torch.device("cpu"), 0, None)
    assert vision(torch.randn(32, spec.modules["vision"].hidden, dtype=torch.float64), [16, 16]).shape == (32, 32)
    bare = bare_module(spec, "audio", torch.float64, torch.device("cpu"), 0, None)
    assert bare(torch.randn(2 * 24, 16, dtype=torch.float64), [24]).shape == (12, spec.llm.hidden)


def test_the_audio_towers_attention_is_priced_per_chunk(tmp_path):
    """Each audio token meets the n_window tokens of its chunk in every block: attention linear in a clip's length
    (no per-pair term), as its windowed vision blocks are."""
    from orch.planner.costs import attention_coefficients

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    audio = model_spec_from_dir(tmp_path).modules["audio"]
    width = audio.attention_width
    assert attention_coefficients(audio) == (4 * width * 100 * audio.layers, 0)


def test_export_rewrites_the_weights_and_keeps_every_other_file():
    """`orch export` writes a model's weights anew and copies the rest: Qwen2.5-Omni's spk_dict.pt (its talker's
    voices, a .pt file) is not weights."""
    from orch.runtime.models.hf.export import is_weights_file

    weights = ("model.safetensors", "model-00001-of-00005.safetensors", "model.safetensors.index.json",
               "pytorch_model.bin", "pytorch_model-00001-of-00002.bin")  # fmt: skip
    assert all(is_weights_file(name) for name in weights)
    assert not any(is_weights_file(name) for name in ("spk_dict.pt", "tokenizer.json", "preprocessor_config.json"))
