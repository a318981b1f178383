"""How a conversation's placeholders expand: each image's or clip's projected rows where its placeholder stood.

As LLaVA's and Qwen2-Audio's processors do, the k-th `<image>` of a conversation becomes the rows of its k-th
image (every vision encoder's, encoder after encoder) and the k-th `<audio>` those of its k-th clip. A
sample's encoder outputs arrive as one prefix per sample (encoder after encoder, each encoder's images or
clips in order: `train/compute.join_prefix`); `conversation_layout` says where each piece of it goes
(`SequenceLayout.interleaved`), from the index's tokens per image or clip, so every rank knows the layout of
every sample without decoding one.

A native-resolution family's tower (a grid rule: runtime/data/index.py `GridRule`) takes `<image>` and `<video>`
alike (`encoder_tags`): its items are the sample's images and videos in text order, and the j-th of those
placeholders takes its j-th item's rows; the family's text around them (`<|vision_start|>` ... `<|vision_end|>`)
is part of the text (`TextCounter.render`), so it is tokenized and counted as text.

One image's or clip's share of an encoder's projected rows: the encoder takes all of a sample's images (or
clips) as one sequence, rounded as the module takes it (`ModuleSpec.round_length`) and pooled by its
projector's `downsample`; piece i's rows end at the pooled count of the tokens up to and including it (the
last piece takes what rounding added). With `downsample` 1, or pieces that are whole multiples of it (a clip
tower's whole LLM tokens), that is each piece's own count exactly.
"""

from __future__ import annotations

import itertools

from orch.planner.hf_config import read_config
from orch.planner.specs import Modality, ModelSpec, ModuleSpec, projected_len
from orch.runtime.data.batch import encoder_order
from orch.runtime.data.index import encoder_tags
from orch.runtime.sample import AUDIO, IMAGE, VIDEO, SequenceLayout

PLACEHOLDER = {Modality.VISION: IMAGE, Modality.AUDIO: AUDIO}
# A placeholder's id in `orch data inspect` where the model names none (LLaVA's repository marks images -200).
NO_TOKEN_ID = {IMAGE: -200, AUDIO: -201, VIDEO: -202}
_CONFIG_KEYS = {
    IMAGE: ("image_token_id", "image_token_index"),
    AUDIO: ("audio_token_id", "audio_token_index"),
    VIDEO: ("video_token_id", "video_token_index"),
}


def media_rows(tokens: list[int], spec: ModuleSpec) -> list[int]:
    """Projected rows of each image or clip of one sample for encoder `spec` (module docstring)."""
    if not tokens:
        return []
    total = projected_len(spec.round_length(sum(tokens)), spec.downsample)
    ends, seen = [], 0
    for n in tokens[:-1]:
        seen += n
        ends.append(min(total, projected_len(seen, spec.downsample)))
    bounds = [0, *ends, total]
    return [b - a for a, b in itertools.pairwise(bounds)]


def placeholder_inserts(
    model: ModelSpec, marks: list[tuple[int, str]], media: dict[str, list[int]]
) -> tuple[int, list[list[tuple[int, int, int]]]]:
    """The prefix's rows, and per placeholder (`marks` order) its inserts (before token, first prefix row,
    rows): the k-th `<image>` takes the k-th image's rows of every vision encoder, encoder after encoder (of an
    encoder taking `<image>` and `<video>`, the j-th of either takes its j-th item)."""
    encoders = encoder_order(model)
    rows = {e: media_rows(media.get(e, []), model.modules[e]) for e in encoders}
    first: dict[tuple[str, int], int] = {}
    prefix = 0
    for e in encoders:
        for i, n in enumerate(rows[e]):
            first[(e, i)] = prefix
            prefix += n
    tags = {e: encoder_tags(model, e) for e in encoders}
    count = dict.fromkeys(encoders, 0)  # per encoder, its items placed so far
    out = []
    for offset, tag in marks:
        inserts = []
        for e in encoders:
            if tag not in tags[e]:
                continue
            i = count[e]
            count[e] += 1
            if (e, i) in first:
                inserts.append((offset, first[(e, i)], rows[e][i]))
        out.append(inserts)
    return prefix, out


def conversation_layout(
    model: ModelSpec, marks: list[tuple[int, str]], text: int, media: dict[str, list[int]]
) -> SequenceLayout:
    """The layout of a sample of `text` tokens whose placeholders stood before the given token offsets
    (`marks`, text order; past the end of a truncated text they append), and whose encoders took `media`
    (tokens per image or clip)."""
    prefix, per_mark = placeholder_inserts(model, marks, media)
    return SequenceLayout.interleaved(prefix, text, [ins for inserts in per_mark for ins in inserts])


def placeholder_ids(model: ModelSpec, tokenizer: object | None = None) -> dict[str, int]:
    """The token id each placeholder's rows carry in `input_ids` (`orch data inspect`): the model's own
    (`image_token_id` / `audio_token_id` of its HF config), else the tokenizer's for `<image>` / `<audio>`,
    else NO_TOKEN_ID."""
    config = read_config(model.llm.hf.path)[1] if model.llm.hf is not None else {}
    if isinstance(config.get("thinker_config"), dict):  # Qwen2.5-Omni: the ids are its thinker's
        config = config["thinker_config"]
    out = {}
    for tag, keys in _CONFIG_KEYS.items():
        got = next((config[k] for k in keys if isinstance(config.get(k), int)), None)
        if got is None and tokenizer is not None:
            got = tokenizer.token_to_id(tag)  # type: ignore[attr-defined]
        out[tag] = int(got) if got is not None else NO_TOKEN_ID[tag]
    return out


def expanded(
    model: ModelSpec,
    layout: SequenceLayout,
    media: dict[str, list[int]],
    ids: list[int],
    labels: list[int],
    token_ids: dict[str, int],
    ignore: int,
    marks: list[tuple[int, str]] | None = None,
) -> tuple[list[int], list[int]]:
    """A sample's whole LLM sequence as Hugging Face's processors give it: `input_ids` with each encoder row
    carrying its placeholder's id (an item's of an encoder taking `<image>` and `<video>`: the id of the
    placeholder it stood for, from `marks`), and `labels` aligned with them (`ignore` on the encoder rows)."""
    tags: list[str] = []  # per prefix row, its placeholder
    for e in encoder_order(model):
        taken = encoder_tags(model, e)
        per_item = media_rows(media.get(e, []), model.modules[e])
        kinds = [tag for _, tag in marks or [] if tag in taken] if len(taken) > 1 else []
        for i, n in enumerate(per_item):
            tags += [kinds[i] if i < len(kinds) else taken[0]] * n
    order = layout.source.tolist() if layout.source is not None else range(layout.length)
    out_ids, out_labels = [], []
    for src in order:
        if src < layout.prefix:
            out_ids.append(token_ids[tags[src]])
            out_labels.append(ignore)
        else:
            out_ids.append(ids[src - layout.prefix])
            out_labels.append(labels[src - layout.prefix])
    return out_ids, out_labels
