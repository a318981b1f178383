"""Users' data files: conversations with images, videos and audio, in the convention LLaMA-Factory, ms-swift
and VeOmni share, and mix files combining several. Torch-free (orch plan and orch data index read them).

A sample (one JSONL line, one element of a JSON list, one parquet row):

    {"messages": [{"role": "user", "content": "<image>What is in the picture?"},
                  {"role": "assistant", "content": "A red circle."}],
     "images": ["img/0001.png"], "videos": [], "audios": []}

Every layout LLaMA-Factory and ms-swift write is read as `messages` (runtime/data/layouts.py: ShareGPT's
`conversations` of from/value, ms-swift's `conversation`, query/response, alpaca, content as typed parts, a
`system` key, tool calls and their answers). Image, video and audio paths are relative to the data file (or a
dataset description's `media_dir`). Each `<image>` / `<video>` / `<audio>` placeholder stands
for the next file of its list (LLaMA-Factory's `mllm_video_demo.json`: `"videos": ["mllm_demo_data/1.mp4"]`
with a `<video>` in the text), so their counts must match. A mix file (YAML) lists sources, each a data file and
a weight:

    sources:
      - {path: captions.jsonl, weight: 3}
      - {path: asr.parquet, weight: 1}

A malformed sample is a `BadSample` naming `file:line` (the line of a JSONL file, the index of a JSON
list element or parquet row, 1-based) and what is wrong; readers yield it in the sample's place, so
the index reports it and the loader skips and counts it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.planner.io import read_spec_text
from orch.runtime.data.data_files import SUFFIXES, Source, data_files
from orch.runtime.data.dataset_info import is_dataset_info, read_dataset_info, split_ref
from orch.runtime.data.layouts import MEDIA_KEYS, Layout, LayoutError, read_record
from orch.runtime.data.layouts import TRAINED_ROLES as TRAINED_ROLES  # the index imports it here
from orch.runtime.sample import IMAGE, VIDEO

_VISUAL = re.compile(f"{re.escape(IMAGE)}|{re.escape(VIDEO)}")


@dataclass(frozen=True)
class Conversation:
    """One sample: (role, content) turns (role system, user, assistant, function_call or tool), its images', audio
    clips' and videos' absolute paths, and the tool definitions its chat template is given (JSON text)."""

    where: str  # file:line
    messages: tuple[tuple[str, str], ...]
    images: tuple[str, ...] = ()
    audios: tuple[str, ...] = ()
    number: int = 0  # the sample's place in its file, 1-based (its line in a JSONL file)
    videos: tuple[str, ...] = ()
    tools: str = ""
    # per video, the file its sound is read from under `use_audio_in_video` ("" for none; () with the setting off):
    # runtime/data/audio_in_video.py
    video_sounds: tuple[str, ...] = ()

    @property
    def trained_turns(self) -> int:
        return sum(1 for role, _ in self.messages if role in TRAINED_ROLES)

    def clips(self) -> tuple[tuple[str, str], ...]:
        """The files its audio encoder takes, in placeholder order: each `<audio>`'s clip and each sounding
        video's sound, as (what the file is to the sample, path): `audios[j]` or `videos[k] audio`."""
        from orch.runtime.data.audio_in_video import clip_files

        return clip_files(self.messages, self.audios, self.video_sounds)

    def without_sound(self, videos: list[int]) -> Conversation:
        """The sample with those videos' sounds dropped (a video without an audio track: its video alone)."""
        if not videos:
            return self
        sounds = tuple("" if k in videos else f for k, f in enumerate(self.video_sounds))
        return dataclasses.replace(self, video_sounds=sounds)

    def visual(self) -> tuple[tuple[str, int, str], ...]:
        """Its images and videos in placeholder (text) order: (IMAGE or VIDEO, k, path), the k-th `<image>`
        being `images[k]` and the k-th `<video>` `videos[k]`, interleaved as the placeholders stand."""
        out, count = [], {IMAGE: 0, VIDEO: 0}
        files = {IMAGE: self.images, VIDEO: self.videos}
        for _, content in self.messages:
            for m in _VISUAL.finditer(content):
                tag = m.group(0)
                k = count[tag]
                count[tag] += 1
                if k < len(files[tag]):
                    out.append((tag, k, files[tag][k]))
        return tuple(out)


@dataclass(frozen=True)
class BadSample:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def is_conversation_data(ref: str) -> bool:
    """A data file orch reads as conversations (by suffix), a mix file of them (YAML with `sources`), a directory
    of them, or LLaMA-Factory's dataset description (`dataset_info.json[:NAME,...]`)."""
    if split_ref(ref) is not None or is_dataset_info(ref):
        return True
    p = Path(ref)
    if p.is_dir():
        return True
    if p.suffix == ".parquet":
        return True
    if p.suffix in (".jsonl", ".json"):
        return _first_record_is_a_conversation(p)
    if p.suffix in (".yaml", ".yml") and p.is_file():
        import yaml

        try:
            doc = yaml.safe_load(read_spec_text(p))
        except yaml.YAMLError:
            return False
        return isinstance(doc, dict) and "sources" in doc
    return False


def _first_record_is_a_conversation(p: Path) -> bool:
    """Whether the file holds samples: a JSON list (a data spec is a mapping), or a JSONL file whose first record is
    no manifest row (module -> token count, or `lengths`); a sample in no layout is then told which keys orch reads."""
    if not p.is_file():
        return True  # named as data: reading it reports that it is missing
    with p.open(encoding="utf-8", errors="replace") as f:
        if p.suffix == ".json":
            return f.read(1 << 16).lstrip().startswith("[")
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return True  # malformed: the index reports it
                return isinstance(first, dict) and not _is_manifest_row(first)
    return False


def _is_manifest_row(row: dict[str, Any]) -> bool:
    """A row of lengths (planner/data.py `read_manifest`): `lengths`, or token counts by module name."""
    return "lengths" in row or (bool(row) and all(isinstance(v, int) for v in row.values()))


def read_sources(ref: str) -> list[Source]:
    """The data files of `ref` with their weights: itself (weight 1), a mix file's sources, a directory's data files
    (weight 1 each), or the datasets LLaMA-Factory's description names (runtime/data/dataset_info.py)."""
    named = split_ref(ref)
    if named is not None or is_dataset_info(ref):
        return read_dataset_info(*(named or (ref, [])))
    p = Path(ref)
    if p.is_dir():
        return [Source(f) for f in data_files(p, ref)]
    if p.suffix in SUFFIXES:
        if not p.is_file():
            raise SpecError(ref, "", "data file not found")
        return [Source(str(p.resolve()))]
    import yaml

    doc = yaml.safe_load(read_spec_text(p))
    sources = doc.get("sources") if isinstance(doc, dict) else None
    if not isinstance(sources, list) or not sources:
        raise SpecError(ref, "sources", "expected a list of {path, weight}")
    out = []
    for i, s in enumerate(sources):
        if not isinstance(s, dict) or not isinstance(s.get("path"), str):
            raise SpecError(ref, f"sources[{i}].path", "expected the path of a .jsonl, .json or .parquet file")
        path = (p.parent / s["path"]).resolve()
        if path.suffix not in SUFFIXES:
            raise SpecError(ref, f"sources[{i}].path", f"expected a .jsonl, .json or .parquet file, got {s['path']}")
        if not path.is_file():
            raise SpecError(ref, f"sources[{i}].path", f"{s['path']}: file not found")
        weight = s.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            raise SpecError(ref, f"sources[{i}].weight", f"expected a number > 0, got {weight!r}")
        sounds = s.get("use_audio_in_video")
        if sounds is not None and not isinstance(sounds, bool):
            raise SpecError(ref, f"sources[{i}].use_audio_in_video", f"expected true or false, got {sounds!r}")
        out.append(Source(str(path), float(weight), use_audio_in_video=sounds))
    return out


def read_conversations(
    path: str, source: Source | None = None, media_root: str | None = None
) -> Iterator[Conversation | BadSample]:
    """Every sample of one data file, in order (read by `source`'s layout where given); a malformed one as a
    BadSample. Media paths are relative to `media_root` where given (`--media-root`), else to the source's
    `media_dir` (a dataset description's), else to the file's folder."""
    p = Path(path)
    layout, base = _recipe(p, source, media_root)
    sounds = bool(source is not None and source.use_audio_in_video)
    for where, raw in _records(p):
        if isinstance(raw, BadSample):
            yield raw
            continue
        yield parse_sample(raw, where, base, layout, sounds)


def _recipe(p: Path, source: Source | None, media_root: str | None = None) -> tuple[Layout, Path]:
    """The layout a file's records are read by and the folder their media paths are relative to (`media_root`,
    else the source's `media_dir`, else the file's folder)."""
    layout = source.layout if source is not None else Layout()
    if media_root is not None:
        return layout, Path(media_root)
    return layout, Path(source.media_dir) if source is not None and source.media_dir else p.parent


def _records(p: Path) -> Iterator[tuple[str, Any]]:
    name = p.name
    if p.suffix == ".jsonl":
        with p.open(encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{name}:{lineno}"
                try:
                    yield where, json.loads(line)
                except json.JSONDecodeError as exc:
                    yield where, BadSample(where, f"not valid JSON ({exc.msg})")
    elif p.suffix == ".json":
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise SpecError(str(p), f"line {exc.lineno}", f"not valid JSON ({exc.msg})") from None
        if not isinstance(doc, list):
            raise SpecError(str(p), "", "expected a JSON list of samples")
        for i, raw in enumerate(doc, start=1):
            yield f"{name}:{i}", raw
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(p)
        for i, raw in enumerate(table.to_pylist(), start=1):
            yield f"{name}:{i}", raw


def parse_sample(
    raw: Any, where: str, base: Path, layout: Layout | None = None, use_audio_in_video: bool = False
) -> Conversation | BadSample:
    """One record as a Conversation (in `layout`, else any layout by its keys), or what is wrong with it.
    `use_audio_in_video`: the setting where the record names none (its source's, else the command's flag): each
    video's sound paired with it (runtime/data/audio_in_video.py)."""
    from orch.runtime.data.audio_in_video import KEY, pair_sounds, setting_of

    try:
        record = read_record(raw, layout or Layout())
        own = setting_of(raw.get(KEY))  # a record is a mapping once read_record took it
    except (LayoutError, ValueError) as exc:
        return BadSample(where, str(exc))
    messages = record.turns
    sounding = (use_audio_in_video if own is None else own) and bool(record.media["videos"])
    media: dict[str, tuple[str, ...]] = {}
    for key, tag in MEDIA_KEYS.items():
        files = record.media[key]
        used = sum(content.count(tag) for _, content in messages)
        if used != len(files) and not (sounding and key == "audios"):  # paired with the videos below
            return BadSample(where, f"{len(files)} {key} for {used} {tag} placeholders")
        media[key] = tuple(str((base / f).resolve()) if not Path(f).is_absolute() else f for f in files)
    sounds: tuple[str, ...] = ()
    if sounding:
        paired = pair_sounds(messages, media["videos"], media["audios"])
        if isinstance(paired, str):
            return BadSample(where, paired)
        messages, media["audios"], sounds = paired
    number = int(where.rsplit(":", 1)[1])
    return Conversation(where, tuple(messages), media["images"], media["audios"], number, media["videos"],
                        record.tools, sounds)  # fmt: skip


NO_SUCH = "no such"  # how SampleFile.get begins a sample number the file does not hold


class SampleFile:
    """Random access to one data file's samples by number (the `sample` of its index rows): a JSONL file by
    the byte offset of each line (one pass at open), a JSON list or parquet file held in memory."""

    def __init__(self, path: str, source: Source | None = None, media_root: str | None = None) -> None:
        self.path = Path(path)
        self.layout, self.base = _recipe(self.path, source, media_root)  # how its records read, media paths' folder
        self.sounds = bool(source is not None and source.use_audio_in_video)  # the setting where a record has none
        self._offsets: dict[int, int] = {}
        self._records: list[Any] | None = None
        if self.path.suffix == ".jsonl":
            with self.path.open("rb") as f:
                offset = 0
                for lineno, line in enumerate(f, start=1):
                    self._offsets[lineno] = offset
                    offset += len(line)
        else:
            self._records = [raw for _, raw in _records(self.path)]

    def get(self, number: int) -> Conversation | BadSample:
        where = f"{self.path.name}:{number}"
        if self._records is not None:
            if not 1 <= number <= len(self._records):
                return BadSample(where, f"{NO_SUCH} sample (the file changed since it was indexed?)")
            return parse_sample(self._records[number - 1], where, self.base, self.layout, self.sounds)
        if number not in self._offsets:
            return BadSample(where, f"{NO_SUCH} line (the file changed since it was indexed?)")
        with self.path.open("rb") as f:
            f.seek(self._offsets[number])
            line = f.readline().decode("utf-8", errors="replace")
        if not line.strip():
            return BadSample(where, f"{NO_SUCH} sample: a blank line")
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            return BadSample(where, f"not valid JSON ({exc.msg})")
        return parse_sample(raw, where, self.base, self.layout, self.sounds)

    @classmethod
    def of(cls, summary: dict[str, Any], media_root: str | None = None) -> SampleFile:
        """The file of one source of an index's summary (its path, and the layout and media folder it was read by)."""
        layout = Layout.from_json(summary.get("layout"))
        source = Source(summary["path"], layout=layout, media_dir=summary.get("media_dir"),
                        use_audio_in_video=summary.get("use_audio_in_video"))  # fmt: skip
        return cls(summary["path"], source, media_root)
