"""LLaMA-Factory's dataset description (`dataset_info.json`) as DATA: `--data DIR/dataset_info.json:NAME[,NAME]`
(or `DIR:NAME[,NAME]`, LLaMA-Factory's dataset_dir and dataset) reads the named datasets as LLaMA-Factory reads
them. Torch-free.

Each entry's `file_name` (a data file or a folder of them, relative to the description's folder), `formatting`
(alpaca, the default; sharegpt; openai), `columns` (orch's names: messages, prompt, query, response, history,
system, tools, images, videos, audios -> the records' keys) and `tags` (role_tag, content_tag, user_tag,
assistant_tag, observation_tag, function_tag, system_tag) become each source's `Layout` (runtime/data/layouts.py).
Media paths are relative to `media_dir` where the entry names one (relative to the description's folder), else
to the description's folder (LLaMA-Factory's default media_dir, its dataset_dir; `--media-root` wins over both).
Several names are several sources of weight 1 each, concatenated (runtime/data/mix.py `read_mix_spec`:
LLaMA-Factory's default mix_strategy). Refused, each in one line: a hub dataset (hf_hub_url, ms_hub_url, ...: orch
reads local files), ranking (preference) data, num_samples.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.planner.io import read_spec_text
from orch.runtime.data.data_files import HUB_KEYS, SUFFIXES, Source, data_files, is_dataset_info
from orch.runtime.data.layouts import Layout

FORMATTINGS = ("alpaca", "sharegpt", "openai")
COLUMNS = ("messages", "prompt", "query", "response", "history", "system", "tools", "images", "videos", "audios")
TAGS = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")


def split_ref(ref: str) -> tuple[str, list[str]] | None:
    """`FILE:NAME[,NAME]` as (FILE, names) where FILE is a dataset description, or `DIR:NAME[,NAME]` where DIR holds
    one (LLaMA-Factory's dataset_dir and dataset); None for anything else."""
    if ":" not in ref or Path(ref).exists():
        return None
    path, _, names = ref.rpartition(":")
    if Path(path).is_dir():
        path = str(Path(path) / "dataset_info.json")
    if not is_dataset_info(path):
        return None
    return path, [n.strip() for n in names.split(",") if n.strip()]


def index_anchor(ref: str) -> str:
    """The path the index of `ref` is kept beside and named after: a description's own for its names (`DIR:NAME`
    included), `ref` itself otherwise."""
    named = split_ref(ref)
    return named[0] if named is not None else ref


def read_dataset_info(path: str, names: list[str]) -> list[Source]:
    """The sources of the datasets `names` of the description at `path` (module docstring)."""
    doc: dict[str, Any] = json.loads(read_spec_text(path))
    described = ", ".join(doc)
    if not names:
        raise SpecError(path, "", f"name the datasets to read: {path}:NAME[,NAME] (it describes {described})")
    folder = Path(path).resolve().parent
    out: list[Source] = []
    for name in names:
        entry = doc.get(name)
        if entry is None:
            raise SpecError(path, name, f"no such dataset (it describes {described})")
        out += _sources(path, name, entry, folder)
    return out


def _sources(path: str, name: str, entry: dict[str, Any], folder: Path) -> list[Source]:
    if "file_name" not in entry:
        hub = next(k for k in HUB_KEYS if k in entry)
        raise SpecError(path, f"{name}.{hub}", "a hub dataset: orch reads local files (download it and describe "
                        "it by file_name)")  # fmt: skip
    if entry.get("ranking"):
        raise SpecError(path, f"{name}.ranking", "preference (ranking) data: orch trains on conversations")
    if entry.get("num_samples") is not None:
        raise SpecError(path, f"{name}.num_samples", "not read by orch (a mix file's weights set each source's share)")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in FORMATTINGS:
        raise SpecError(path, f"{name}.formatting", f"expected one of {', '.join(FORMATTINGS)}, got {formatting!r}")
    columns = _names(path, name, entry, "columns", COLUMNS)
    tags = _names(path, name, entry, "tags", TAGS)
    layout = Layout(formatting, tuple(sorted(columns.items())), tuple(sorted(tags.items())))
    media = entry.get("media_dir")
    if media is not None and not isinstance(media, str):
        raise SpecError(path, f"{name}.media_dir", "expected a folder's path")
    media_dir = str((folder / media).resolve()) if media else str(folder)
    file = entry["file_name"]
    if not isinstance(file, str) or not file:
        raise SpecError(path, f"{name}.file_name", "expected the path of a data file or a folder of them")
    target = folder / file
    if target.is_dir():
        files = data_files(target, str(target))
    elif target.is_file():
        if target.suffix not in SUFFIXES:
            raise SpecError(path, f"{name}.file_name", f"expected a .jsonl, .json or .parquet file, got {file}")
        files = [str(target.resolve())]
    else:
        raise SpecError(path, f"{name}.file_name", f"{target}: file not found")
    return [Source(f, 1.0, layout, media_dir) for f in files]


def _names(path: str, name: str, entry: dict[str, Any], key: str, known: tuple[str, ...]) -> dict[str, str]:
    """An entry's `columns` or `tags`: orch's name -> the records' name, for the names orch reads."""
    raw = entry.get(key, {})
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise SpecError(path, f"{name}.{key}", "expected an object of names")
    unread = [k for k in raw if k not in known]
    if unread:
        raise SpecError(path, f"{name}.{key}.{unread[0]}", f"not one orch reads (it reads {', '.join(known)})")
    return {k: v for k, v in raw.items()}
