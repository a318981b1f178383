"""InternVL's images and videos as its tower takes them: rows of tiles.

An image by the directory's own image processor (`AutoImageProcessor`: GotOcr2ImageProcessor, its PIL backend
here), with InternVLProcessor's `crop_to_patches` and the rule's tile limits (media.py): its tiles and, past one,
the thumbnail. A video by the published algorithm of InternVLVideoProcessor (its torchvision backend cannot run
here): the frames media.py's rule keeps, decoded by PyAV as HF's reader decodes them, each resized to one tile,
rescaled and normalised by the same image processor (`crop_to_patches` off): one tile a frame.

A tile's [C, S, S] pixels become its g x g patches, row-major, each patch's C·p·p values channel-first
(vision.py's `tiles` puts them back).
"""

from __future__ import annotations

from typing import Any

import torch

from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.hf.processor import load_processor, processor_images, rows_in_file_order
from orch.runtime.models.internvl.media import Tiles, token_rule
from orch.runtime.sample import EncoderRule


class TileMedia:
    def __init__(self, spec: ModuleSpec) -> None:
        import math

        assert spec.hf is not None and spec.input_dim is not None  # the planner derives both for an HF tower
        rule = token_rule(spec, Modality.VISION)
        assert rule is not None
        self.rule: Tiles = rule
        self.processor: Any = load_processor(spec.hf.path, "image")
        self.width = spec.input_dim
        self.patch = math.isqrt(spec.input_dim // 3)

    def rows(self, pixels: torch.Tensor) -> torch.Tensor:
        """Tiles [n, C, S, S] -> their patch rows [n·g², C·p·p]."""
        n, c, h, w = pixels.shape
        p = self.patch
        tiles = pixels.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return tiles.reshape(n * (h // p) * (w // p), c * p * p).contiguous()

    def image_rows(self, files: list[str]) -> list[torch.Tensor]:
        """Each image's tiles' rows (one processor call for a sample's images, split by their tile counts)."""
        rule = self.rule
        out = self.processor(images=processor_images(files), crop_to_patches=rule.crop, min_patches=rule.min_tiles,
                             max_patches=rule.max_tiles, return_tensors="pt")  # fmt: skip
        pixels = out["pixel_values"].to(torch.float32)
        return [self.rows(t) for t in pixels.split([int(n) for n in out["num_patches"]])]

    def frames(self, path: str) -> list[Any]:
        """The video's kept frames (RGB images), decoded as HF's PyAV reader decodes them; a ValueError where it
        cannot be decoded as its header promised."""
        import av
        from PIL import Image

        from orch.runtime.models.qwen_vl.media import video_header

        head = video_header(path)
        wanted = self.rule.frame_indices(head.frames, head.rate)
        picked, got = set(wanted), {}
        try:
            with av.open(path) as container:
                for i, frame in enumerate(container.decode(video=0)):
                    if i > wanted[-1]:
                        break
                    if i in picked:
                        got[i] = Image.fromarray(frame.to_ndarray(format="rgb24"))
        except Exception as exc:  # PyAV's decoding errors
            raise ValueError(f"cannot decode ({type(exc).__name__}: {exc})") from None
        if len(got) < len(picked):
            raise ValueError(f"decoded {len(got)} of the {len(picked)} frames its header promised")
        return [got[i] for i in wanted]

    def video_rows(self, path: str) -> list[torch.Tensor]:
        """One tile's rows per kept frame (media.py `video_items`: an item each)."""
        out = self.processor(images=self.frames(path), crop_to_patches=False, return_tensors="pt")
        return [self.rows(t[None]) for t in out["pixel_values"].to(torch.float32)]

    def inputs(
        self, files: tuple[str, ...], rule: EncoderRule, max_image_tokens: int, kinds: tuple[str, ...] | None = None
    ) -> list[torch.Tensor]:
        """One tensor of rows per item: an image's tiles, a video's frames one each (`kinds`: which files are
        videos; all images where not given)."""
        return rows_in_file_order(files, kinds, self.image_rows, self.video_rows)
