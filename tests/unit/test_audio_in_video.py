"""Videos with their sound (`use_audio_in_video`, runtime/data/audio_in_video.py): a video's audio track decoded by
PyAV equal to soundfile's decode of the same samples, clip lengths from container headers, the setting's precedence
(record > mix source > flag > false), LLaMA-Factory's `<video><audio>` pairing and a video's own track, the sound
reaching the family (the video's MediaItem, its clip among the audio encoder's, the rows placed where the video
stood, chunk by chunk where the family's rule says), and bad input skipped and counted as `orch data index` and
`orch data inspect` print it. Media are generated: lossless PCM in Matroska and QuickTime, so decodes are exact."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sounding_media import make_sounding_model, pcm, write_sounding_video, write_wav

from orch.runtime.data.conversations import Conversation, parse_sample, read_conversations, read_sources
from orch.runtime.data.data_files import Source
from orch.runtime.sample import MEL_RATE, SOUNDING_VIDEO, Sound, soundfile_frames, waveform_16k
from orch.runtime.sound import NO_AUDIO_TRACK, clip_frames, track_waveform


def _turn(user: str, **media) -> dict:
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": "a guitar"}], **media}


def _write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize("suffix", [".mkv", ".mov"])
@pytest.mark.parametrize("channels", [1, 2])
def test_a_videos_track_decodes_as_soundfile_reads_the_same_samples(tmp_path, suffix, channels):
    """PCM in a video container, decoded by PyAV and averaged to mono at 16 kHz, equals soundfile's reading of the
    same samples as WAV, exactly; the header gives its length without decoding."""
    sound = pcm(1.5, channels=channels, seed=channels)
    video = write_sounding_video(tmp_path / f"v{suffix}", frames=6, fps=4, sound=sound)
    wav = write_wav(tmp_path / "v.wav", sound)
    assert clip_frames(str(video)) == soundfile_frames(str(wav)) == (sound.shape[1], 16000)
    assert soundfile_frames(str(video)) == (sound.shape[1], 16000)
    got, want = waveform_16k(str(video)), waveform_16k(str(wav))
    assert got.dtype == want.dtype == torch.float32 and torch.equal(got, want)


@pytest.mark.parametrize(
    ("suffix", "rate", "seconds"), [(".mkv", 8000, 1.25), (".mov", 44100, 0.75), (".mkv", 48000, 2.0)]
)
def test_durations_from_headers_and_resampling_to_the_extractors_rate(tmp_path, suffix, rate, seconds):
    """A track at another rate: its (samples, rate) from the header (a Matroska stream's DURATION tag, QuickTime's
    stream duration), and its waveform at the extractor's rate has the samples the index counts from that header
    (`round(samples * 16000 / rate)`), resampled by PyAV: a 440 Hz tone stays a 440 Hz tone."""
    t = np.arange(round(seconds * rate)) / rate
    tone = (12000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)[None]
    video = write_sounding_video(tmp_path / f"v{suffix}", frames=round(seconds * 4), fps=4, sound=tone, rate=rate)
    assert clip_frames(str(video)) == (tone.shape[1], rate)
    wave = track_waveform(str(video), MEL_RATE)
    assert wave.shape == (round(tone.shape[1] * MEL_RATE / rate),)
    spectrum = np.abs(np.fft.rfft(wave))
    assert abs(np.argmax(spectrum) * MEL_RATE / wave.size - 440) < 2.0 / seconds


def test_a_silent_video_has_no_track_and_an_unknown_codec_will_not_decode(tmp_path):
    silent = write_sounding_video(tmp_path / "silent.mkv", sound=None)
    with pytest.raises(ValueError, match=NO_AUDIO_TRACK):
        clip_frames(str(silent))
    broken = _unknown_codec(write_sounding_video(tmp_path / "v.mkv", sound=pcm(1.0)), tmp_path / "bad.mkv")
    with pytest.raises(ValueError, match="its audio track will not decode"):
        clip_frames(str(broken))


def _unknown_codec(video: Path, out: Path) -> Path:
    """The Matroska file with its audio track's codec id renamed to one no FFmpeg knows (same length)."""
    data = video.read_bytes()
    assert data.count(b"A_PCM/INT/LIT") == 1
    out.write_bytes(data.replace(b"A_PCM/INT/LIT", b"A_QQQ/INT/LIT"))
    return out


def test_pairing_as_llamafactory_and_a_videos_own_track(tmp_path):
    """Under the setting: `<video><audio>` with `audios` (LLaMA-Factory's mllm_video_audio_demo.json) gives the
    video the audio file and takes the `<audio>` out of the text; a `<video>` alone, or followed by an `<audio>`
    without a file (Hugging Face's empty audio part), takes the video's own track; other `<audio>`s stay clips.
    Without the setting nothing is paired."""
    base = tmp_path

    def parsed(record, on=True):
        got = parse_sample(record, "d.jsonl:1", base, use_audio_in_video=on)
        assert isinstance(got, Conversation), got
        return got

    lf = parsed(_turn("<video><audio>What is the video describing?", videos=["4.mp4"], audios=["4.mp3"]))
    assert lf.messages[0] == ("user", "<video>What is the video describing?")
    assert lf.audios == () and lf.video_sounds == (str(base / "4.mp3"),)
    assert lf.clips() == (("videos[0] audio", str(base / "4.mp3")),)
    own = parsed(_turn("<video>What does she say?", videos=["4.mp4"]))
    assert own.video_sounds == (str(base / "4.mp4"),)
    hf = parsed(_turn("<video><audio> and <audio>?", videos=["4.mp4"], audios=["x.wav"]))
    assert hf.messages[0][1] == "<video> and <audio>?" and hf.video_sounds == (str(base / "4.mp4"),)
    assert hf.clips() == (("videos[0] audio", str(base / "4.mp4")), ("audios[0]", str(base / "x.wav")))
    two = parsed(_turn("<audio> first, <video><audio>, <video>", videos=["a.mp4", "b.mp4"], audios=["x.wav", "a.wav"]))
    assert two.video_sounds == (str(base / "a.wav"), str(base / "b.mp4")) and two.audios == (str(base / "x.wav"),)
    assert [what for what, _ in two.clips()] == ["audios[0]", "videos[0] audio", "videos[1] audio"]
    off = parsed(_turn("<video><audio>hi", videos=["4.mp4"], audios=["4.mp3"]), on=False)
    assert off.video_sounds == () and off.audios == (str(base / "4.mp3"),)


def test_the_setting_a_record_its_source_and_the_flag(tmp_path):
    """A record's own key wins over its source's (a mix file's), a source's over the command's flag, the flag over
    the default (false); a key that is not a boolean is a malformed sample."""
    records = [_turn("<video>hi", videos=["v.mp4"], use_audio_in_video=True),
               _turn("<video>hi", videos=["v.mp4"], use_audio_in_video=False),
               _turn("<video>hi", videos=["v.mp4"]),
               _turn("<video>hi", videos=["v.mp4"], use_audio_in_video="yes")]  # fmt: skip
    data = _write(tmp_path / "d.jsonl", records)

    def sounding(source):
        got = list(read_conversations(str(data), source))
        assert not isinstance(got[3], Conversation) and "use_audio_in_video: expected true or false" in got[3].what
        return [bool(c.video_sounds) for c in got[:3]]

    assert sounding(None) == [True, False, False]  # the default: false
    assert sounding(Source(str(data), use_audio_in_video=True)) == [True, False, True]
    assert sounding(Source(str(data), use_audio_in_video=False)) == [True, False, False]
    mix = tmp_path / "mix.yaml"
    mix.write_text("sources:\n  - {path: d.jsonl, use_audio_in_video: true}\n  - {path: d.jsonl}\n")
    assert [s.use_audio_in_video for s in read_sources(str(mix))] == [True, None]
    mix.write_text("sources:\n  - {path: d.jsonl, use_audio_in_video: 1}\n")
    with pytest.raises(Exception, match=r"sources\[0\]\.use_audio_in_video.*expected true or false"):
        read_sources(str(mix))


@pytest.fixture(scope="module")
def sounding(tmp_path_factory):
    """A model with a video-taking vision tower and an audio tower, and a data folder: a video with its sound also
    as WAV (LLaMA-Factory's pair), a silent video, a video whose track will not decode, a cut one."""
    root = tmp_path_factory.mktemp("sounding")
    model = make_sounding_model(root / "model")
    media = root / "data"
    sound = pcm(2.0)
    write_sounding_video(media / "v.mkv", frames=8, fps=4, sound=sound)
    write_wav(media / "v.wav", sound)
    write_sounding_video(media / "silent.mkv", frames=8, fps=4, sound=None)
    _unknown_codec(media / "v.mkv", media / "bad.mkv")
    write_wav(media / "blip.wav", pcm(0.004, seed=3))  # 64 samples: not one 10 ms log-mel frame
    return root, model, media


def _index(model, data, **kw):
    from orch.runtime.data.index import build_index

    return build_index(str(data), model, **kw)


def test_the_precedence_reaches_the_index(sounding, tmp_path):
    """Through `build_index`: the flag is the setting of sources that name none; a mix source's own setting wins over
    it; a record's key over both. A sounding video's clip is counted for the audio tower (2 s: 50 LLM tokens of
    the tiny Qwen2-Audio tower, 100 encoder tokens) and its tokens in the LLM's."""
    _, model, media = sounding
    records = [_turn("<video>hi", videos=["v.mkv"]), _turn("<video>hi", videos=["v.mkv"], use_audio_in_video=False),
               _turn("<video>hi", videos=["v.mkv"], use_audio_in_video=True)]  # fmt: skip
    _write(media / "p.jsonl", records)
    (media / "mix.yaml").write_text("sources:\n  - {path: p.jsonl, use_audio_in_video: false}\n  - {path: p.jsonl}\n")
    from orch.planner.data import read_manifest

    def audio(data, **kw):
        idx = _index(model, data, index_dir=str(tmp_path / "idx"), **kw)
        return [dict(r)["audio"] for r in read_manifest(idx.manifest)]

    assert audio(media / "p.jsonl") == [0, 0, 100]
    assert audio(media / "p.jsonl", use_audio_in_video=True) == [100, 0, 100]
    assert audio(media / "mix.yaml", use_audio_in_video=True) == [0, 0, 100, 100, 0, 100]
    assert audio(media / "mix.yaml") == [0, 0, 100, 0, 0, 100]


def _no_positions(monkeypatch):
    """The test model's LLM is Qwen2.5-VL's, whose M-RoPE knows no audio rows (an omni family's positions do)."""
    from orch.runtime.models.qwen_vl.family import QwenVL

    monkeypatch.setattr(QwenVL, "layout_positions", lambda self, model: None)


def _batch(model, manifest, data, size):
    from orch.planner.specs import DataSpec
    from orch.runtime.data.source import ConversationData

    spec = DataSpec(name="d", global_batch=size, seq_len=4096, manifest=manifest, source=str(data))
    source = ConversationData(model, spec)
    return source, source.batch(0, 0)


def test_a_sounding_videos_rows_reach_the_family(sounding, monkeypatch):
    """LLaMA-Factory's pair and a video's own track give the same sample: the video's item carries its `Sound` (its
    clip, the audio tower's first, of 50 LLM rows), the audio tower takes the clip's rows decoded from the WAV or
    from the video's track (equal), and the layout puts the video's 8 rows, then its sound's 50, where the
    `<video>` stood, inside `<|vision_start|>` + the audio wrap."""
    _, model, media = sounding
    _no_positions(monkeypatch)
    data = _write(media / "r.jsonl", [_turn("<video><audio>What?", videos=["v.mkv"], audios=["v.wav"]),
                                      _turn("<video>What?", videos=["v.mkv"])])  # fmt: skip
    idx = _index(model, data, use_audio_in_video=True)
    source, batch = _batch(model, idx.manifest, data, 2)
    by_row = {row: i for i, row in enumerate(batch.rows)}
    samples = [batch.sample(by_row[r], torch.float64) for r in (0, 1)]
    assert torch.equal(samples[0].feats["audio"], samples[1].feats["audio"]) and samples[0].feats["audio"].shape[0]
    for r in (0, 1):
        i = by_row[r]
        (video,) = batch.items("vision", i)
        assert video.sound == Sound(clip=0, rows=50) and video.grid == (2, 4, 4)
        layout = batch.layout(i)
        text = source.text(r)
        (at, tag), = text.marks  # fmt: skip
        assert tag == SOUNDING_VIDEO and layout.prefix == 8 + 50
        # the prefix is the audio tower's rows (0..49), then the vision tower's (50..57): placed video first
        assert layout.source[at : at + 58].tolist() == [*range(50, 58), *range(0, 50)]
    rendering = source.counter.render(source.conversation(0))
    (at, _), = rendering.marks  # fmt: skip
    text = rendering.text
    assert text[:at].endswith("<|vision_start|><|audio_bos|>") and text[at:].startswith("<|audio_eos|><|vision_end|>")


def test_the_familys_chunks_interleave_video_and_sound(sounding, monkeypatch):
    """Where the vision tower's rule gives `sound_chunks` (Qwen-Omni's seconds_per_chunk), the video's rows and its
    sound's alternate chunk by chunk, each in order; `orch data inspect --json`'s input_ids say so."""
    from orch.runtime.models.qwen_vl.media import VisionGrids

    _, model, media = sounding
    _no_positions(monkeypatch)
    seen = []

    def chunks(self, item):
        seen.append(item)
        return [(4, 20), (4, 30)]  # two temporal steps of 4 rows, 0.8 s and 1.2 s of sound

    monkeypatch.setattr(VisionGrids, "sound_chunks", chunks, raising=False)
    data = _write(media / "c.jsonl", [_turn("<video>What?", videos=["v.mkv"])])
    idx = _index(model, data, use_audio_in_video=True)
    _, batch = _batch(model, idx.manifest, data, 1)
    layout = batch.layout(0)
    at = int(torch.nonzero(layout.source == 50)[0])  # the video's first row (the prefix: audio 0..49, vision 50..57)
    want = [*range(50, 54), *range(0, 20), *range(54, 58), *range(20, 50)]
    assert layout.source[at : at + 58].tolist() == want
    assert seen and seen[-1].sound == Sound(clip=0, rows=50)


def test_bad_sound_is_skipped_and_counted_as_orch_data_index_prints_it(sounding, cli, monkeypatch):
    """A video whose track will not decode, a clip too short for one chunk of its encoder, more `<audio>`
    placeholders than clips: each skipped and named `file:line: what`; a video without an audio track trains as its
    video alone, one warning each and a count; the run goes on (exit 0)."""
    root, model, media = sounding
    import orch.runtime.models.registry as registry

    monkeypatch.setattr(registry, "load_model", lambda ref: model)
    data = _write(media / "bad.jsonl", [
        _turn("<video>fine", videos=["v.mkv"]),
        _turn("<video>broken", videos=["bad.mkv"]),
        _turn("<audio>short", audios=["blip.wav"]),
        _turn("<video><audio> and <audio> and <audio>", videos=["v.mkv"], audios=["v.wav"]),
        _turn("<video>silent", videos=["silent.mkv"]),
    ])  # fmt: skip
    r = cli("data", "index", str(data), "--model", "omni", "--use-audio-in-video")
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    bad, blip, silent = media / "bad.mkv", media / "blip.wav", media / "silent.mkv"
    assert lines == [
        f"warning: bad.jsonl:2: videos[0] audio: {bad}: its audio track will not decode (no decoder for its codec)",
        f"warning: bad.jsonl:3: audios[0]: {blip}: too short for one chunk of its encoder: 0.004 s (64 samples at "
        "16000 Hz) make no audio token",
        "warning: bad.jsonl:4: 1 audios for 3 <audio> placeholders (1 after a <video>, use_audio_in_video: its "
        "sound, from audios or else the video's own track)",
        "warning: 3 samples skipped: 3 malformed (--strict: exit 1)",
        f"warning: bad.jsonl:5: videos[0]: {silent}: no audio track: its video alone (use_audio_in_video)",
        "warning: 1 videos without an audio track trained as their video alone (use_audio_in_video)",
    ]
    r = cli("data", "inspect", str(data), "--model", "omni", "--sample", "2", "--use-audio-in-video")
    assert r.exit_code != 0 and r.stderr.strip().splitlines() == [
        f"error: bad.jsonl:2: cannot read its media: {bad}: its audio track will not decode (no decoder for its codec)"
    ]
    _no_positions(monkeypatch)
    r = cli("data", "inspect", str(data), "--model", "omni", "--sample", "5", "--use-audio-in-video", "--json")
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines()[0] == (
        f"warning: bad.jsonl:5: videos[0]: {silent}: no audio track: its video alone (use_audio_in_video)"
    )
    shown = json.loads(r.stdout)
    assert shown["encoder_inputs"]["audio"][0] == 0 and shown["encoder_inputs"]["vision"][0] == 32


def test_a_track_that_stops_decoding_masks_its_sample_and_is_counted(sounding, tmp_path):
    """A file whose header reads but whose audio data is cut: indexed from the header, then its decode fails where
    a rank loads it: the sample is masked and named in data_problems.jsonl (`file:line`), never the end of a run."""
    from orch.runtime.data.problems import DataProblems, read_problems

    _, model, media = sounding
    cut = media / "cut.mkv"
    cut.write_bytes((media / "v.mkv").read_bytes()[:6000])
    data = _write(media / "cut.jsonl", [_turn("<video>cut", videos=["cut.mkv"])])
    idx = _index(model, data, use_audio_in_video=True)
    assert not idx.bad and idx.samples == 1  # its header reads: indexed
    from orch.planner.specs import DataSpec
    from orch.runtime.data.source import ConversationData

    spec = DataSpec(name="d", global_batch=1, seq_len=4096, manifest=idx.manifest, source=str(data))
    problems = DataProblems(str(tmp_path / "data_problems.jsonl"))
    source = ConversationData(model, spec, problems)
    assert source.decode(0, ("audio",)) is None
    (problem,) = read_problems(str(tmp_path / "data_problems.jsonl"))
    assert (problem["file"], problem["line"], problem["action"]) == ("cut.jsonl", 1, "masked")
    assert problem["medium"] == str(cut) and "its audio track decodes to 0.00 s of the 2.00 s" in problem["error"]


def test_a_video_whose_sound_outlasts_its_frames_counts_its_own_frames(tmp_path):
    """Matroska keeps no frame count: a video's frames come from its own stream's duration (its DURATION tag), not
    the container's, which a longer audio track sets (8 frames at 4 fps with 2.6 s of sound: 8, not 10, so the
    frames its header promises are the frames that decode)."""
    import av

    from orch.runtime.models.qwen_vl.media import video_header

    video = write_sounding_video(tmp_path / "v.mkv", frames=8, fps=4, sound=pcm(2.6))
    with av.open(str(video)) as container:
        decoded = sum(1 for _ in container.decode(video=0))
    assert video_header(str(video)).frames == decoded == 8


def test_orch_plan_takes_the_flag(sounding, cli, monkeypatch, tmp_path):
    """`orch plan --data ... --use-audio-in-video` plans on an index counting each video's sound for the audio tower,
    and says how many videos had none."""
    from orch.planner.data import read_manifest

    _, model, media = sounding
    import orch.runtime.models.registry as registry

    monkeypatch.setattr(registry, "load_model", lambda ref: model)
    data = _write(
        media / "plan.jsonl", [_turn("<video>hi", videos=["v.mkv"]), _turn("<video>hi", videos=["silent.mkv"])]
    )
    out = tmp_path / "plan.yaml"
    for flag, audio in (([], [0, 0]), (["--use-audio-in-video"], [100, 0])):
        r = cli("plan", "--model", "omni", "--cluster", "local-cpu", "--data", str(data), "--out", str(out),
                "--time-limit", "2", *flag)  # fmt: skip
        assert r.exit_code == 0, r.output
        import yaml

        manifest = yaml.safe_load(out.read_text())["data"]["manifest"]
        assert [dict(row)["audio"] for row in read_manifest(manifest)] == audio
    assert "1 videos without an audio track trained as their video alone" in " ".join(r.output.split())


def test_a_clip_its_familys_rule_refuses_is_a_bad_sample(sounding, monkeypatch):
    """A family's clip rule may refuse a clip too short for one of its tokens with a ValueError (Qwen2.5-Omni's:
    under 3 log-mel frames): the sample is skipped and named, the index goes on."""
    from orch.runtime.models.qwen2_audio.media import ClipTokens

    _, model, media = sounding

    def refusing(self, num_samples, rate):
        frames = self.frames(num_samples, rate)
        if frames < 3:
            raise ValueError(f"a clip of {frames} log-mel frames is too short for one audio token")
        return 1

    monkeypatch.setattr(ClipTokens, "llm_tokens", refusing)
    write_wav(media / "short.wav", pcm(0.02, seed=4))
    data = _write(
        media / "refused.jsonl", [_turn("<audio>hi", audios=["short.wav"]), _turn("<audio>hi", audios=["v.wav"])]
    )
    idx = _index(model, data)
    assert idx.samples == 1 and idx.bad == [
        f"refused.jsonl:1: audios[0]: {media / 'short.wav'}: a clip of 2 log-mel frames is too short for one audio token"
    ]
