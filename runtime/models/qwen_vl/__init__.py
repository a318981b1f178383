"""The Qwen-VL family (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a native-resolution vision tower over packed images and
videos of any size (module `vision`) feeding a Qwen decoder with M-RoPE positions (module `llm`);
docs/qwen_vl.md."""

from __future__ import annotations

from typing import Any

from orch.planner.specs import Modality, ModuleSpec


def media_processor(spec: ModuleSpec, modality: Modality) -> Any:
    """Each image's and video's patch rows in the order HF's processor gives `pixel_values` (processing.py)."""
    from orch.runtime.models.qwen_vl.processing import VisionMedia

    return VisionMedia(spec)
