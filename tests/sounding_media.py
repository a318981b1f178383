"""Media with sound for the use_audio_in_video tests, written with PyAV and soundfile: a video with or without an
audio track (lossless PCM in Matroska / QuickTime, so a decode is exact), the same samples as a WAV file, and a
model whose vision tower takes videos (Qwen2.5-VL) and whose audio tower takes clips (Qwen2-Audio's), the pair
an omni model has."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def pcm(seconds: float, rate: int = 16000, channels: int = 2, seed: int = 0) -> np.ndarray:
    """[channels, samples] int16 noise of `seconds` at `rate`."""
    rng = np.random.default_rng(seed)
    return rng.integers(-20000, 20000, (channels, round(seconds * rate))).astype(np.int16)


def write_sounding_video(
    path: Path,
    frames: int = 8,
    fps: int = 4,
    sound: np.ndarray | None = None,
    rate: int = 16000,
    codec: str = "pcm_s16le",
    size: tuple[int, int] = (56, 56),
) -> Path:
    """A video of `frames` frames at `fps` (.mkv, .mov or .mp4 by its suffix) with `sound` ([channels, samples]
    int16 at `rate`) as its audio track, or none."""
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    width, height = size
    rng = np.random.default_rng(frames)
    base = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    with av.open(str(path), "w") as out:
        video = out.add_stream("mpeg4", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        audio = None
        if sound is not None:
            audio = out.add_stream(codec, rate=rate)
            audio.layout = "stereo" if sound.shape[0] == 2 else "mono"
        for i in range(frames):
            for packet in video.encode(av.VideoFrame.from_ndarray(np.roll(base, 3 * i, axis=1), format="rgb24")):
                out.mux(packet)
        if audio is not None:
            layout = "stereo" if sound.shape[0] == 2 else "mono"
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(sound.T.reshape(1, -1)), format="s16", layout=layout
            )
            frame.sample_rate = rate
            for packet in audio.encode(frame):
                out.mux(packet)
            for packet in audio.encode(None):
                out.mux(packet)
        for packet in video.encode(None):
            out.mux(packet)
    return path


def write_wav(path: Path, sound: np.ndarray, rate: int = 16000) -> Path:
    """`sound` ([channels, samples] int16) as a 16-bit WAV file."""
    import soundfile

    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), sound.T, rate, subtype="PCM_16")
    return path


def make_sounding_model(directory: Path):
    """A ModelSpec of a tiny Qwen2.5-VL (its vision tower takes videos, its LLM the text) with a tiny Qwen2-Audio's
    audio tower feeding the same LLM, as an omni thinker has them; only the data side reads it (token rules,
    processors, tokenizer)."""
    import transformers
    from hf_models import make_qwen2_audio
    from qwen_vl_models import make_qwen_vl

    from orch.planner.specs import ModelSpec
    from orch.runtime.models.registry import load_model

    vision = load_model(str(make_qwen_vl(directory / "vl", "qwen2_5_vl")))
    transformers.WhisperFeatureExtractor(feature_size=16).save_pretrained(make_qwen2_audio(directory / "audio"))
    audio = load_model(str(directory / "audio")).modules["audio"]
    return ModelSpec.model_validate({**vision.model_dump(), "modules": {**vision.model_dump()["modules"],
                                                                          "audio": audio.model_dump()}})  # fmt: skip
