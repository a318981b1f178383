"""Qwen3-Omni's thinker (runtime/models/qwen_omni/qwen3_*.py) against transformers 5.24: its config.json read into
the three modules without torch (every field against the config classes, the class defaults, the published 30B-A3B
config, a bad n_window named), the clip token count of its formula, a video's rows merged with its sound's as
Qwen3OmniMoeProcessor writes them, and TMRoPE positions equal to HF's `get_rope_index` (with a sounding video)."""

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from qwen3_omni_models import make_qwen3_omni

from orch.planner.errors import SpecError
from orch.planner.specs import HFPart, Modality, ModuleKind
from orch.runtime.models.registry import model_spec_from_dir
from orch.runtime.sample import MediaItem

transformers = pytest.importorskip("transformers")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "configs" / "qwen3_omni_30b_a3b"


@pytest.fixture(scope="module")
def omni(tmp_path_factory) -> Path:
    return make_qwen3_omni(tmp_path_factory.mktemp("omni3") / "m")


def check_against(directory: Path, config) -> None:
    """Every derived field of the three modules against the transformers config object's own values."""
    from orch.runtime.models.qwen_omni.qwen3_config import clip_tokens

    spec = model_spec_from_dir(directory)
    th = config.thinker_config
    a, v, t = th.audio_config, th.vision_config, th.text_config
    audio, vision, llm = spec.modules["audio"], spec.modules["vision"], spec.modules["llm"]
    assert (audio.kind, spec.modality("audio"), audio.feeds) == (ModuleKind.ENCODER, Modality.AUDIO, "llm")
    assert (audio.layers, audio.hidden, audio.heads, audio.ffn, audio.input_dim, audio.downsample) == (
        a.encoder_layers, a.d_model, a.encoder_attention_heads, a.encoder_ffn_dim, 4 * a.num_mel_bins, 1)  # fmt: skip
    window = clip_tokens(a.n_window_infer, a.n_window)  # HF's window: n_window_infer frames of full chunks
    assert (audio.clip_tokens, audio.window_tokens, audio.refuses("cp", 2) is not None) == (window, window, True)
    assert (vision.layers, vision.hidden, vision.heads, vision.ffn, vision.mlp_kind) == (
        v.depth, v.hidden_size, v.num_heads, v.intermediate_size, "gelu")  # fmt: skip
    assert vision.input_dim == v.in_channels * v.temporal_patch_size * v.patch_size**2
    assert vision.deepstack_blocks == tuple(v.deepstack_visual_indexes)
    assert (llm.layers, llm.hidden, llm.heads, llm.num_kv_heads, llm.vocab, llm.tied_embeddings) == (
        t.num_hidden_layers, t.hidden_size, t.num_attention_heads, t.num_key_value_heads, t.vocab_size,
        th.tie_word_embeddings)  # fmt: skip
    dense = tuple(i for i in range(t.num_hidden_layers) if i in t.mlp_only_layers or (i + 1) % t.decoder_sparse_step)
    assert (llm.experts, llm.top_k, llm.expert_ffn, llm.dense_blocks or ()) == (
        t.num_experts, t.num_experts_per_tok, t.moe_intermediate_size, dense)  # fmt: skip
    path = str(directory.resolve())
    assert [m.hf for m in (audio, vision, llm)] == [HFPart(path=path, part=p) for p in ("audio", "vision", "text")]


def test_tiny_config_gives_the_thinkers_modules(omni):
    check_against(omni, transformers.AutoConfig.from_pretrained(omni))


def test_class_defaults_are_transformers(tmp_path):
    """The reader's defaults are transformers' class defaults; a config.json naming nothing but its type is
    transformers' default text config, 28 heads of a 2048 width, refused naming the field."""
    from orch.runtime.models.qwen_omni.qwen3_config import _DEFAULTS

    m = transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe
    classes = {"qwen3_omni_moe_thinker": m.Qwen3OmniMoeThinkerConfig, "qwen3_omni_moe_text": m.Qwen3OmniMoeTextConfig,
               "qwen3_omni_moe_audio_encoder": m.Qwen3OmniMoeAudioEncoderConfig,
               "qwen3_omni_moe_vision_encoder": m.Qwen3OmniMoeVisionEncoderConfig}  # fmt: skip
    for key, defaults in _DEFAULTS.items():
        config = classes[key]()
        for field, value in defaults.items():
            got = getattr(config, field)
            assert (list(got) if isinstance(got, tuple) else got) == value, (key, field)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_omni_moe"}))
    with pytest.raises(SpecError, match="text_config.num_attention_heads: 28 heads do not divide hidden_size 2048"):
        model_spec_from_dir(tmp_path)


def test_the_published_30b_a3b_config_is_read(tmp_path):
    """bench/configs/qwen3_omni_30b_a3b (the `orch plan` table's input) as transformers reads the same file."""
    shutil.copytree(BENCH, tmp_path / "m")
    check_against(tmp_path / "m", transformers.AutoConfig.from_pretrained(tmp_path / "m"))
    audio = model_spec_from_dir(tmp_path / "m").modules["audio"]
    assert (audio.window_tokens, audio.input_dim) == (104, 512)  # 8 chunks of 13 tokens; 4 x 128 mel bins a row


@pytest.mark.parametrize(("field", "value"), [("n_window", 40), ("n_window_infer", 60), ("output_dim", 7)])
def test_bad_audio_fields_are_named(tmp_path, field, value):
    top = json.loads((BENCH / "config.json").read_text())
    top["thinker_config"]["audio_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(top))
    with pytest.raises(SpecError, match=f"thinker_config.audio_config.{field}"):
        model_spec_from_dir(tmp_path)


def test_clip_tokens_are_hfs_formula():
    """Every clip length up to 5 chunks: orch's count is `_get_feat_extract_output_lengths`, and `frames_for`
    gives the fewest frames of each count (a synthetic clip's)."""
    import torch
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import _get_feat_extract_output_lengths

    from orch.runtime.models.qwen_omni.qwen3_config import clip_tokens, frames_for
    from orch.runtime.models.qwen_omni.qwen3_media import Omni3Clips

    lengths = torch.arange(1, 501)
    want = _get_feat_extract_output_lengths(lengths, 50).tolist()
    assert [clip_tokens(n, 50) for n in lengths.tolist()] == want
    for n in range(1, 66):
        assert clip_tokens(frames_for(n, 50), 50) == n and clip_tokens(frames_for(n, 50) - 1, 50) < n
    assert Omni3Clips(50).tokens(16000, 16000) == 13  # 1 s: 100 frames, one full chunk
    with pytest.raises(ValueError, match="no audio token"):
        Omni3Clips(50).tokens(0, 16000)


@dataclass(frozen=True)
class Sound:
    clip: int
    rows: int


@dataclass(frozen=True)
class SoundingItem(MediaItem):
    sound: Sound | None = None


def omni_grids(omni):
    from orch.runtime.data.index import TokenRules
    from orch.runtime.models.qwen_omni.qwen3_media import Omni3Grids

    grids = next(r.grids for r in TokenRules.of(model_spec_from_dir(omni)).encoders if r.grids is not None)
    assert isinstance(grids, Omni3Grids) and grids.wrap == ("<|vision_start|>", "<|vision_end|>")
    assert grids.position_id_per_seconds == 13
    return grids


# (t, h, w, seconds per step, audio rows): audio past the video, video past the audio, a fractional step time
VIDEOS = [(4, 4, 4, 1.0, 60), (3, 4, 6, 2.0, 20), (8, 2, 2, 0.5, 33), (2, 4, 4, 1.0, 5)]


@pytest.mark.parametrize("video", VIDEOS)
def test_sound_chunks_are_the_processors(omni, video):
    """A video with its sound: the runs of video rows and audio rows orch places write the text
    Qwen3OmniMoeProcessor's `replace_video_with_audio_token` writes."""
    t, h, w, seconds, audio = video
    cls = transformers.Qwen3OmniMoeProcessor
    owner = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2), audio_bos_token="<a>",
                            audio_eos_token="</a>", video_token="V", audio_token="A")  # fmt: skip
    text = cls.replace_video_with_audio_token(
        owner, {"video_grid_thw": [[t, h, w]], "video_second_per_grid": [seconds]}, 0,
        {"num_audio_tokens": [audio]}, 0, position_id_per_seconds=13,
    )  # fmt: skip
    got = omni_grids(omni).sound_chunks(SoundingItem((t, h, w), seconds, Sound(0, audio)))
    assert text == "<a>" + "".join("V" * v + "A" * a for v, a in got) + "</a>"
    assert len(got) > 1


def hf_rope_index(config):
    """transformers' own `get_rope_index` of Qwen3-Omni, bound to a thinker config."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    cls = m.Qwen3OmniMoePreTrainedModelForConditionalGeneration
    owner = SimpleNamespace(config=config, spatial_merge_size=config.vision_config.spatial_merge_size)
    owner.get_llm_pos_ids_for_vision = lambda *a: cls.get_llm_pos_ids_for_vision(owner, *a)
    return lambda **kw: cls.get_rope_index(owner, **kw)


@pytest.mark.parametrize("video", [v for v in VIDEOS if (v[3] * 13).is_integer()])
def test_positions_are_hfs_get_rope_index(omni, video):
    """Text, an image, a clip and a video used with its own audio (its rows and its clip's merged by time) in one
    sequence: orch's TMRoPE positions equal HF's `get_rope_index(use_audio_in_video=True)`, the video's bos pair
    and eos pair one position a token."""
    import torch

    from orch.runtime.models.qwen_omni.qwen3_config import clip_tokens, frames_for
    from orch.runtime.sample import SequenceLayout

    family = __import__("orch.runtime.models.registry", fromlist=["FAMILIES"]).FAMILIES["qwen3_omni_moe"]
    positions = family.layout_positions(model_spec_from_dir(omni))
    config = transformers.AutoConfig.from_pretrained(omni).thinker_config
    t, h, w, seconds, audio = video
    frames = frames_for(audio, 50)
    image = MediaItem((1, 4, 6))
    sounding = SoundingItem((t, h, w), seconds, Sound(1, audio))
    plain_frames = 230
    plain = clip_tokens(plain_frames, 50)
    seq, text, inserts = [], [], []
    vision_first = plain + audio  # the prefix: the clips' rows (placeholder order), then the vision items'
    vs, ab = config.vision_start_token_id, config.audio_start_token_id

    def token(tok):
        text.append(len(text))
        seq.append(tok)

    def rows(tok, n, first):
        inserts.append((len(text), first, n))
        seq.extend([tok] * n)

    for _ in range(3):
        token(7)
    token(vs), rows(config.image_token_id, 6, vision_first), token(vs + 1)
    token(7)
    token(ab), rows(config.audio_token_id, plain, 0), token(ab + 1)
    token(vs), token(ab)
    v_at, a_at = vision_first + 6, plain
    for v, a in omni_grids(omni).sound_chunks(sounding):
        if v:
            rows(config.video_token_id, v, v_at)
        if a:
            rows(config.audio_token_id, a, a_at)
        v_at, a_at = v_at + v, a_at + a
    token(ab + 1), token(vs + 1)
    for _ in range(2):
        token(7)
    layout = SequenceLayout.interleaved(plain + audio + 6 + t * h * w // 4, len(text), inserts)
    got = positions(layout, (image, sounding))
    want, _ = hf_rope_index(config)(
        input_ids=torch.tensor([seq]),
        image_grid_thw=torch.tensor([image.grid]),
        video_grid_thw=torch.tensor([sounding.grid]),
        attention_mask=torch.ones(1, len(seq), dtype=torch.long),
        use_audio_in_video=True,
        audio_seqlens=torch.tensor([plain_frames, frames]),
        second_per_grids=torch.tensor([seconds]),
    )
    assert torch.equal(got.double(), want[:, 0].double())


def test_a_short_clip_gives_the_same_wherever_it_runs(omni):
    """A clip under one chunk (81 frames), alone and beside longer clips: orch's encoder gives what HF's gives it
    in a call holding a full chunk (HF alone pads its chunk less, and its convs read that padding), the same
    both ways."""
    import torch

    from orch.runtime.models.qwen_omni.qwen3_audio import Omni3AudioTower

    full = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni, dtype=torch.float64)
    hf = full.thinker
    tower = Omni3AudioTower(hf.model.audio_tower, hf.config)
    torch.manual_seed(0)
    short, long = torch.randn(81, 16, dtype=torch.float64), torch.randn(230, 16, dtype=torch.float64)

    def rows(*clips):  # the clips as orch's data gives them: 4 frames a row, 2 rows a token, a length row
        out, items = [], []
        for c in clips:
            n = 2 * -(-c.shape[0] // 8)
            packed = torch.cat([c, c.new_zeros(4 * n - c.shape[0], 16)]).reshape(n, 64)
            out.append(torch.cat([packed, packed.new_full((1, 64), float(c.shape[0]))]))
            items.append(MediaItem((1, 1, n + 1)))
        return torch.cat(out), [sum(r.shape[0] for r in out) // 2], [items]

    alone = tower(*rows(short)[:2], items=rows(short)[2])[:, :48]
    beside = tower(*rows(long, short)[:2], items=rows(long, short)[2])[-alone.shape[0] :, :48]
    both = hf.model.audio_tower(torch.cat([short, long]).t(), feature_lens=torch.tensor([81, 230])).last_hidden_state
    assert torch.allclose(alone, beside, rtol=0, atol=1e-12)
    assert torch.allclose(alone, both[: alone.shape[0]], rtol=0, atol=1e-12)
    hf_alone = hf.model.audio_tower(short.t(), feature_lens=torch.tensor([81])).last_hidden_state
    assert not torch.allclose(hf_alone, alone, rtol=0, atol=1e-9)  # why orch fixes the padding


# clip lengths of 100, 102, 230 and 73 log-mel frames: a whole chunk, past one, past two, under one
CLIPS = [16000, 16161, 36800, 11530]


@pytest.mark.parametrize("kind", ["audio", "image_audio"])
def test_inspect_ids_and_inputs_are_the_processors(cli, omni, tmp_path, kind):
    """`orch data inspect --json`'s input_ids are Qwen3OmniMoeProcessor's on the rendered conversation (`<image>`
    -> `<|vision_start|><|image_pad|><|vision_end|>`, `<audio>` -> `<|audio_start|><|audio_pad|><|audio_end|>`),
    and each encoder's inputs are the processor's: the image's patch rows its pixel_values, a clip's unpacked
    real frames its input_features where its feature_attention_mask is set."""
    import numpy as np
    import soundfile
    import torch
    from PIL import Image
    from qwen3_omni_models import make_processor

    from orch.runtime.data.index import TokenRules
    from orch.runtime.data.media import media_processors
    from orch.runtime.models.qwen_omni.qwen3_audio import Omni3AudioTower

    messages = [
        {"role": "user", "content": "<audio><audio>transcribe"},
        {"role": "assistant", "content": "a red"},
        {"role": "user", "content": "and <audio> then <audio>"},
        {"role": "assistant", "content": "200"},
    ]
    n_images = 0
    if kind == "image_audio":
        messages[0]["content"] = "<image>what is <audio> in the picture <audio>?"
        n_images = 1
    rng = np.random.default_rng(0)
    if n_images:
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(tmp_path / "0.png")
    waves = []
    for i, n in enumerate(CLIPS):
        waves.append((0.3 * np.random.default_rng(i).standard_normal(n)).astype(np.float32))
        soundfile.write(tmp_path / f"{i}.wav", waves[-1], 16000, subtype="FLOAT")
    record = {"messages": messages, "images": ["0.png"][:n_images], "audios": [f"{i}.wav" for i in range(4)]}
    (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n")
    r = cli("data", "inspect", str(tmp_path / "d.jsonl"), "--model", str(omni), "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output[r.output.index("{") :])["input_ids"]

    processor = make_processor(transformers.AutoTokenizer.from_pretrained(omni))
    tags = {"<image>": "<|vision_start|><|image_pad|><|vision_end|>",
            "<audio>": "<|audio_start|><|audio_pad|><|audio_end|>"}  # fmt: skip
    rendered = [{**m, "content": m["content"].replace("<image>", tags["<image>"]).replace("<audio>", tags["<audio>"])}
                for m in messages]  # fmt: skip
    text = processor.apply_chat_template(rendered, tokenize=False)
    images = [Image.open(tmp_path / "0.png").convert("RGB")] if n_images else None
    out = processor(text=text, images=images, audio=waves, sampling_rate=16000, return_tensors="np")
    assert got == out["input_ids"][0].tolist()

    spec = model_spec_from_dir(omni)
    rules = {r.name: r for r in TokenRules.of(spec).encoders}
    procs = media_processors(spec)
    if n_images:
        rows = procs["vision"].inputs((str(tmp_path / "0.png"),), rules["vision"], 1024, kinds=("<image>",))
        assert np.allclose(torch.cat(rows).numpy(), out["pixel_values"], rtol=0, atol=1e-6)
    clips = procs["audio"].inputs(tuple(str(tmp_path / f"{i}.wav") for i in range(4)), rules["audio"], 1024)
    real = Omni3AudioTower.clips(SimpleNamespace(mels=16), torch.cat(clips), [0] * 4,
                                 [[MediaItem((1, 1, c.shape[0]))] for c in clips])  # fmt: skip
    for frames, features, mask in zip(real, out["input_features"], out["feature_attention_mask"], strict=True):
        assert frames.shape[0] == mask.sum() and np.array_equal(frames.numpy(), features[:, : mask.sum()].T)


@pytest.mark.parametrize("shape", ["llamafactory", "own_track"])
def test_a_data_files_sounding_videos_positions_are_hfs(cli, omni, tmp_path, shape):
    """A data file's video with its sound (LLaMA-Factory's `<video><audio>` pair, or the video's own track) through
    the data path: the batch's TMRoPE positions equal HF's `get_rope_index(use_audio_in_video=True)` on the
    input_ids `orch data inspect --use-audio-in-video` gives."""
    import math

    import torch
    from sounding_media import pcm, write_sounding_video, write_wav

    from orch.cli.data_cmd import conversation_data
    from orch.runtime.data.source import ConversationData
    from orch.runtime.models.registry import load_model

    sound = pcm(5.0)
    write_sounding_video(tmp_path / "v.mkv", frames=10, fps=2, sound=sound, size=(56, 56))
    write_wav(tmp_path / "v.wav", sound)
    user = "<video><audio>what does she say?" if shape == "llamafactory" else "<video>what does she say?"
    record = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "hello"}],
              "videos": ["v.mkv"], **({"audios": ["v.wav"]} if shape == "llamafactory" else {})}  # fmt: skip
    (tmp_path / "d.jsonl").write_text(json.dumps(record) + "\n")
    r = cli("data", "inspect", str(tmp_path / "d.jsonl"), "--model", str(omni), "--json", "--use-audio-in-video")
    assert r.exit_code == 0, r.output
    ids = json.loads(r.output[r.output.index("{") :])["input_ids"]
    model = load_model(str(omni))
    spec = conversation_data(model, str(tmp_path / "d.jsonl"), 1, None, None, use_audio_in_video=True)[0]
    batch = ConversationData(model, spec).batch(0, 0)
    (video,) = batch.items("vision", 0)
    assert video.sound is not None and video.sound.rows == ids.count(transformers.AutoConfig.from_pretrained(
        omni).thinker_config.audio_token_id)  # fmt: skip
    config = transformers.AutoConfig.from_pretrained(omni).thinker_config
    want, _ = hf_rope_index(config)(
        input_ids=torch.tensor([ids]),
        video_grid_thw=torch.tensor([video.grid]),
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
        use_audio_in_video=True,
        audio_seqlens=torch.tensor([math.ceil(sound.shape[1] / 160)]),
        second_per_grids=torch.tensor([video.seconds]),
    )
    assert torch.equal(batch.layout(0).positions.double(), want[:, 0].double())


def test_experts_stored_one_tensor_each_are_read_stacked(omni, tmp_path):
    """The hub's layout of Qwen3-Omni's experts (`experts.N.gate_proj/up_proj/down_proj`): orch reads a region of
    the stacked parameter (one EP rank's experts, a row range across gate and up) equal to transformers' loaded
    tensor, and a checkpoint missing one expert's piece is refused naming it."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from orch.runtime.models.hf.build import build_full
    from orch.runtime.models.hf.weights import Checkpoint, read_experts

    full = build_full(str(omni))
    name = "thinker.model.language_model.layers.0.mlp.experts.gate_up_proj"
    located = Checkpoint.of(omni, full).tensors[name]
    assert located.experts is not None and len(located.stored()) == 8  # 4 experts, gate and up each
    with safe_open(str(omni / "model.safetensors"), framework="pt") as f:
        got = read_experts(located, (slice(2, 4), slice(15, 27), slice(0, 48)), lambda _: f)
    loaded = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(omni, dtype=torch.float32)
    want = loaded.thinker.model.language_model.layers[0].mlp.experts.gate_up_proj[2:4, 15:27]
    assert torch.equal(got, want.detach())
    tensors = load_file(omni / "model.safetensors")
    del tensors["thinker.model.layers.0.mlp.experts.3.up_proj.weight"]
    (tmp_path / "config.json").write_text((omni / "config.json").read_text())
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SpecError, match="expert 3: piece 1 of 2 is not in the model's safetensors"):
        Checkpoint.of(tmp_path, full)


def test_orch_profile_times_both_towers_real_blocks(omni):
    """`orch profile`'s block cases (runtime/models/hf/parts.py) of the thinker: the audio encoder's first block
    attending within each window of 26 tokens (2 chunks) of each sample, the vision tower's first block, and the
    bare audio module on a synthetic clip (its LLM rows with zeros where an image row has deepstack features)."""
    import torch

    from orch.runtime.models.hf.parts import bare_module, layer_case

    spec = model_spec_from_dir(omni)
    case = layer_case(spec, "audio", torch.float64, torch.device("cpu"), 0, None)
    layer = case.module.audio_tower.layers[0]
    assert type(layer).__name__ == "Qwen3OmniMoeAudioEncoderLayer" and len(case.module.audio_tower.layers) == 1
    x = torch.randn(70, spec.modules["audio"].hidden, dtype=torch.float64)
    parts = [layer(c, cu_seqlens=torch.tensor([0, c.shape[0]], dtype=torch.int32))[0] for c in x.split([26, 4, 26, 14])]
    assert torch.allclose(case(x, [30, 40]), torch.cat(parts), rtol=0, atol=1e-12)
    vision = layer_case(spec, "vision", torch.float64, torch.device("cpu"), 0, None)
    assert vision(torch.randn(32, spec.modules["vision"].hidden, dtype=torch.float64), [16, 16]).shape == (32, 32)
    bare = bare_module(spec, "audio", torch.float64, torch.device("cpu"), 0, None)
    out = bare(torch.randn(2 * 24, 64, dtype=torch.float64), [24])
    assert out.shape == (24, 2 * spec.llm.hidden) and not out[:, spec.llm.hidden :].any()


def test_the_tiny_model_is_its_seeds_whatever_memory_held_before(tmp_path):
    """transformers' _init_weights leaves the talker's experts as torch.empty gave them: the tiny model's saved
    talker held whatever freed memory held (a NaN after the family matrix had run, which no equality holds), so
    the builder initialises them from its seed. Freed memory filled with NaN first, then two builds."""
    import torch
    from safetensors.torch import load_file

    for rows in (16, 32, 40, 48, 64):
        for _ in range(8):
            torch.full((4, rows, 32), float("nan"))  # freed at once: the next torch.empty of its size reuses it
    first = load_file(make_qwen3_omni(tmp_path / "a") / "model.safetensors")
    second = load_file(make_qwen3_omni(tmp_path / "b") / "model.safetensors")
    assert [k for k, v in first.items() if v.is_floating_point() and not v.isfinite().all()] == []
    assert [k for k, v in first.items() if not v.equal(second[k])] == []
