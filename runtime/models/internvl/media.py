"""InternVL's token rule: each image's tiles from its header, as HF's image processor tiles it, without decoding a
pixel (torch-free: Pillow for the size, PyAV for a video's header).

* An image (GotOcr2ImageProcessor's `crop_to_patches`, which InternVLProcessor turns on): the grid of c x r tiles
  among those of `min_patches` to `max_patches` tiles whose aspect c/r is nearest the image's (a tie goes to the
  larger grid while the image's area exceeds half the grid's), the image resized to it and cut into its tiles,
  then a thumbnail (the whole image as one tile) when there is more than one: `c·r + 1` tiles, else 1. The
  limits are the directory's image processor's (preprocessor_config.json or processor_config.json; transformers
  5.24's defaults 1 and 12). One item `(tiles, g, g)`, g = image_size / patch patches a tile side.
* A video (InternVLVideoProcessor): every frame, or where the video processor samples (`do_sample_frames` with
  `num_frames`, or `fps`), `arange(shift, total, total / n)` truncated, shift `total / n / 2` (`initial_shift`);
  each frame resized to one tile: one item `(1, g, g)` per frame.

In the text (InternVLProcessor): an image's rows between `<img>` and `</img>`; a video's frames each
`Frame{i}: <img>` + its rows + `</img>`, joined by newlines (`video_prefix`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.hf.processor import processor_config

IMAGE_START, IMAGE_END = "<img>", "</img>"
IMAGE_DEFAULTS = {"min_patches": 1, "max_patches": 12}  # GotOcr2ImageProcessor's, transformers 5.24


def tile_grids(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """Every (columns, rows) of min..max tiles, by tile count (HF's `get_all_supported_aspect_ratios`)."""
    grids = [
        (c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1) if min_tiles <= c * r <= max_tiles
    ]
    return sorted(grids, key=lambda g: g[0] * g[1])


def best_grid(height: int, width: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(columns, rows) of the grid an image of height x width is resized to (HF's `get_optimal_tiled_canvas`)."""
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), float("inf")
    for grid in tile_grids(min_tiles, max_tiles):
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best, best_diff = grid, diff
        elif diff == best_diff and area > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid
    return best


@dataclass(frozen=True)
class Tiles:
    """An InternVL tower's token rule (module docstring): what the index asks of a family that counts its rows
    from headers (runtime/sample.py `GridRule`) and what its media processor tiles by. Every field is part of the
    index's key, so changed processor limits re-index."""

    side: int  # patches a tile side
    tile: int  # pixels a tile side
    min_tiles: int
    max_tiles: int
    crop: bool  # tile an image (InternVLProcessor's crop_to_patches); else one tile, resized
    sample_frames: bool  # the video processor's do_sample_frames
    num_frames: int | None
    fps: float | None
    initial_shift: float | bool
    wrap: tuple[str, str] = (IMAGE_START, IMAGE_END)
    no_video: str = ""

    def image_tiles(self, width: int, height: int) -> int:
        """Tiles of an image of width x height (HF's `get_number_of_image_patches`)."""
        if not self.crop or self.max_tiles <= 1:
            return 1
        columns, rows = best_grid(height, width, self.tile, self.min_tiles, self.max_tiles)
        return 1 + columns * rows if columns * rows > 1 else 1

    def image_item(self, path: str) -> tuple[int, int, int, float]:
        from PIL import Image

        with Image.open(path) as im:  # the header only; Pillow refuses an image over its decompression limit
            width, height = im.size
        if width <= 0 or height <= 0:
            raise ValueError(f"an empty image ({width}x{height})")
        return (self.image_tiles(width, height), self.side, self.side, 0.0)

    def frame_indices(self, total: int, rate: float) -> list[int]:
        """The frames the video processor keeps of `total` at `rate` fps (module docstring); a ValueError where
        it asks for more than there are."""
        count = self.num_frames
        if not self.sample_frames or (count is None and self.fps is None):
            return list(range(total))
        if count is None:
            assert self.fps is not None
            count = int(total / rate * self.fps)
        if count <= 0:
            raise ValueError(f"samples no frame of {total} at {self.fps} fps")
        if count > total:
            raise ValueError(f"num_frames={count} exceeds the video's {total} frames")
        step = total / count
        shift = step / 2 if self.initial_shift is True else float(self.initial_shift or 0)
        return [int(shift + k * step) for k in range(math.ceil((total - shift) / step))]

    def video_items(self, path: str) -> tuple[tuple[int, int, int, float], ...]:
        from orch.runtime.models.qwen_vl.media import video_header  # a container's header, read as Qwen-VL reads it

        head = video_header(path)
        frames = self.frame_indices(head.frames, head.rate)
        span = head.frames / len(frames) / head.rate  # seconds a kept frame stands for
        return tuple((1, self.side, self.side, span) for _ in frames)

    def video_prefix(self, item: tuple[int, int, int, float], index: int) -> str:
        """`Frame{i}: ` before each frame's `<img>`, the frames joined by newlines (InternVLProcessor)."""
        return f"{chr(10) if index else ''}Frame{index + 1}: "


def _positive(cfg: dict[str, Any], key: str, default: int, where: Path | None) -> int:
    value = cfg.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError(str(where), key, f"expected a positive integer, got {value!r}")
    return value


def read_rule(directory: str, side: int, tile: int) -> Tiles:
    """The token rule of an InternVL directory's processor configs (module docstring)."""
    image, where = processor_config(directory, "image_processor")  # either layout (runtime/models/hf/processor.py)
    video, _ = processor_config(directory, "video_processor")
    lo = _positive(image, "min_patches", IMAGE_DEFAULTS["min_patches"], where)
    hi = _positive(image, "max_patches", IMAGE_DEFAULTS["max_patches"], where)
    if lo > hi:
        raise SpecError(str(where), "min_patches", f"{lo} is over max_patches {hi}: no tile grid fits")
    size = image.get("size") or {}
    if isinstance(size, dict) and (size.get("height", tile) != tile or size.get("width", tile) != tile):
        raise SpecError(str(where), "size", f"tiles of {size}, the tower takes {tile} x {tile}")
    num, fps = video.get("num_frames"), video.get("fps")
    return Tiles(
        side=side,
        tile=tile,
        min_tiles=lo,
        max_tiles=hi,
        crop=True,  # InternVLProcessor's images_kwargs: crop_to_patches=True whatever the image processor's own
        sample_frames=bool(video.get("do_sample_frames", False)),
        num_frames=int(num) if isinstance(num, int) and num > 0 else None,
        fps=float(fps) if isinstance(fps, (int, float)) and fps > 0 else None,
        initial_shift=video.get("initial_shift", True),
    )


def token_rule(spec: ModuleSpec, modality: Modality) -> Tiles | None:
    """The family's hook for the index (runtime/data/index.py): the tower's tiles, by its directory's processor."""
    if modality != Modality.VISION or spec.hf is None or spec.image_tokens is None or spec.input_dim is None:
        return None
    side = math.isqrt(spec.image_tokens)
    patch = math.isqrt(spec.input_dim // 3)
    return read_rule(spec.hf.path, side, side * patch)
