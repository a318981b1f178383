"""A Hugging Face tower's own processor, from its directory (local files only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from orch.planner.errors import SpecError


def load_processor(directory: str, kind: Literal["image", "audio"]) -> Any:
    """`AutoImageProcessor` (image) or `AutoFeatureExtractor` (audio) of `directory`; SpecError when the
    directory has no processor config."""
    config = Path(directory) / "preprocessor_config.json"
    if not config.is_file():
        raise SpecError(str(config), "", "no processor config (save the model's processor beside it)")
    import transformers

    transformers.logging.set_verbosity_error()  # the PIL fallback's notice, once per process
    auto = transformers.AutoImageProcessor if kind == "image" else transformers.AutoFeatureExtractor
    return auto.from_pretrained(directory, local_files_only=True)
