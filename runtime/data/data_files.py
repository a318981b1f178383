"""The data files a DATA argument names, each a `Source` (its path, weight and reading recipe), and what a folder of
them holds: the ground both runtime/data/conversations.py (files, folders, mixes) and runtime/data/dataset_info.py
(LLaMA-Factory's dataset descriptions) stand on. Torch-free.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.runtime.data.layouts import Layout

SUFFIXES = (".jsonl", ".json", ".parquet")
HUB_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
DESCRIPTION_ENTRY = ("file_name", *HUB_KEYS)


@dataclass(frozen=True)
class Source:
    path: str
    weight: float = 1.0
    # how its records name their fields (a dataset description's columns and tags)
    layout: Layout = field(default_factory=Layout)
    media_dir: str | None = None  # where its media paths are relative to (else the data file's folder)
    # its samples' `use_audio_in_video` where a record names none (a mix file's; None: the command's flag decides)
    use_audio_in_video: bool | None = None

    def key(self) -> str:
        """What of it keys the index beside the file itself."""
        return json.dumps([self.weight, self.layout.as_json(), self.media_dir, self.use_audio_in_video],
                          sort_keys=True)  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        """Its reading recipe as the index's summary keeps it (`SampleFile.of`)."""
        return {"layout": self.layout.as_json(), "media_dir": self.media_dir,
                "use_audio_in_video": self.use_audio_in_video}  # fmt: skip


def data_files(folder: Path, ref: str) -> list[str]:
    """A directory's data files (.jsonl, .json, .parquet; not a dataset description), in name order, as LLaMA-Factory
    reads a folder named as a dataset; SpecError saying what it expected where it holds none."""
    files = sorted(str(f.resolve()) for f in folder.iterdir() if f.is_file() and f.suffix in SUFFIXES
                   and not f.name.startswith(".") and not is_dataset_info(str(f)))  # fmt: skip
    if not files:
        hint = (f"; it holds a dataset description: name its datasets, {ref.rstrip(os.sep)}/dataset_info.json:NAME"
                if (folder / "dataset_info.json").is_file() else "")  # fmt: skip
        raise SpecError(
            ref, "", f"a directory as DATA: expected .jsonl, .json or .parquet data files in it, found none{hint}"
        )
    return files


def is_dataset_info(path: str) -> bool:
    """Whether `path` is a dataset description: a JSON object of entries, each naming a file or a hub dataset."""
    p = Path(path)
    if p.suffix != ".json" or not p.is_file():
        return False
    with p.open(encoding="utf-8", errors="replace") as f:
        if not f.read(4096).lstrip().startswith("{"):
            return False
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return (
        isinstance(doc, dict)
        and bool(doc)
        and all(isinstance(v, dict) and any(k in v for k in DESCRIPTION_ENTRY) for v in doc.values())
    )
