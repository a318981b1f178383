"""A conversation as the model takes it: text token ids with labels on the assistant turns
only, and each encoder's input rows, with exactly the token counts the index gives (runtime/data/index.py).

* Text: the model's tokenizer over the chat template's rendering (or the contents one after another where
  there is no template), cut at the placeholders (`TextCounter.tokens`); each image's or clip's rows go where
  its placeholder stood (runtime/data/expansion.py). Labels in the convention of Hugging Face's `labels`
  argument: aligned with `input_ids`, -100 where nothing is trained; a token is trained when it lies in an
  assistant turn's content (character offsets of the rendering). Truncated to what `seq_len` leaves after
  the encoders.
* Images: resized to the index's patch grid and cut into `input_dim` = 3·side² pixel rows in [0, 1]
  (row-major patches, channels last within a patch).
* Audio: 16 kHz mono, log10 mel spectrogram with torch (Whisper's recipe: 400-point Hann STFT, 160 hop,
  `input_dim` HTK mel bins, clamped 8 below the maximum, scaled (x + 4) / 4), the last frame dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from orch.planner.errors import SpecError
from orch.planner.specs import ModelSpec
from orch.runtime.data.conversations import Conversation
from orch.runtime.data.expansion import conversation_layout, expanded, placeholder_ids
from orch.runtime.data.index import (
    IGNORE,
    MEL_HOP,
    MEL_RATE,
    TextCounter,
    TokenRules,
    audio_tokens,
    mel_frames,
    patch_grid,
    projected,
)

N_FFT = 400


@dataclass
class ProcessedSample:
    where: str
    input_ids: list[int]
    labels: list[int]  # aligned with input_ids, IGNORE where not trained
    features: dict[str, torch.Tensor] = field(default_factory=dict)  # encoder -> [rows, input_dim]
    truncated: bool = False
    marks: list[tuple[int, str]] = field(default_factory=list)  # (before token, placeholder), text order
    media: dict[str, list[int]] = field(default_factory=dict)  # encoder -> its tokens per image or clip

    @property
    def trained_tokens(self) -> int:
        return sum(1 for y in self.labels if y != IGNORE)


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


def soundfile_frames(path: str) -> tuple[int, int]:
    """(samples, rate) of the clip at `path`, from its header."""
    import soundfile

    info = soundfile.info(path)
    return int(info.frames), int(info.samplerate)


def waveform_16k(path: str) -> torch.Tensor:
    """The clip at `path`, mono, at 16 kHz (linear resampling from another rate)."""
    import numpy as np
    import soundfile

    wave, rate = soundfile.read(path, dtype="float32", always_2d=True)
    audio = torch.from_numpy(np.ascontiguousarray(wave.mean(axis=1)))
    if rate != MEL_RATE:
        size = max(1, round(audio.numel() * MEL_RATE / rate))
        audio = torch.nn.functional.interpolate(audio[None, None], size=size, mode="linear", align_corners=False)[0, 0]
    return audio


def log_mel(path: str, n_mels: int) -> torch.Tensor:
    """[frames, n_mels] log-mel features of the clip at `path` (module docstring)."""
    audio = waveform_16k(path)
    frames = mel_frames(audio.numel(), MEL_RATE)
    spec = torch.stft(audio, N_FFT, MEL_HOP, window=torch.hann_window(N_FFT), return_complex=True).abs() ** 2
    mel = (_mel_filters(n_mels) @ spec[:, :frames]).clamp(min=1e-10).log10()
    mel = torch.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).T.contiguous()


class HFProcessors:
    """The processors of a model's Hugging Face towers, from each tower's directory, giving orch's input rows:

    * vision (`AutoImageProcessor`: resize, crop, normalisation): each image's [C, S, S] pixels cut into its
      g x g patches, row-major, a patch's C·p·p values channel-first (`HFVisionEncoder.images` reassembles
      them);
    * audio (`AutoFeatureExtractor`, Whisper's): each clip's log-mel frames at 16 kHz, unpadded (the module
      cuts and pads its windows itself), [frames, n_mels], cut or padded with the clip's quietest value to
      the index's whole tokens.
    """

    def __init__(self, model: ModelSpec) -> None:
        self.processors: dict[str, Any] = {}
        for name in model.encoder_names:
            m = model.modules[name]
            if m.hf is None:
                continue
            config = Path(m.hf.path) / "preprocessor_config.json"
            if not config.is_file():
                raise SpecError(str(config), "", "no processor config (save the model's processor beside it)")
            import transformers

            transformers.logging.set_verbosity_error()  # the PIL fallback's notice, once per process
            auto = (
                transformers.AutoImageProcessor
                if model.modality(name).value == "vision"
                else transformers.AutoFeatureExtractor
            )
            self.processors[name] = auto.from_pretrained(m.hf.path)

    def rows(self, name: str, paths: tuple[str, ...], patch: int) -> torch.Tensor:
        from PIL import Image

        images = []
        for f in paths:
            with Image.open(f) as im:
                images.append(im.convert("RGB"))
        pixels = self.processors[name](images=images, return_tensors="pt")["pixel_values"].to(torch.float32)
        n, c, h, w = pixels.shape
        gh, gw = h // patch, w // patch
        tiles = pixels.reshape(n, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5)
        return tiles.reshape(n * gh * gw, c * patch * patch)

    def frames(self, name: str, path: str, rows: int) -> torch.Tensor:
        """One clip's [rows, n_mels] log-mel frames by the tower's feature extractor."""
        audio = waveform_16k(path)
        got = self.processors[name](audio.numpy(), sampling_rate=MEL_RATE, padding="longest", truncation=False,
                                    return_tensors="pt")["input_features"][0].T.to(torch.float32)  # fmt: skip
        if got.shape[0] >= rows:
            return got[:rows]
        return torch.cat([got, got.min().expand(rows - got.shape[0], got.shape[1])])


def encoder_inputs(
    conv: Conversation,
    model: ModelSpec,
    rules: TokenRules,
    encoders: tuple[str, ...] | None = None,
    hf: HFProcessors | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """Each encoder's input rows for `conv` (only `encoders`' where given) and its tokens per image or clip;
    raises OSError/ValueError on a bad file. A Hugging Face tower's inputs come from its own processor."""
    features: dict[str, torch.Tensor] = {}
    media: dict[str, list[int]] = {}
    for r in rules.encoders:
        if encoders is not None and r.name not in encoders:  # only these encoders' media decoded
            continue
        m = model.modules[r.name]
        if m.hf is not None:
            hf = hf or HFProcessors(model)
            dim = m.input_dim or 1
            if r.modality == "vision":
                parts = [hf.rows(r.name, conv.images, math.isqrt(dim // 3))] if conv.images else []
            else:
                parts = []
                for f in conv.audios:
                    n = soundfile_frames(f)
                    parts.append(hf.frames(r.name, f, audio_tokens(r, *n) * r.frames_per_token))
        elif r.modality == "vision":
            parts = [image_rows(f, r.patch or 14, rules.max_image_tokens) for f in conv.images]
            dim = m.input_dim or 3 * (r.patch or 14) ** 2
        else:
            dim = m.input_dim or 128
            parts = []
            for f in conv.audios:
                mel = log_mel(f, dim)
                parts.append(mel[: mel.shape[0] // r.frames_per_token * r.frames_per_token])
        features[r.name] = torch.cat(parts) if parts else torch.zeros(0, dim)
        pieces = len(conv.images if r.modality == "vision" else conv.audios)
        tokens = features[r.name].shape[0] // r.frames_per_token
        media[r.name] = (  # an HF vision tower's processor gives every image the same rows, in one part
            [tokens // pieces] * pieces if len(parts) == 1 else [p.shape[0] // r.frames_per_token for p in parts]
        )
    return features, media


def process(
    conv: Conversation,
    model: ModelSpec,
    rules: TokenRules,
    counter: TextCounter,
    seq_len: int,
    encoders: tuple[str, ...] | None = None,
    hf: HFProcessors | None = None,
) -> ProcessedSample:
    """`conv` as the model takes it (module docstring); raises OSError/ValueError on a bad file."""
    features, media = encoder_inputs(conv, model, rules, encoders, hf)
    text = counter.tokens(conv)
    ids, labels = text.ids, text.labels
    prefix = sum(projected(f.shape[0] // r.frames_per_token, r.downsample) for r in rules.encoders
                 for f in [features.get(r.name)] if f is not None)  # fmt: skip
    room = max(0, seq_len - prefix)
    truncated = len(ids) > room
    return ProcessedSample(conv.where, ids[:room], labels[:room], features, truncated, text.marks, media)


def as_json(sample: ProcessedSample, model: ModelSpec, counter: TextCounter) -> dict[str, Any]:
    """What `orch data inspect --json` prints: the whole LLM sequence as the model's processor makes it
    (`input_ids` with each image's or clip's rows carrying its placeholder's id where the placeholder stood,
    `labels` aligned with them), the text alone, and the encoder inputs' shapes."""
    layout = conversation_layout(model, sample.marks, len(sample.input_ids), sample.media)
    ids, labels = expanded(model, layout, sample.media, sample.input_ids, sample.labels,
                           placeholder_ids(model, counter.tokenizer), IGNORE)  # fmt: skip
    return {
        "where": sample.where,
        "input_ids": ids,
        "labels": labels,
        "text_ids": sample.input_ids,
        "placeholders": [{"before_token": at, "placeholder": tag} for at, tag in sample.marks],
        "encoder_inputs": {k: list(v.shape) for k, v in sample.features.items()},
        "truncated": sample.truncated,
        "trained_tokens": sample.trained_tokens,
    }
