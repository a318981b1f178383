"""A CLIP or SigLIP tower's images by its own image processor (`AutoImageProcessor` from the tower's directory:
conversion to RGB, resize, crop, normalisation; the files opened as HF's users open them, hf/processor.py
`processor_images`): each image's [C, S, S] pixels cut into its g x g patches, row-major, a patch's
C·p·p values channel-first (`HFVisionEncoder.images` reassembles them)."""

from __future__ import annotations

from typing import Any

import torch

from orch.planner.specs import ModuleSpec
from orch.runtime.models.hf.processor import load_processor, processor_images
from orch.runtime.sample import EncoderRule


class TowerImages:
    def __init__(self, spec: ModuleSpec) -> None:
        import math

        assert spec.hf is not None and spec.input_dim is not None  # the planner derives both for an HF tower
        self.processor: Any = load_processor(spec.hf.path, "image")
        self.width = spec.input_dim
        self.patch = math.isqrt(spec.input_dim // 3)

    def inputs(self, files: tuple[str, ...], rule: EncoderRule, max_image_tokens: int) -> list[torch.Tensor]:
        pixels = self.processor(images=processor_images(files), return_tensors="pt")["pixel_values"].to(torch.float32)
        n, c, h, w = pixels.shape
        p = self.patch
        tiles = pixels.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return list(tiles.reshape(n, (h // p) * (w // p), c * p * p).unbind(0))
