"""A conversation as the model takes it: text token ids with labels on the assistant turns
only, and each encoder's input rows, with exactly the token counts the index gives (runtime/data/index.py).

* Text: the model's tokenizer over the chat template's rendering (or the contents one after another where
  there is no template), cut at the placeholders (`TextCounter.tokens`); each image's or clip's rows go where
  its placeholder stood (runtime/data/expansion.py). Labels in the convention of Hugging Face's `labels`
  argument: aligned with `input_ids`, -100 where nothing is trained; a token is trained when it lies in an
  assistant turn's content (character offsets of the rendering). Truncated to what `seq_len` leaves after
  the encoders.
* Images, videos and audio: each encoder's input rows by its media processor (runtime/data/media.py: orch's
  for the reference modules, the family's for a Hugging Face tower), one tensor per image or clip; an encoder
  taking `<image>` and `<video>` (a grid rule's) gets the sample's images and videos in placeholder order,
  with their kinds, and gives one tensor per item (a video of several items, as Qwen3-VL's temporal steps:
  one each, in order, each after its own mark in the text: `TextCounter.render`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from orch.planner.specs import ModelSpec, projected_len
from orch.runtime.data.conversations import BadSample, Conversation
from orch.runtime.data.expansion import conversation_layout, expanded, placeholder_ids, with_sounds
from orch.runtime.data.index import IGNORE, TextCounter, TokenRules, encoder_items, video_texts
from orch.runtime.data.media import media_processors
from orch.runtime.sample import MediaItem, MediaProcessor


@dataclass
class ProcessedSample:
    where: str
    input_ids: list[int]
    labels: list[int]  # aligned with input_ids, IGNORE where not trained
    features: dict[str, torch.Tensor] = field(default_factory=dict)  # encoder -> [rows, input_dim]
    truncated: bool = False
    marks: list[tuple[int, str]] = field(default_factory=list)  # (before token, placeholder), text order
    media: dict[str, list[int]] = field(default_factory=dict)  # encoder -> its tokens per image or clip
    items: dict[str, list[MediaItem]] = field(default_factory=dict)  # grid encoder -> its items (`with_sounds`)

    @property
    def trained_tokens(self) -> int:
        return sum(1 for y in self.labels if y != IGNORE)


def encoder_inputs(
    conv: Conversation,
    model: ModelSpec,
    rules: TokenRules,
    encoders: tuple[str, ...] | None = None,
    processors: dict[str, MediaProcessor] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """Each encoder's input rows for `conv` (only `encoders`' where given) and its tokens per image or clip, by
    the encoder's media processor (its family's: runtime/data/media.py); raises OSError/ValueError on a bad
    file."""
    processors = processors if processors is not None else media_processors(model)
    features: dict[str, torch.Tensor] = {}
    media: dict[str, list[int]] = {}
    for r in rules.encoders:
        if encoders is not None and r.name not in encoders:  # only these encoders' media decoded
            continue
        proc = processors[r.name]
        if r.grids is not None and not r.grids.no_video:  # images and videos in placeholder order
            visual = conv.visual()
            files = tuple(path for _, _, path in visual)
            kinds = tuple(tag for tag, _, _ in visual)
            parts = proc.inputs(files, r, rules.max_image_tokens, kinds=kinds) if files else []
        else:  # an audio encoder's clips: each `<audio>`'s and each sounding video's sound, in placeholder order
            files = conv.images if r.modality == "vision" else tuple(path for _, path in conv.clips())
            parts = proc.inputs(files, r, rules.max_image_tokens) if files else []
        features[r.name] = torch.cat(parts) if parts else torch.zeros(0, proc.width)
        context = getattr(r.clips, "context_rows", 0)  # a clip's rows past its tokens' (qwen2_audio/media.py)
        media[r.name] = [(p.shape[0] - context) // r.frames_per_token for p in parts]
    return features, media


def process(
    conv: Conversation,
    model: ModelSpec,
    rules: TokenRules,
    counter: TextCounter,
    seq_len: int,
    encoders: tuple[str, ...] | None = None,
    processors: dict[str, MediaProcessor] | None = None,
) -> ProcessedSample:
    """`conv` as the model takes it (module docstring); raises OSError/ValueError on a bad file."""
    features, media = encoder_inputs(conv, model, rules, encoders, processors)
    items = encoder_items(conv, rules) if conv.videos else {}  # the text around each video's items (timestamps)
    if isinstance(items, BadSample):
        raise ValueError(str(items))
    text = counter.tokens(conv, video_texts(rules, conv, items))
    ids, labels = text.ids, text.labels
    prefix = sum(projected_len(sum(media[r.name]), r.downsample) for r in rules.encoders if r.name in media)
    room = max(0, seq_len - prefix)
    truncated = len(ids) > room
    grids = {e: [MediaItem((t, h, w), s) for its in per for t, h, w, s in its] for e, per in items.items()}
    grids = with_sounds(model, text.marks, media, grids)
    return ProcessedSample(conv.where, ids[:room], labels[:room], features, truncated, text.marks, media, grids)


def as_json(sample: ProcessedSample, model: ModelSpec, counter: TextCounter) -> dict[str, Any]:
    """What `orch data inspect --json` prints: the whole LLM sequence as the model's processor makes it
    (`input_ids` with each image's or clip's rows carrying its placeholder's id where the placeholder stood,
    `labels` aligned with them), the text alone, and the encoder inputs' shapes."""
    layout = conversation_layout(model, sample.marks, len(sample.input_ids), sample.media, sample.items)
    ids, labels = expanded(model, layout, sample.media, sample.input_ids, sample.labels,
                           placeholder_ids(model, counter.tokenizer), IGNORE, sample.marks)  # fmt: skip
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
