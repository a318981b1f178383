"""A Whisper-style tower's clips by its own feature extractor (`AutoFeatureExtractor` from the tower's
directory): each clip's log-mel frames at 16 kHz, [rows, n_mels], computed as the model's processor computes
them (the clip zero-padded to the extractor's 30 s, so its frames are the processor's `input_features`; a longer
clip whole: the module cuts it into windows), cut or padded with the clip's quietest value to the index's whole
tokens. Where the family's clip rule has context rows (Qwen2-Audio's, media.py): the 3 frames after those, as
the processor computed them, and a length row, every value the clip's real frames (`frames`) less its token
rows."""

from __future__ import annotations

from typing import Any

import torch

from orch.planner.specs import ModuleSpec
from orch.runtime.models.hf.processor import load_processor
from orch.runtime.sample import MEL_RATE, EncoderRule, audio_tokens, soundfile_frames, waveform_16k


class WhisperFeatures:
    def __init__(self, spec: ModuleSpec) -> None:
        assert spec.hf is not None
        self.extractor: Any = load_processor(spec.hf.path, "audio")
        self.width = spec.input_dim or 1

    def inputs(self, files: tuple[str, ...], rule: EncoderRule, max_image_tokens: int) -> list[torch.Tensor]:
        out = []
        for f in files:
            samples, rate = soundfile_frames(f)
            rows = audio_tokens(rule, samples, rate) * rule.frames_per_token
            context = getattr(rule.clips, "context_rows", 0)
            if not context:
                out.append(self.frames(f, rows))
                continue
            got = self.frames(f, rows + context - 1)
            past = rule.clips.frames(samples, rate) - rows  # real frames past the token rows (-1 to 2)
            out.append(torch.cat([got, got.new_full((1, got.shape[1]), float(past))]))
        return out

    def frames(self, path: str, rows: int) -> torch.Tensor:
        """One clip's [rows, n_mels] log-mel frames."""
        audio = waveform_16k(path)
        got = self.extractor(audio.numpy(), sampling_rate=MEL_RATE, padding="max_length", truncation=False,
                             return_tensors="pt")["input_features"][0].T.to(torch.float32)  # fmt: skip
        if got.shape[0] >= rows:
            return got[:rows]
        return torch.cat([got, got.min().expand(rows - got.shape[0], got.shape[1])])
