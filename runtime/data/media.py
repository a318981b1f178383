"""Each encoder's input rows from its media files, by the processor of its kind: orch's own for the reference
modules (here), its family's for a Hugging Face tower (`Family.media_processor`, found through
runtime/models/registry.py). A processor returns one tensor per image or clip, `width` values a row; the rows per
file are the tokens the index counted from the file's header times the encoder's frames per token.

* orch's images: resized to the index's patch grid and cut into `input_dim` = 3·side² pixel rows in [0, 1]
  (row-major patches, channels last within a patch);
* orch's audio: 16 kHz mono, log10 mel spectrogram with torch (Whisper's recipe: 400-point Hann STFT, 160 hop,
  `input_dim` HTK mel bins, clamped 8 below the maximum, scaled (x + 4) / 4), the last frame dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from orch.planner.specs import Modality, ModelSpec, ModuleSpec
from orch.runtime.data.index import patch_grid
from orch.runtime.models.registry import family_of_spec
from orch.runtime.sample import MEL_HOP, MEL_RATE, EncoderRule, MediaProcessor, mel_frames, waveform_16k

N_FFT = 400


def media_processors(model: ModelSpec) -> dict[str, MediaProcessor]:
    """Each encoder's processor: its family's for a Hugging Face tower (`Family.media_processor`), orch's
    for the reference modules."""
    out: dict[str, MediaProcessor] = {}
    for name in model.encoder_names:
        spec, modality = model.modules[name], model.modality(name)
        family = family_of_spec(spec)
        out[name] = reference_processor(spec, modality) if family is None else family.media_processor(spec, modality)
    return out


def reference_processor(spec: ModuleSpec, modality: Modality) -> MediaProcessor:
    if modality == Modality.VISION:
        return PatchImages(spec.input_dim or 3 * 14 * 14)
    return LogMelAudio(spec.input_dim or 128)


@dataclass(frozen=True)
class PatchImages:
    width: int

    def inputs(self, files: tuple[str, ...], rule: EncoderRule, max_image_tokens: int) -> list[torch.Tensor]:
        return [image_rows(f, rule.patch or 14, max_image_tokens) for f in files]


@dataclass(frozen=True)
class LogMelAudio:
    width: int

    def inputs(self, files: tuple[str, ...], rule: EncoderRule, max_image_tokens: int) -> list[torch.Tensor]:
        out = []
        for f in files:
            mel = log_mel(f, self.width)
            out.append(mel[: mel.shape[0] // rule.frames_per_token * rule.frames_per_token])
        return out


def image_rows(path: str, patch: int, cap: int) -> torch.Tensor:
    """[patches, 3·patch²] pixels in [0, 1] of the image at `path` on the index's patch grid."""
    from PIL import Image

    with Image.open(path) as im:
        cols, rows = patch_grid(patch, *im.size, cap)
        rgb = im.convert("RGB").resize((cols * patch, rows * patch), Image.Resampling.BICUBIC)
        data = torch.frombuffer(bytearray(rgb.tobytes()), dtype=torch.uint8)
    pixels = data.view(rows * patch, cols * patch, 3).to(torch.float32) / 255.0
    tiles = pixels.view(rows, patch, cols, patch, 3).permute(0, 2, 1, 3, 4)
    return tiles.reshape(rows * cols, patch * patch * 3)


def _mel_filters(n_mels: int, n_fft: int = N_FFT, rate: int = MEL_RATE) -> torch.Tensor:
    """[n_mels, n_fft // 2 + 1] triangular HTK mel filters over 0..rate/2."""

    def mel(f: torch.Tensor) -> torch.Tensor:
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    freqs = torch.linspace(0, rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = 700.0 * (
        10 ** (torch.linspace(0, float(mel(torch.tensor(rate / 2.0))), n_mels + 2, dtype=torch.float64) / 2595.0) - 1
    )
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None, :] - lower) / (centre - lower)
    down = (upper - freqs[None, :]) / (upper - centre)
    return torch.clamp(torch.minimum(up, down), min=0).to(torch.float32)


def log_mel(path: str, n_mels: int) -> torch.Tensor:
    """[frames, n_mels] log-mel features of the clip at `path` (module docstring)."""
    audio = waveform_16k(path)
    frames = mel_frames(audio.numel(), MEL_RATE)
    spec = torch.stft(audio, N_FFT, MEL_HOP, window=torch.hann_window(N_FFT), return_complex=True).abs() ** 2
    mel = (_mel_filters(n_mels) @ spec[:, :frames]).clamp(min=1e-10).log10()
    mel = torch.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).T.contiguous()
