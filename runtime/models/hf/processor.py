"""A Hugging Face tower's own processor, from its directory (local files only), and the processor configs as
every transformers version writes them: transformers 5's `processor_config.json` (one file, each part under its
own key: `image_processor`, `feature_extractor`, `video_processor`), or the older one file per part
(`preprocessor_config.json`, `video_preprocessor_config.json`). Torch-free (the index reads the configs)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from orch.planner.errors import SpecError

Part = Literal["image_processor", "feature_extractor", "video_processor"]
PROCESSOR_CONFIG = "processor_config.json"  # transformers 5: every part of the processor in one file
_OWN_FILE = {  # the file each part had before transformers 5
    "image_processor": "preprocessor_config.json",
    "feature_extractor": "preprocessor_config.json",
    "video_processor": "video_preprocessor_config.json",
}
CONFIG_FILES = (PROCESSOR_CONFIG, "preprocessor_config.json", "video_preprocessor_config.json")


def _read_object(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(str(path), "", f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(str(path), "", "expected a JSON object")
    return raw


def processor_config(directory: str | Path, part: Part) -> tuple[dict[str, Any], Path | None]:
    """The saved config of one part of a directory's processor and the file it came from: its own file
    (`preprocessor_config.json`, `video_preprocessor_config.json`) where there is one, else its key in
    transformers 5's `processor_config.json`; ({}, None) where neither holds it."""
    d = Path(directory)
    own = d / _OWN_FILE[part]
    if own.is_file():
        return _read_object(own), own
    combined = d / PROCESSOR_CONFIG
    if combined.is_file():
        nested = _read_object(combined).get(part)
        if isinstance(nested, dict):
            return nested, combined
        if nested is not None:
            raise SpecError(str(combined), part, "expected a JSON object")
    return {}, None


def load_processor(directory: str, kind: Literal["image", "audio"]) -> Any:
    """`AutoImageProcessor` (image) or `AutoFeatureExtractor` (audio) of `directory`, from either layout of its
    processor config; SpecError when the directory has none."""
    part: Part = "image_processor" if kind == "image" else "feature_extractor"
    if processor_config(directory, part)[1] is None:
        raise SpecError(str(Path(directory) / PROCESSOR_CONFIG), part, "no processor config (neither "
                        f"processor_config.json nor preprocessor_config.json holds its {part.replace('_', ' ')}: "
                        "save the model's processor beside it, processor.save_pretrained(DIR))")  # fmt: skip
    import transformers

    transformers.logging.set_verbosity_error()  # the PIL fallback's notice, once per process
    auto = transformers.AutoImageProcessor if kind == "image" else transformers.AutoFeatureExtractor
    return auto.from_pretrained(directory, local_files_only=True)


def processor_images(files: Sequence[str]) -> list[Any]:
    """The images at `files` as a user hands them to a Hugging Face image processor (`Image.open`): decoded in
    their own mode, an animation's first frame. The processor makes them RGB (`do_convert_rgb`: transparency,
    RGBA's, LA's or a palette's, composited onto white, anything else by Pillow's `convert`), so orch's pixels
    are the processor's; OSError where a file does not decode."""
    from PIL import Image

    out = []
    for f in files:
        with Image.open(f) as im:
            out.append(im.copy())  # decoded before the file closes; mode, palette and transparency kept
    return out


def processor_keys(directory: str | Path) -> dict[str, Any]:
    """The processor's own settings (its tokens: `audio_bos_token`, `image_token`, ...): the top level of
    `processor_config.json`, its parts left out; {} where the directory has none."""
    combined = Path(directory) / PROCESSOR_CONFIG
    if not combined.is_file():
        return {}
    return {k: v for k, v in _read_object(combined).items() if k not in _OWN_FILE}


Rows = TypeVar("Rows")


def rows_in_file_order(
    files: Sequence[str],
    kinds: Sequence[str] | None,
    image_rows: Callable[[list[str]], list[Rows]],
    video_rows: Callable[[str], list[Rows]],
) -> list[Rows]:
    """A sample's encoder rows one tensor per item in its files' order: its images through `image_rows` at once
    (one processor call, one tensor each), each video's items through `video_rows`; `kinds` says which files
    are videos (all images where not given)."""
    from orch.runtime.sample import IMAGE

    kinds = kinds or (IMAGE,) * len(files)
    images = iter(image_rows([f for f, k in zip(files, kinds, strict=True) if k == IMAGE]) if IMAGE in kinds else ())
    out: list[Rows] = []
    for f, k in zip(files, kinds, strict=True):
        out += [next(images)] if k == IMAGE else video_rows(f)
    return out
