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

A video with its own audio (`use_audio_in_video`: its mark `SOUNDING_VIDEO`, runtime/data/audio_in_video.py) takes
the next item of its vision encoder and the next clip of its audio encoder (the clips of `<audio>` placeholders
and of sounding videos in text order: `Conversation.clips`): video rows first, then audio rows, or chunk by chunk
as its family's rule says (`GridRule`'s optional `sound_chunks`, given the video's item with its `Sound`). The
video's item carries that `Sound` (`with_sounds`), so its family's token rule, media processor and positions see
which clip goes with it.

One image's or clip's share of an encoder's projected rows: the encoder takes all of a sample's images (or
clips) as one sequence, rounded as the module takes it (`ModuleSpec.round_length`) and pooled by its
projector's `downsample`; piece i's rows end at the pooled count of the tokens up to and including it (the
last piece takes what rounding added). With `downsample` 1, or pieces that are whole multiples of it (a clip
tower's whole LLM tokens), that is each piece's own count exactly.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from orch.planner.hf_config import read_config
from orch.planner.specs import Modality, ModelSpec, ModuleSpec, projected_len
from orch.runtime.data.batch import encoder_order
from orch.runtime.data.index import encoder_tags, grid_rule
from orch.runtime.sample import AUDIO, IMAGE, SOUNDING_VIDEO, VIDEO, MediaItem, SequenceLayout, Sound

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


def placements(model: ModelSpec, marks: list[tuple[int, str]]) -> list[list[tuple[str, int]]]:
    """Per placeholder (`marks` order), the (encoder, its item or clip index) it takes: the k-th `<image>` the k-th
    image of every vision encoder, encoder after encoder (of an encoder taking `<image>` and `<video>`, the j-th of
    either its j-th item); a sounding video its vision encoder's next item and its audio encoder's next clip."""
    encoders = encoder_order(model)
    tags = {e: encoder_tags(model, e) for e in encoders}
    count = dict.fromkeys(encoders, 0)  # per encoder, its items placed so far
    out = []
    for _, tag in marks:
        taken = []
        for e in encoders:
            if tag in tags[e]:
                taken.append((e, count[e]))
                count[e] += 1
        out.append(taken)
    return out


def placeholder_inserts(
    model: ModelSpec,
    marks: list[tuple[int, str]],
    media: dict[str, list[int]],
    items: dict[str, list[MediaItem]] | None = None,
) -> tuple[int, list[list[tuple[int, int, int]]]]:
    """The prefix's rows, and per placeholder (`marks` order) its inserts (before token, first prefix row,
    rows), as `placements` gives each its items; a sounding video's video and audio rows as its family's rule
    chunks them, given its item in `items` (`with_sounds`; None: video rows, then audio rows)."""
    encoders = encoder_order(model)
    rows = {e: media_rows(media.get(e, []), model.modules[e]) for e in encoders}
    first: dict[tuple[str, int], int] = {}
    prefix = 0
    for e in encoders:
        for i, n in enumerate(rows[e]):
            first[(e, i)] = prefix
            prefix += n
    out = []
    for (offset, tag), taken in zip(marks, placements(model, marks), strict=True):
        placed = [(e, i) for e, i in taken if (e, i) in first]
        if tag == SOUNDING_VIDEO:
            out.append(_sound_inserts(model, offset, placed, rows, first, items))
        else:
            out.append([(offset, first[(e, i)], rows[e][i]) for e, i in placed])
    return prefix, out


def _sound_inserts(
    model: ModelSpec,
    offset: int,
    placed: list[tuple[str, int]],
    rows: dict[str, list[int]],
    first: dict[tuple[str, int], int],
    items: dict[str, list[MediaItem]] | None,
) -> list[tuple[int, int, int]]:
    """A sounding video's inserts: each vision encoder's item, then each audio encoder's clip; or, with one of each
    and a family rule with `sound_chunks`, chunk by chunk as the rule says."""
    video = [(e, i) for e, i in placed if model.modality(e) == Modality.VISION]
    audio = [(e, i) for e, i in placed if model.modality(e) == Modality.AUDIO]
    rule = grid_rule(model.modules[video[0][0]], Modality.VISION) if len(video) == 1 and len(audio) == 1 else None
    chunked = getattr(rule, "sound_chunks", None)
    item = items[video[0][0]][video[0][1]] if chunked is not None and items else None
    if item is None or item.sound is None:
        return [(offset, first[(e, i)], rows[e][i]) for e, i in (*video, *audio)]
    (ve, vi), (ae, ai) = video[0], audio[0]
    chunks = list(chunked(item))
    if sum(v for v, _ in chunks) != rows[ve][vi] or sum(a for _, a in chunks) != rows[ae][ai]:
        raise ValueError(f"sound_chunks place {sum(v for v, _ in chunks)} video and {sum(a for _, a in chunks)} audio "
                         f"rows of a video of {rows[ve][vi]} and its sound of {rows[ae][ai]}")  # fmt: skip
    out, v_at, a_at = [], first[(ve, vi)], first[(ae, ai)]
    for v, a in chunks:
        out += [(offset, v_at, v)] if v else []
        out += [(offset, a_at, a)] if a else []
        v_at, a_at = v_at + v, a_at + a
    return out


def with_sounds(
    model: ModelSpec, marks: list[tuple[int, str]], media: dict[str, list[int]], items: dict[str, list[MediaItem]]
) -> dict[str, list[MediaItem]]:
    """`items` (per encoder taking grids, its items in placeholder order) with each sounding video's item carrying
    its `Sound`: its clip's place among its audio encoder's clips and that clip's projected rows."""
    out = {e: list(v) for e, v in items.items()}
    for (_, tag), taken in zip(marks, placements(model, marks), strict=True):
        if tag != SOUNDING_VIDEO:
            continue
        clips = [(e, i) for e, i in taken if model.modality(e) == Modality.AUDIO]
        if not clips:
            continue
        ae, ai = clips[0]
        rows = media_rows(media.get(ae, []), model.modules[ae])
        for e, i in taken:
            if e in out and i < len(out[e]) and ai < len(rows):
                out[e][i] = replace(out[e][i], sound=Sound(ai, rows[ai]))
    return out


def conversation_layout(
    model: ModelSpec,
    marks: list[tuple[int, str]],
    text: int,
    media: dict[str, list[int]],
    items: dict[str, list[MediaItem]] | None = None,
) -> SequenceLayout:
    """The layout of a sample of `text` tokens whose placeholders stood before the given token offsets
    (`marks`, text order; past the end of a truncated text they append), and whose encoders took `media`
    (tokens per image or clip); `items`: its grid encoders' items (`with_sounds`), where a sounding video's
    family chunks it."""
    prefix, per_mark = placeholder_inserts(model, marks, media, items)
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
            kind = kinds[i] if i < len(kinds) else taken[0]
            if kind == SOUNDING_VIDEO:  # its video's rows are video rows, its sound's audio rows
                kind = AUDIO if model.modality(e) == Modality.AUDIO else VIDEO
            tags += [kind] * n
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
