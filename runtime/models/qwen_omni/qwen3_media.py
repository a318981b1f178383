"""Qwen3-Omni's token rules for the index (torch-free), as `Qwen3OmniMoeProcessor` counts and writes them.

* A clip: its log-mel frames `l` as Qwen2.5-Omni's (every started 160-sample hop at 16 kHz), its LLM tokens
  13 a full chunk of 2·n_window frames plus the conv's of the rest (qwen3_config.py `clip_tokens`; a clip past
  30 s counted whole), between the tokenizer's `audio_bos_token` and `audio_eos_token`. The tower's tokens are the
  LLM's (no pool): the index keeps the LLM tokens, and a clip's input rows are its frames 4 a row, 2 rows a token
  (8 frames, at least each token's), then one length row holding `l`, from which the tower takes the clip's `l`
  frames (qwen3_audio.py).
* An image or video: Qwen2-VL's image and video processors at the directory's patch size, as for Qwen2.5-Omni
  (media.py), between the tokenizer's `vision_bos_token` and `vision_eos_token`. A video with its own sound
  (`use_audio_in_video`): `<vision_bos><audio_bos>`, then its video rows and its clip's rows merged by time, as
  the processor's `replace_video_with_audio_token` writes them: a video row at its temporal step's time (step ·
  seconds · position_id_per_seconds), audio row j at time j, a video row first where its time is not past the
  audio row's, the rest of either at the end; then `<audio_eos><vision_eos>` (`Omni3Grids.sound_chunks`: the runs
  of video rows and audio rows in order). A video's seconds per temporal step follow orch's Qwen2.5-VL rule, as
  for Qwen2.5-Omni.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from dataclasses import fields as fields_of
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from orch.planner.specs import Modality, ModuleSpec
from orch.runtime.models.qwen_omni.media import OmniGrids
from orch.runtime.models.qwen_omni.qwen3_config import FRAMES_PER_ROW, clip_tokens
from orch.runtime.models.qwen_vl.media import VisionGrids
from orch.runtime.models.qwen_vl.media import token_rule as qwen_vl_rule
from orch.runtime.sample import MEL_HOP, MEL_RATE

if TYPE_CHECKING:
    from orch.runtime.sample import MediaItem

# Qwen3-Omni's tokenizer's roles as published, where a directory's tokenizer_config.json names none
ROLES = {"audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>",
         "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"}  # fmt: skip
CONTEXT_ROWS = 1  # a clip's rows past its tokens': the length row
ROWS_PER_TOKEN = 2  # the data's rows a token of an audio encoder (planner/specs.py Modality.frames_per_token)


def roles(directory: str) -> dict[str, str]:
    """The tokenizer's bos/eos tokens of the directory (tokenizer_config.json, top level or extra_special_tokens),
    the published ones where it names none."""
    path = Path(directory) / "tokenizer_config.json"
    got: dict[str, Any] = {}
    if path.is_file():
        raw = json.loads(path.read_text())
        got = {**(raw.get("extra_special_tokens") or {}), **raw} if isinstance(raw, dict) else {}
    out = {}
    for key, default in ROLES.items():
        value = got.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        out[key] = value if isinstance(value, str) and value else default
    return out


@dataclass(frozen=True)
class Omni3Clips:
    """A Qwen3-Omni clip's tokens and the text around its rows (module docstring)."""

    n_window: int
    wrap: tuple[str, str] = (ROLES["audio_bos_token"], ROLES["audio_eos_token"])
    context_rows: ClassVar[int] = CONTEXT_ROWS
    frames_per_row: ClassVar[int] = FRAMES_PER_ROW

    def frames(self, num_samples: int, rate: int) -> int:
        """The clip's log-mel frames as the processor counts them: every started hop at 16 kHz."""
        samples = num_samples if rate == MEL_RATE else round(num_samples * MEL_RATE / rate)
        return math.ceil(samples / MEL_HOP)

    def tokens(self, num_samples: int, rate: int) -> int:
        """The clip's LLM tokens (the index keeps these: the tower does not pool); a ValueError for no frame."""
        frames = self.frames(num_samples, rate)
        if frames < 1:
            raise ValueError("a clip of no log-mel frame gives no audio token")
        return clip_tokens(frames, self.n_window)

    llm_tokens = tokens


@dataclass(frozen=True)
class Omni3Grids(OmniGrids):
    """Qwen2-VL's grids with Qwen3-Omni's video-with-sound order (module docstring)."""

    def sound_chunks(self, item: MediaItem) -> list[tuple[int, int]]:
        """(video rows, audio rows) of each run, video run then audio run, in the order the processor writes them
        (module docstring)."""
        sound = item.sound
        if sound is None:
            raise ValueError("a video without its sound has no chunks")
        t, h, w = item.grid
        per_step = (h // self.merge) * (w // self.merge)
        times = [step * item.seconds * self.position_id_per_seconds for step in range(t)]
        out: list[tuple[int, int]] = []
        audio = 0
        for at in times:
            upto = min(sound.rows, max(audio, math.ceil(at)))  # audio rows j < at come before this step's rows
            if upto > audio:
                out.append((0, upto - audio))
            audio = upto
            out.append((per_step, 0))
        if audio < sound.rows:
            out.append((0, sound.rows - audio))
        return merge_runs(out)


def merge_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(video, audio) pairs, each a video run then an audio run: consecutive runs of one kind joined."""
    out: list[tuple[int, int]] = []
    for v, a in runs:
        if out and v and not out[-1][1]:
            out[-1] = (out[-1][0] + v, a)
        elif out and not v:
            out[-1] = (out[-1][0], out[-1][1] + a)
        else:
            out.append((v, a))
    return out


def token_rule(spec: ModuleSpec, modality: Modality, n_window: int, per_second: int) -> Omni3Clips | Omni3Grids | None:
    """The rule of the thinker's tower `spec` (qwen3_family.py `QwenOmni3.token_rule`)."""
    if spec.hf is None:
        return None
    words = roles(spec.hf.path)
    if modality == Modality.AUDIO:
        return Omni3Clips(n_window, (words["audio_bos_token"], words["audio_eos_token"]))
    rule = qwen_vl_rule(spec, modality, "qwen2_5_vl")
    if rule is None:
        return None
    fields = {f.name: getattr(rule, f.name) for f in fields_of(VisionGrids)}
    wrap = (words["vision_bos_token"], words["vision_eos_token"])
    return Omni3Grids(**{**fields, "wrap": wrap}, position_id_per_seconds=per_second)
