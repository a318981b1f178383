"""A clip's samples from whatever file holds them: an audio file soundfile reads (WAV, FLAC, OGG, MP3, ...) by
soundfile, any other container (a video's own audio track, an .m4a) by its first audio stream with PyAV. Torch-free
at import (the index reads headers through it); soundfile, numpy and av are imported where used.

* `clip_frames(path)`: (samples, rate) from the header alone, nothing decoded: soundfile's frame count, or the
  audio stream's duration (the stream's own in its time base, a Matroska / WebM stream's `DURATION` tag, else the
  container's) at the stream's rate. The index counts a clip's tokens from it.
* `track_waveform(path, rate)`: a container's audio track decoded, resampled to `rate` with PyAV's resampler
  (FFmpeg's swresample), channels averaged to mono (as soundfile's reading is averaged: not swresample's
  1/sqrt(2) downmix), cut or zero-padded to the samples its header gives at `rate`, so its frames are the ones the
  index counted. A track that will not decode, or decodes to less than its header gives by more than
  `SHORT_TOLERANCE_S` (a codec's priming and padding are milliseconds), is a ValueError naming the file.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

SHORT_TOLERANCE_S = 0.1
NO_AUDIO_TRACK = "no audio track"
_HMS = re.compile(r"^(\d+):(\d+):(\d+(?:\.\d+)?)$")


class NoAudioTrack(ValueError):
    """The container holds no audio stream (a silent video)."""


def soundfile_reads(path: str) -> bool:
    """Whether soundfile (libsndfile) opens the file: its header, nothing decoded."""
    import soundfile

    try:
        soundfile.info(path)
    except (RuntimeError, TypeError, ValueError):  # soundfile's LibsndfileError is a RuntimeError
        return False
    return True


def clip_frames(path: str) -> tuple[int, int]:
    """(samples, rate) of the clip at `path`, from its header (module docstring): FileNotFoundError for a file
    that is not there, `NoAudioTrack` for a container without audio, ValueError saying what else is wrong."""
    import os

    import soundfile

    try:
        info = soundfile.info(path)
        return int(info.frames), int(info.samplerate)
    except (RuntimeError, TypeError, ValueError):  # soundfile's LibsndfileError is a RuntimeError: not its format
        if not os.path.isfile(path):
            raise FileNotFoundError(2, "No such file or directory", path) from None
    return track_header(path)


def track_header(path: str) -> tuple[int, int]:
    """(samples, rate) of the container's first audio stream from its header; `NoAudioTrack` where it has none,
    ValueError where the stream cannot be decoded by this FFmpeg or its header gives no rate or duration."""
    import av

    try:
        with av.open(path) as container:
            streams = container.streams.audio
            if not streams:
                raise NoAudioTrack(NO_AUDIO_TRACK)
            stream = streams[0]
            codec = stream.codec_context  # None where this FFmpeg knows no such codec
            decodes = codec is not None and codec.codec is not None and codec.codec.is_decoder
            rate = int(codec.sample_rate or 0) if decodes else 0
            seconds = stream_seconds(stream, container)
    except av.error.FFmpegError as exc:  # InvalidDataError and the like: not a container FFmpeg knows
        raise ValueError(f"does not open as audio or video ({type(exc).__name__})") from None
    except (OSError, EOFError) as exc:
        raise ValueError(f"cannot read ({type(exc).__name__})") from None
    if not decodes:
        raise ValueError("its audio track will not decode (no decoder for its codec)")
    if rate <= 0:
        raise ValueError("its audio track has no sample rate in its header")
    if seconds is None or seconds <= 0:
        raise ValueError("its audio track has no duration in its header")
    return round(seconds * rate), rate


def stream_seconds(stream: Any, container: Any) -> float | None:
    """A stream's duration in seconds from the header: its own, its `DURATION` tag (Matroska and WebM write one per
    stream), else the container's (the longest stream's)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    tag = next((v for k, v in (stream.metadata or {}).items() if k.upper() == "DURATION"), None)
    if isinstance(tag, str) and (m := _HMS.match(tag.strip())):
        return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
    return container.duration / 1e6 if container.duration else None


def track_waveform(path: str, rate: int) -> np.ndarray:
    """The container's audio track at `rate`, mono float32, its header's length (module docstring)."""
    import av
    import numpy as np

    samples, source_rate = track_header(path)
    wanted = round(samples * rate / source_rate)
    parts: list[np.ndarray] = []
    try:
        with av.open(path) as container:
            resampler = av.AudioResampler(format="fltp", rate=rate)  # channels kept: averaged below
            for frame in container.decode(audio=0):
                parts += [f.to_ndarray() for f in resampler.resample(frame)]
            parts += [f.to_ndarray() for f in resampler.resample(None)]
    except Exception as exc:  # PyAV's decoding errors: the track does not decode
        raise ValueError(f"{path}: its audio track will not decode ({type(exc).__name__}: {exc})") from None
    planar = np.concatenate(parts, axis=1) if parts else np.zeros((1, 0), dtype=np.float32)
    got = planar.shape[1]
    if wanted - got > SHORT_TOLERANCE_S * rate:
        raise ValueError(f"{path}: its audio track decodes to {got / rate:.2f} s of the {wanted / rate:.2f} s "
                         "its header gives")  # fmt: skip
    mono = np.ascontiguousarray(planar.T).mean(axis=1)  # [samples, channels] averaged, as soundfile's are
    if got >= wanted:
        return np.ascontiguousarray(mono[:wanted])
    return np.concatenate([mono, np.zeros(wanted - got, dtype=np.float32)])
