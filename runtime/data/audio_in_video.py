"""`use_audio_in_video`: which of a sample's videos are trained with their own audio, and from which file its sound
is read. Torch-free (the index reads it).

The setting, in order of precedence: a record's own key (`"use_audio_in_video": true`), its source's in a mix
file (`sources: [{path, use_audio_in_video: true}]`), the `--use-audio-in-video` flag of the command reading the
data, else false. Under it, a sample's `<video>` placeholders are paired with their sound, as LLaMA-Factory's
`qwen2_omni` plugin pairs them (`<video><audio>` in the text, `videos` and `audios` lists: the k-th video's
sound is the `<audio>` after its `<video>` in the same turn, that placeholder taken by the video and removed from
the text) and as Hugging Face's omni processors load a video's own track (a `<video>` without an `<audio>` after
it, or one whose `<audio>` has no file in a record without `audios`: the sound is the video file's own audio
track, decoded with PyAV: runtime/sound.py). A record's other `<audio>` placeholders are clips as ever.

The sound is read where the index reads headers (runtime/data/index.py `resolve_sounds`): a video file without an
audio track trains as its video alone, counted as a warning (`file:line: videos[k]: PATH: no audio track: its
video alone`), as Hugging Face's processors skip a silent video's audio; a sound that cannot be read, or a model
with no audio encoder to take it, is a malformed sample.
"""

from __future__ import annotations

import re
from typing import Any

from orch.runtime.sample import AUDIO, VIDEO

KEY = "use_audio_in_video"
_PLACEHOLDER = re.compile(f"{re.escape(VIDEO)}|{re.escape(AUDIO)}")


def setting_of(value: Any) -> bool | None:
    """A record's or source's `use_audio_in_video`: True, False, or None where it names none (a parquet column's
    empty cell too); ValueError for anything else."""
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"{KEY}: expected true or false, got {value!r}")


def pair_sounds(
    messages: list[tuple[str, str]], videos: tuple[str, ...], audios: tuple[str, ...]
) -> tuple[list[tuple[str, str]], tuple[str, ...], tuple[str, ...]] | str:
    """Under `use_audio_in_video`: the turns with each video's `<audio>` taken out, the clips left to `<audio>`
    placeholders, and per video the file of its sound (module docstring); what is wrong where the `<audio>`
    placeholders and the `audios` files do not match."""
    paired: dict[int, int] = {}  # video -> the `<audio>` placeholder (text order) after it
    alone: list[int] = []  # the other `<audio>` placeholders
    out: list[tuple[str, str]] = []
    k_video = k_audio = 0
    for role, content in messages:
        pieces, last, pending = [], 0, None
        for m in _PLACEHOLDER.finditer(content):
            pieces.append(content[last : m.start()])
            last = m.end()
            if m.group(0) == VIDEO:
                pending = k_video
                k_video += 1
                pieces.append(VIDEO)
                continue
            if pending is not None:  # the video's sound: the placeholder is taken by it
                paired[pending] = k_audio
                pending = None
            else:
                alone.append(k_audio)
                pieces.append(AUDIO)
            k_audio += 1
        out.append((role, "".join(pieces) + content[last:]))
    if len(audios) == k_audio:  # LLaMA-Factory's: each `<audio>` has its file, a video's the copy of its track
        sounds = tuple(audios[paired[k]] if k in paired else videos[k] for k in range(len(videos)))
        return out, tuple(audios[j] for j in alone), sounds
    if len(audios) == len(alone):  # Hugging Face's empty audio part after a video: the video's own track
        return out, audios, videos
    return (f"{len(audios)} audios for {k_audio} {AUDIO} placeholders ({len(paired)} after a {VIDEO}, "
            f"{KEY}: its sound, from audios or else the video's own track)")  # fmt: skip


def clip_files(
    messages: tuple[tuple[str, str], ...], audios: tuple[str, ...], video_sounds: tuple[str, ...]
) -> tuple[tuple[str, str], ...]:
    """The files an audio encoder takes, in placeholder order: (what the file is to the sample, its path): each
    `<audio>`'s clip (`audios[j]`), and where a video has a sound, its sound at its `<video>` (`videos[k] audio`)."""
    out: list[tuple[str, str]] = []
    k_video = k_audio = 0
    for _, content in messages:
        for m in _PLACEHOLDER.finditer(content):
            if m.group(0) == AUDIO:
                if k_audio < len(audios):
                    out.append((f"audios[{k_audio}]", audios[k_audio]))
                k_audio += 1
            else:
                if k_video < len(video_sounds) and video_sounds[k_video]:
                    out.append((f"videos[{k_video}] audio", video_sounds[k_video]))
                k_video += 1
    return tuple(out)
