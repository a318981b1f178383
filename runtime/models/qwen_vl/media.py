"""The Qwen-VL family's token rule: each image's and video's patch grid from its header, as Hugging Face's
processors compute it, without decoding a pixel (torch-free: Pillow for image sizes, PyAV for video headers).

* An image: `(1, h, w)` patches, `(h·p, w·p)` = `smart_resize(height, width, factor = patch·merge, min_pixels,
  max_pixels)` of its header size, the limits of the directory's preprocessor_config.json (`min_pixels` /
  `max_pixels`, or `size: {shortest_edge, longest_edge}` in newer files), with HF's own error for an aspect
  ratio over 200 (a ValueError: the index skips the sample).
* A video: its container header (frame count, average rate, size); frames sampled as the family's video
  processor samples them at the directory's `fps` (video_preprocessor_config.json; 2 where it names none, as
  qwen-vl-utils, LLaMA-Factory and Qwen3-VL's processor sample): Qwen2-VL / Qwen2.5-VL clamp the count to
  min/max frames and round it down to a multiple of the temporal patch, then take `arange(0, total,
  total/n)`; Qwen3-VL takes `int(total/rate·fps)` clamped, `linspace(0, total-1, n)` rounded. Each frame
  resized by `smart_resize` under the video limits (Qwen3-VL's counts the frames into its pixel budget);
  `t = ceil(frames / temporal_patch)` (the last frame repeats to fill a temporal patch); `seconds` per
  temporal grid step `temporal_patch / sampled fps` (HF's `second_per_grid_ts`).
* A video's items (`video_items`): Qwen2-VL / Qwen2.5-VL, one `(t, h, w, seconds per step)`; Qwen3-VL, one
  `(1, h, w, timestamp)` per temporal step, as Qwen3VLProcessor writes the video into the text: per step
  `<{timestamp:.1f} seconds>` then the step's pads between `<|vision_start|>` and `<|vision_end|>`
  (`video_prefix`), the timestamp HF's `_calculate_timestamps`: sampled frame index / the container's frame
  rate, the indices padded with the last to whole temporal patches, the mean of each patch's first and last.
  Its tower attends within each frame (per-frame attention lengths, rotary and position-embedding grid) and
  its `get_rope_index` splits `video_grid_thw` into t grids of (1, h, w): a (T, h, w) video is exactly T items
  of (1, h, w), so the runtime takes them as it takes images.

Video limits are the video processor's: Qwen2VLVideoProcessor takes `min_pixels` / `max_pixels` over `size`;
Qwen3VLVideoProcessor has no such keys and reads `size: {shortest_edge, longest_edge}` alone.

An absent video_preprocessor_config.json means the video processor class's defaults of transformers 5.24
(Qwen2VLVideoProcessor, Qwen3VLVideoProcessor), with the image config's patch, merge and temporal patch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orch.planner.errors import SpecError
from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.hf.processor import processor_config
from orch.runtime.sound import stream_seconds

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
# transformers 5.24's class defaults: Qwen2VLImageProcessor, Qwen2VLVideoProcessor and Qwen3VLVideoProcessor
IMAGE_DEFAULTS = {"min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280, "patch_size": 14, "merge_size": 2,
                  "temporal_patch_size": 2}  # fmt: skip
VIDEO_DEFAULTS = {
    "qwen2": {"min_pixels": 128 * 28 * 28, "max_pixels": 28 * 28 * 768, "min_frames": 4, "max_frames": 768,
              "max_video_tokens": 128000},
    "qwen3": {"min_pixels": 128 * 32 * 32, "max_pixels": 32 * 32 * 768, "min_frames": 4, "max_frames": 768,
              "max_video_tokens": 768},
}  # fmt: skip
DEFAULT_FPS = 2.0
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
NORMALISE_DEFAULTS = {"qwen2": (CLIP_MEAN, CLIP_STD), "qwen3": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))}


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 14 * 14 * 4 * 1280
) -> tuple[int, int]:
    """Hugging Face's `smart_resize` (transformers' models/qwen2_vl): both sides multiples of `factor`, the pixels
    within [min_pixels, max_pixels], the aspect kept; a ValueError for an aspect ratio over 200."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_video3(
    num_frames: int, height: int, width: int, temporal_factor: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen3-VL's video `smart_resize` (transformers' models/qwen3_vl/video_processing_qwen3_vl.py): the frames
    count in the pixel budget, frames under `factor` pixels scaled up first."""
    if num_frames < temporal_factor:
        raise ValueError(f"t:{num_frames} must be larger than temporal_factor:{temporal_factor}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height = int(height * scale)
        width = int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class VideoHeader:
    frames: int  # the stream's frame count
    rate: float  # its average frame rate
    width: int
    height: int


def video_header(path: str) -> VideoHeader:
    """A video's frame count, average rate and size from its container (PyAV, nothing decoded); a ValueError
    saying what is wrong where it cannot be opened or has no usable video stream."""
    import av

    if not Path(path).is_file():
        raise ValueError("file not found")
    try:
        with av.open(path) as container:
            streams = container.streams.video
            if not streams:
                raise ValueError("no video stream")
            s = streams[0]
            rate = float(s.average_rate) if s.average_rate else 0.0
            frames = int(s.frames or 0)
            if frames <= 0 and rate > 0:  # a container without a frame count (mkv, webm): from the stream's duration
                frames = round((stream_seconds(s, container) or 0.0) * rate)  # not a longer audio track's
            width, height = int(s.codec_context.width), int(s.codec_context.height)
    except av.error.FFmpegError as exc:  # a file that does not open as a video (InvalidDataError, ...)
        raise ValueError(f"cannot open ({type(exc).__name__})") from None
    except (OSError, EOFError) as exc:
        raise ValueError(f"cannot read ({type(exc).__name__})") from None
    if rate <= 0:
        raise ValueError("no frame rate in its header")
    if frames <= 0 or width <= 0 or height <= 0:
        raise ValueError(f"no frames in its header ({frames} frames, {width}x{height})")
    return VideoHeader(frames, rate, width, height)


@dataclass(frozen=True)
class VisionGrids:
    """A Qwen-VL tower's token rule (module docstring): what the index asks of a native-resolution family
    (runtime/data/index.py `GridRule`) and what its media processor decodes by. Every field is part of the
    index's key, so changed processor limits re-index."""

    variant: str  # "qwen2" (Qwen2-VL, Qwen2.5-VL) or "qwen3" (Qwen3-VL): the video sampler and resize
    patch: int
    merge: int
    temporal_patch: int
    min_pixels: int  # an image's
    max_pixels: int
    video_min_pixels: int
    video_max_pixels: int
    fps: float
    min_frames: int
    max_frames: int
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 128000
    wrap: tuple[str, str] = (VISION_START, VISION_END)  # text tokens around each image's or video's pads
    no_video: str = ""  # why the tower takes no video ("" where it does)

    @property
    def factor(self) -> int:
        return self.patch * self.merge

    @property
    def row_width(self) -> int:
        """Values per patch row: 3 · temporal_patch · patch² (the tower's `input_dim`)."""
        return 3 * self.temporal_patch * self.patch * self.patch

    def image_grid(self, width: int, height: int) -> tuple[int, int, int]:
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return 1, h // self.patch, w // self.patch

    def image_item(self, path: str) -> tuple[int, int, int, float]:
        """(1, h, w, 0) of the image at `path` from its header; OSError (unreadable), ValueError (HF's)."""
        from PIL import Image

        with Image.open(path) as im:
            width, height = im.size
        return (*self.image_grid(width, height), 0.0)

    def frame_count(self, total: int, rate: float) -> int:
        """How many frames the family's video processor samples of a video of `total` frames at `rate` fps (the
        length of its indices); a ValueError where it cannot sample any."""
        tp = self.temporal_patch
        if self.variant == "qwen3":
            n = int(total / rate * self.fps)
            return min(max(n, self.min_frames), self.max_frames, total)
        top = math.floor(min(self.max_frames, total) / tp) * tp
        n = math.floor(min(max(total / rate * self.fps, self.min_frames), top, total) / tp) * tp
        if n <= 0:
            raise ValueError(f"{total} frames: fewer than a temporal patch ({tp}) to sample")
        return math.ceil(total / (total / n))  # the length of torch.arange(0, total, total / n)

    def frame_indices(self, total: int, rate: float) -> list[int]:
        """The frames the family's video processor samples (HF's `sample_frames`), computed as HF computes them."""
        n = self.frame_count(total, rate)
        if self.variant == "qwen3":
            import numpy as np

            return [int(i) for i in np.linspace(0, total - 1, n).round().astype(int)]
        import torch

        return [int(i) for i in torch.arange(0, total, total / n).int().tolist()]

    def frame_size(self, frames: int, width: int, height: int) -> tuple[int, int]:
        """(height, width) in pixels every sampled frame is resized to."""
        lo, hi = self.video_min_pixels, self.video_max_pixels
        if self.variant == "qwen3":
            if self.cap_pixels_per_frame:
                per_frame = max(min(self.max_video_tokens * self.factor**2, hi // frames), int(lo * 1.05))
                hi = per_frame * frames
            return smart_resize_video3(frames, height, width, self.temporal_patch, self.factor, lo, hi)
        if self.cap_pixels_per_frame:
            total = int(self.max_video_tokens * self.factor * self.factor * 0.9)
            hi = max(min(hi, total * self.temporal_patch // frames), int(lo * 1.05))
        return smart_resize(height, width, self.factor, lo, hi)

    def video_grid(self, head: VideoHeader) -> tuple[int, int, int, float]:
        """(t, h, w, seconds per temporal step) of a video with this header."""
        n = self.frame_count(head.frames, head.rate)
        h, w = self.frame_size(n, head.width, head.height)
        sampled_fps = n / head.frames * head.rate  # HF's VideoMetadata.sampled_fps
        return -(-n // self.temporal_patch), h // self.patch, w // self.patch, self.temporal_patch / sampled_fps

    def video_item(self, path: str) -> tuple[int, int, int, float]:
        """(t, h, w, seconds) of the video at `path` from its container header (HF's `video_grid_thw`, its
        `second_per_grid_ts`); ValueError saying what is wrong."""
        return self.video_grid(video_header(path))

    def timestamps(self, head: VideoHeader) -> list[float]:
        """Each temporal step's time in seconds as Qwen3VLProcessor's `_calculate_timestamps` computes it: the
        sampled frames' indices over the container's rate, padded with the last index to whole temporal patches,
        each patch the mean of its first and last frame's."""
        tp = self.temporal_patch
        indices = self.frame_indices(head.frames, head.rate)
        indices += [indices[-1]] * (-len(indices) % tp)
        times = [i / head.rate for i in indices]
        return [(times[k] + times[k + tp - 1]) / 2 for k in range(0, len(times), tp)]

    def video_items(self, path: str) -> tuple[tuple[int, int, int, float], ...]:
        """The items the video at `path` becomes (module docstring): Qwen2/2.5-VL its grid, Qwen3-VL one
        `(1, h, w, timestamp)` per temporal step; ValueError saying what is wrong."""
        return self.header_items(video_header(path))

    def header_items(self, head: VideoHeader) -> tuple[tuple[int, int, int, float], ...]:
        """`video_items` of a video with this header."""
        t, h, w, seconds = self.video_grid(head)
        if self.variant != "qwen3":
            return ((t, h, w, seconds),)
        times = self.timestamps(head)
        assert len(times) == t, (times, t)
        return tuple((1, h, w, at) for at in times)

    def video_prefix(self, item: tuple[int, int, int, float], index: int) -> str:
        """The text before a video item's `wrap`: Qwen3-VL's `<{timestamp:.1f} seconds>`, else none."""
        return f"<{item[3]:.1f} seconds>" if self.variant == "qwen3" else ""


def _limits(cfg: dict[str, Any], defaults: dict[str, Any]) -> tuple[int, int]:
    """(min, max) pixels as the processor's __init__ takes them: `min_pixels` / `max_pixels` over `size`'s
    shortest_edge / longest_edge, else the class defaults."""
    size = cfg.get("size") if isinstance(cfg.get("size"), dict) else {}
    assert isinstance(size, dict)
    lo = cfg.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels") or defaults["min_pixels"]
    hi = cfg.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels") or defaults["max_pixels"]
    return int(lo), int(hi)


def variant_of(model_type: str) -> str:
    return "qwen3" if model_type.startswith("qwen3") else "qwen2"


def read_rule(directory: str, model_type: str) -> VisionGrids:
    """The token rule of a Qwen-VL model directory's processor configs (module docstring)."""
    d = Path(directory)
    variant = variant_of(model_type)
    image, _ = processor_config(d, "image_processor")  # either layout (runtime/models/hf/processor.py)
    video, _ = processor_config(d, "video_processor")
    patch = int(image.get("patch_size") or IMAGE_DEFAULTS["patch_size"])
    merge = int(image.get("merge_size") or IMAGE_DEFAULTS["merge_size"])
    tp = int(image.get("temporal_patch_size") or IMAGE_DEFAULTS["temporal_patch_size"])
    lo, hi = _limits(image, IMAGE_DEFAULTS)
    vdef = VIDEO_DEFAULTS[variant]
    if variant == "qwen3":  # Qwen3VLVideoProcessor reads `size` alone (module docstring)
        video = {k: v for k, v in video.items() if k not in ("min_pixels", "max_pixels")}
    vlo, vhi = _limits(video, vdef)
    fps = video.get("fps")
    return VisionGrids(
        variant=variant,
        patch=patch,
        merge=merge,
        temporal_patch=int(video.get("temporal_patch_size") or tp),
        min_pixels=lo,
        max_pixels=hi,
        video_min_pixels=vlo,
        video_max_pixels=vhi,
        fps=float(fps) if isinstance(fps, (int, float)) and fps > 0 else DEFAULT_FPS,
        min_frames=int(video.get("min_frames") or vdef["min_frames"]),
        max_frames=int(video.get("max_frames") or vdef["max_frames"]),
        cap_pixels_per_frame=bool(video.get("cap_pixels_per_frame") or False),
        max_video_tokens=int(video.get("max_video_tokens") or vdef["max_video_tokens"]),
    )


def token_rule(spec: ModuleSpec, modality: Modality, model_type: str) -> VisionGrids | None:
    """The family's hook for the index (runtime/data/index.py): the vision tower's rule, checked against the
    spec the planner read (rows of 3·temporal_patch·patch² values, merge² patches a token)."""
    if modality != Modality.VISION or spec.hf is None:
        return None
    rule = read_rule(spec.hf.path, model_type)
    where = str(processor_config(spec.hf.path, "image_processor")[1] or Path(spec.hf.path) / "preprocessor_config.json")
    if spec.input_dim is not None and spec.input_dim != rule.row_width:
        raise SpecError(where, "patch_size", f"rows of {rule.row_width} values, the tower takes {spec.input_dim}")
    if spec.downsample != rule.merge**2:
        raise SpecError(where, "merge_size", f"{rule.merge}² patches a token, the tower merges {spec.downsample}")
    return rule
