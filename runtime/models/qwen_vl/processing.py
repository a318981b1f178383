"""A Qwen-VL tower's input rows: per image or video, `t·h·w` rows of `3·temporal_patch·patch²` values in the
order of Hugging Face's `pixel_values` / `pixel_values_videos` (merge windows contiguous), the grid the index
counted (media.py).

* Images: the model directory's image processor as HF's `AutoImageProcessor` (hence a user's `AutoProcessor`)
  picks it, given the files as hf/processor.py `processor_images` opens them: its torchvision backend where
  torchvision is installed, else `Qwen2VLImageProcessorPil` (conversion to RGB, resize to the `smart_resize`
  grid, rescale, normalise, each image's patches repeated over the temporal patch). The two backends resample
  differently (up to ~0.3 apart in normalised values), so the model is given the pixels HF's own pipeline gives
  it in the same environment.
* Videos: decoded with PyAV, the frames HF's video processor samples (media.py `frame_indices`), each frame
  resized, rescaled and normalised by the PIL image processor's operations (PIL bicubic; HF's torchvision
  video path resizes with torchvision's kernel, so its values differ by resampling alone), the last frame
  repeated to fill a temporal patch, patched as HF's video processor patches: per temporal step, per merge
  window, per patch, `[C, temporal_patch, patch, patch]` values. The video processor config's mean, std and
  rescale factor where it gives them (else its class defaults). A Qwen3-VL video is one item per temporal step
  (media.py `video_items`): its rows split by step, each step's `h·w` rows one tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from orch.planner.specs import ModuleSpec
from orch.runtime.models.hf.processor import processor_images, rows_in_file_order
from orch.runtime.models.qwen_vl.media import NORMALISE_DEFAULTS, VisionGrids, read_rule, video_header
from orch.runtime.sample import EncoderRule


class VisionMedia:
    """The MediaProcessor of a Qwen-VL vision tower (runtime/data/media.py)."""

    def __init__(self, spec: ModuleSpec) -> None:
        from orch.planner.hf_config import read_config

        assert spec.hf is not None and spec.input_dim is not None  # the planner derives both for an HF tower
        self.directory = spec.hf.path
        self.rule: VisionGrids = read_rule(self.directory, str(read_config(self.directory)[1].get("model_type")))
        self.width = spec.input_dim
        self._processor: Any = None
        self._pil: Any = None
        self._video: dict[str, Any] | None = None

    @property
    def processor(self) -> Any:
        """The directory's image processor as `AutoImageProcessor` picks it (loaded once): the images' rows."""
        if self._processor is None:
            from orch.runtime.models.hf.processor import load_processor

            self._processor = load_processor(self.directory, "image")
        return self._processor

    @property
    def pil(self) -> Any:
        """HF's PIL image processor of the directory (loaded once): the video path's resize, rescale, normalise."""
        if self._pil is None:
            import transformers

            transformers.logging.set_verbosity_error()
            cls = transformers.Qwen2VLImageProcessorPil
            self._pil = cls.from_pretrained(self.directory, local_files_only=True)
        return self._pil

    def _video_normalise(self) -> dict[str, Any]:
        """The video processor's rescale and normalisation (its config, else its class defaults)."""
        if self._video is None:
            from orch.runtime.models.hf.processor import processor_config

            cfg, _ = processor_config(self.directory, "video_processor")
            mean, std = NORMALISE_DEFAULTS[self.rule.variant]
            self._video = {
                "do_rescale": cfg.get("do_rescale", True),
                "rescale_factor": cfg.get("rescale_factor", 1 / 255),
                "do_normalize": cfg.get("do_normalize", True),
                "image_mean": cfg.get("image_mean", list(mean)),
                "image_std": cfg.get("image_std", list(std)),
                "resample": cfg.get("resample", 3),  # bicubic
            }
        return self._video

    def inputs(
        self,
        files: tuple[str, ...],
        rule: EncoderRule,
        max_image_tokens: int,
        kinds: tuple[str, ...] | None = None,
    ) -> list[torch.Tensor]:
        """One tensor of rows per item: per image, per video its items' (Qwen3-VL: per temporal step), `kinds`
        saying which files are videos (all images where not given)."""
        return rows_in_file_order(files, kinds, self.image_rows, self.video_item_rows)

    def video_item_rows(self, path: str) -> list[torch.Tensor]:
        """The video's rows per item (media.py `video_items`): all of them, or Qwen3-VL's per temporal step."""
        rows, steps = self._video_patches(path)
        return list(rows.chunk(steps)) if self.rule.variant == "qwen3" else [rows]

    def image_rows(self, files: list[str]) -> list[torch.Tensor]:
        """Each image's rows by HF's image processor (one call for all of a sample's images, split by grid)."""
        out = self.processor(images=processor_images(files), return_tensors="pt")
        sizes = [int(t * h * w) for t, h, w in out["image_grid_thw"].tolist()]
        return list(out["pixel_values"].to(torch.float32).split(sizes))

    def frames(self, path: str) -> tuple[list[Any], tuple[int, int, int, float]]:
        """The video's sampled frames (RGB arrays [H, W, 3], decoded as HF's PyAV reader decodes) and its grid;
        a ValueError where it cannot be decoded as its header promised."""
        import av

        head = video_header(path)
        wanted = self.rule.frame_indices(head.frames, head.rate)
        grid = self.rule.video_grid(head)
        picked = set(wanted)
        got: dict[int, Any] = {}
        try:
            with av.open(path) as container:
                for i, frame in enumerate(container.decode(video=0)):
                    if i > wanted[-1]:
                        break
                    if i in picked:
                        got[i] = frame.to_ndarray(format="rgb24")
        except Exception as exc:  # PyAV's decoding errors
            raise ValueError(f"cannot decode ({type(exc).__name__}: {exc})") from None
        if len(got) < len(picked):
            raise ValueError(f"decoded {len(got)} of the {len(picked)} frames its header promised")
        return [got[i] for i in wanted], grid

    def video_rows(self, path: str) -> torch.Tensor:
        """[t·h·w, C·temporal_patch·patch²] rows of the video at `path` (module docstring)."""
        return self._video_patches(path)[0]

    def _video_patches(self, path: str) -> tuple[torch.Tensor, int]:
        """The video's rows and its temporal steps t."""
        import numpy as np
        from transformers.image_processing_backends import PilBackend
        from transformers.image_utils import SizeDict

        frames, (t, gh, gw, _) = self.frames(path)
        p, m, tp = self.rule.patch, self.rule.merge, self.rule.temporal_patch
        norm, proc = self._video_normalise(), self.pil
        size = SizeDict(height=gh * p, width=gw * p)
        out = []
        for frame in frames:
            image = np.moveaxis(frame, -1, 0)  # [C, H, W] uint8, as the image processor holds an RGB image
            image = PilBackend.resize(proc, image, size=size, resample=norm["resample"])
            if norm["do_rescale"]:
                image = proc.rescale(image, norm["rescale_factor"])
            if norm["do_normalize"]:
                image = proc.normalize(image, norm["image_mean"], norm["image_std"])
            out.append(np.asarray(image, dtype=np.float32))
        out += [out[-1]] * (-len(out) % tp)  # the last frame fills the temporal patch
        video = torch.from_numpy(np.stack(out))  # [frames, C, H, W]
        c = video.shape[1]
        assert video.shape[0] == t * tp, (video.shape, t)
        patches = video.view(t, tp, c, gh // m, m, p, gw // m, m, p).permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
        return patches.reshape(t * gh * gw, c * tp * p * p).contiguous(), t
