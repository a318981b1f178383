"""The token index of a user's data: each sample's tokens per module, without decoding pixels or audio.

Image sizes come from the file header (Pillow opens lazily), audio durations from the header
(soundfile), text tokens from the model's tokenizer (`tokenizers`) over the chat template's rendering
(`TextCounter.render`). Per sample and module, as the runtime takes them (`ModuleSpec.round_length`):

* a vision encoder: per image, `image_tokens` for a fixed-size tower (the processor resizes every image);
  a native-resolution family's tower (its `Family.token_rule`, e.g. Qwen-VL's): per image or
  video its patch grid `t·h·w` by the family's rule (`GridRule`), in placeholder order; else the image's
  patches at its own resolution (patch side from `input_dim` = 3·side²), the image scaled down where they
  exceed `max_image_tokens`;
* an audio encoder: log-mel frames (`mel_frames`: 100 a second) over `frames_per_token`; a windowed tower
  (Whisper, Qwen2-Audio: clips of clip_tokens x frames_per_token frames, each padded inside the module)
  takes whole LLM tokens, a multiple of its `downsample` (`ModuleSpec.round_length`);
* the LLM: the text's tokens (the rendering cut at its placeholders, each piece tokenized alone, as a
  processor's tokenizer splits at the expanded placeholder tokens) plus every encoder's projected tokens
  (its `downsample`).

The index is a manifest (planner/data.py reads it: one `{"lengths": {...}, "where": "file:line"}` per
sample, `"media": {encoder: [tokens per image or clip]}` where a sample has several, and for a grid rule's
encoder `"items": {encoder: [[t, h, w, seconds], ...]}` per item in placeholder order, an image one item and a
video one or more (its family's rule: Qwen3-VL's, one per temporal step), with `"placeholder_items": {encoder:
[items of each placeholder]}` where a placeholder has more than one) beside the data,
under `.orch-index/` where the data's folder is writable, else under `$XDG_CACHE_HOME/orch/index` (default
`~/.cache/orch/index`), or in `--index-dir`; keyed by the data file (path, size, mtime), the token rules, the
tokenizer file, the media root and the mix, so a changed file, model or tokenizer is indexed afresh. A mix
file's manifest holds every valid row of every source once, source after source; how they are drawn is the
mix's (runtime/data/mix.py). Written atomically with a summary (samples; per source its weight, rows, bad
samples with `file:line: what is wrong`, and samples that train no token).
"""

from __future__ import annotations

import bisect
import errno
import hashlib
import itertools
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from orch.planner.errors import SpecError
from orch.planner.io import write_text_atomic
from orch.planner.specs import Modality, ModelSpec, ModuleSpec, projected_len
from orch.runtime.data.conversations import (
    TRAINED_ROLES,
    BadSample,
    Conversation,
    Source,
    read_conversations,
    read_sources,
)
from orch.runtime.data.layouts import tool_calls
from orch.runtime.models.hf.processor import CONFIG_FILES
from orch.runtime.sample import (
    AUDIO,
    IMAGE,
    MEL_HOP,
    MEL_RATE,
    SOUNDING_VIDEO,
    VIDEO,
    ClipRule,
    EncoderRule,
    GridRule,
    audio_tokens,
)

DEFAULT_MAX_IMAGE_TOKENS = 1024
INDEX_DIR = ".orch-index"
INDEX_VERSION = 9  # part of the cache key: an index of another layout is made afresh


def _stamp(directory: str) -> tuple[int, ...]:
    """The processor configs' mtimes: a cached rule is read afresh when they change."""
    d = Path(directory)
    names = ("config.json", *CONFIG_FILES)
    return tuple((d / n).stat().st_mtime_ns if (d / n).is_file() else 0 for n in names)


@lru_cache(maxsize=64)
def _family_rule(spec_json: str, modality: str, stamp: tuple[int, ...]) -> Any:
    from orch.runtime.models.registry import family_of_spec

    spec = ModuleSpec.model_validate_json(spec_json)
    family = family_of_spec(spec)
    return family.token_rule(spec, Modality(modality)) if family is not None else None


def grid_rule(spec: ModuleSpec, modality: Modality) -> GridRule | None:
    """A Hugging Face tower's family rule (`GridRule`), None for every other encoder (fixed tokens per image,
    orch's patches, clips by duration)."""
    if spec.hf is None or modality != Modality.VISION:
        return None
    rule: GridRule | None = _family_rule(spec.model_dump_json(), modality.value, _stamp(spec.hf.path))
    return rule


def clip_rule(spec: ModuleSpec, modality: Modality) -> ClipRule | None:
    """A Hugging Face audio tower's family rule (`ClipRule`), None for every other encoder (clips by duration)."""
    if spec.hf is None or modality != Modality.AUDIO:
        return None
    rule: ClipRule | None = _family_rule(spec.model_dump_json(), modality.value, _stamp(spec.hf.path))
    return rule


def placeholder_wraps(model: ModelSpec) -> tuple[tuple[str, str, str], ...]:
    """(placeholder, text before, text after) each of its images', videos' or clips' rows, where the family wraps
    them (Qwen-VL's `<|vision_start|>` ... `<|vision_end|>`, Qwen2-Audio's `<|audio_bos|>` ... `<|audio_eos|>`:
    text tokens, counted in the text)."""
    out: list[tuple[str, str, str]] = []
    for name in sorted(model.encoder_names):
        clips = clip_rule(model.modules[name], model.modality(name))
        if clips is not None and any(clips.wrap):
            out.append((AUDIO, *clips.wrap))
        rule = grid_rule(model.modules[name], model.modality(name))
        if rule is not None and any(rule.wrap):
            before, after = rule.wrap
            out += [(IMAGE, before, after)] + ([(VIDEO, before, after)] if not rule.no_video else [])
    return tuple(dict.fromkeys(out))


def encoder_tags(model: ModelSpec, name: str) -> tuple[str, ...]:
    """The placeholders whose files encoder `name` takes, each in text order: `<audio>`; `<image>`, and `<video>`
    where its family's rule takes videos (the j-th of them takes the encoder's j-th item); a video with its own
    audio (`SOUNDING_VIDEO`) gives its video to the latter and its sound to the former."""
    modality = model.modality(name)
    if modality == Modality.AUDIO:
        return (AUDIO, SOUNDING_VIDEO)
    rule = grid_rule(model.modules[name], modality)
    return (IMAGE, VIDEO, SOUNDING_VIDEO) if rule is not None and not rule.no_video else (IMAGE,)


@dataclass(frozen=True)
class TokenRules:
    """How a model counts a sample's tokens per module (module docstring)."""

    llm: str
    encoders: tuple[EncoderRule, ...]
    max_image_tokens: int = DEFAULT_MAX_IMAGE_TOKENS

    @classmethod
    def of(cls, model: ModelSpec, max_image_tokens: int = DEFAULT_MAX_IMAGE_TOKENS) -> TokenRules:
        rules = []
        for name in sorted(model.encoder_names):
            m = model.modules[name]
            modality = model.modality(name)
            grids = grid_rule(m, modality)
            if grids is not None:
                rules.append(EncoderRule(name, "vision", m.downsample, grids=grids))
            elif modality == Modality.VISION:
                dim = m.input_dim or Modality.VISION.default_input_dim or 588
                side = math.isqrt(dim // 3)
                if side * side * 3 != dim and m.image_tokens is None:
                    raise SpecError(
                        f"modules.{name}", "input_dim", f"{dim} is not the pixels of an RGB square patch (3·side²)"
                    )
                rules.append(EncoderRule(name, "vision", m.downsample, image_tokens=m.image_tokens, patch=side))
            elif modality == Modality.AUDIO:
                rules.append(
                    EncoderRule(
                        name,
                        "audio",
                        m.downsample,
                        clip_tokens=m.clip_tokens,
                        frames_per_token=modality.frames_per_token,
                        clips=clip_rule(m, modality),
                    )
                )
            else:
                raise SpecError(f"modules.{name}", "modality", "the data index counts vision and audio encoders only")
        return cls(model.llm_name, tuple(rules), max_image_tokens)

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def patch_grid(patch: int, width: int, height: int, cap: int) -> tuple[int, int]:
    """Columns and rows of `patch`-pixel patches a reference tower cuts an image into: its own resolution
    (edges padded to whole patches), scaled down, aspect kept, where that exceeds `cap` patches."""
    cols, rows = math.ceil(width / patch), math.ceil(height / patch)
    if cols * rows > cap:
        scale = math.sqrt(cap / (cols * rows))
        cols, rows = max(1, math.floor(cols * scale)), max(1, math.floor(rows * scale))
    return cols, rows


def image_tokens(rule: EncoderRule, width: int, height: int, cap: int) -> int:
    """Encoder tokens of one image of width x height pixels (module docstring)."""
    if rule.image_tokens is not None:
        return rule.image_tokens
    cols, rows = patch_grid(rule.patch or 14, width, height, cap)
    return cols * rows


IGNORE = -100  # a label not trained on (Hugging Face's ignore_index)
# an item (t, h, w, seconds): a video's seconds per temporal step, or a Qwen3-VL frame group's timestamp
Item = tuple[int, int, int, float]
VideoTexts = list[list[str]] | None  # per `<video>`, the text before each of its items' rows (`video_texts`)
# Stand-ins for the placeholders while the chat template renders (private-use characters no template alters).
_MARKS = {IMAGE: "\ue000", AUDIO: "\ue001", VIDEO: "\ue002", SOUNDING_VIDEO: "\ue004"}
_PLACEHOLDER_OF = {v: k for k, v in _MARKS.items()}
_PROBE = "\ue003"  # an assistant turn's content that shares no character with a tool call's text
# a template that marks what trains itself (transformers' test for `return_assistant_tokens_mask`)
_GENERATION = re.compile(r"\{\%-?\s*generation\s*-?\%\}")


@dataclass
class TextTokens:
    """A conversation's text tokens: ids, labels (aligned with the ids, IGNORE outside the assistant
    contents), and where each placeholder stood (before token `offset`), in text order."""

    ids: list[int]
    labels: list[int]
    marks: list[tuple[int, str]]  # (token offset, IMAGE, VIDEO, AUDIO or SOUNDING_VIDEO)


@dataclass(frozen=True)
class Rendering:
    """A conversation's text as the chat template makes it, placeholders cut out: the text, the character
    spans that train (its assistant contents through their end of turn, or the template's `{% generation %}`
    blocks), and the character offset of each placeholder (in order)."""

    text: str
    spans: list[tuple[int, int]]
    marks: list[tuple[int, str]]  # (character offset, IMAGE or AUDIO)

    def segments(self) -> list[str]:
        """The text cut at the placeholders: tokenized one by one, as a processor's tokenizer splits the text
        at the expanded placeholder tokens (special tokens)."""
        cuts = [0, *(at for at, _ in self.marks), len(self.text)]
        return [self.text[a:b] for a, b in itertools.pairwise(cuts)]


class ChatFormat(NamedTuple):
    """How a model's text is made: its tokenizer file, its chat template (None: contents one a line), the
    special tokens the template may name (`bos_token`, `eos_token`, as `apply_chat_template` passes them) and
    the text its family puts around a placeholder's rows (`TokenRules.wraps`)."""

    tokenizer_file: str
    template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    wraps: tuple[tuple[str, str, str], ...] = ()

    def key(self) -> str:
        return "\x00".join((self.template or "", self.bos_token, self.eos_token, json.dumps(self.wraps)))


class TextCounter:
    """Tokens of a conversation's text as the model's tokenizer and chat template make it (`render`)."""

    def __init__(
        self,
        tokenizer_file: str,
        template: str | None = None,
        bos_token: str = "",
        eos_token: str = "",
        wraps: tuple[tuple[str, str, str], ...] = (),
    ) -> None:
        from tokenizers import Tokenizer

        # each placeholder's stand-in while the template renders, with its family's text around it
        self._stand_in = {tag: mark for tag, mark in _MARKS.items()}
        self._wraps = {tag: ("", "") for tag in _MARKS}
        for tag, before, after in wraps:
            self._stand_in[tag] = before + _MARKS[tag] + after
            self._wraps[tag] = (before, after)

        self.tokenizer = Tokenizer.from_file(tokenizer_file)
        self.template = template
        self.specials = {"bos_token": bos_token, "eos_token": eos_token}
        specials = {t.content for t in self.tokenizer.get_added_tokens_decoder().values() if t.special}
        self._ends = sorted((specials | {eos_token}) - {""}, key=len, reverse=True)  # the longest match first
        self._compiled: Any = None
        self._generation = template is not None and _GENERATION.search(template) is not None
        if template is not None:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            self._compiled = _compile_jinja_template(template)  # apply_chat_template's own environment and filters

    def _turn_end(self, text: str, start: int, stop: int) -> int:
        """Where an assistant turn's training ends: after the special token (end of turn, eos) that the template
        puts after its content at `start` (only whitespace between), searched up to `stop`; else at `start`.
        The model learns to end its turn, as LLaMA-Factory and ms-swift train the template's turn suffix."""
        gap = len(text[start:stop]) - len(text[start:stop].lstrip())
        at = start + gap
        for token in self._ends:
            if at + len(token) <= stop and text.startswith(token, at):
                return at + len(token)
        return start

    def _raw(self, messages: list[tuple[str, str]], tools: str = "") -> tuple[str, list[tuple[int, int]]]:
        """The rendering with the placeholders' marks in it, and the trained turns' spans (assistant contents and
        tool calls, through the template's end-of-turn token)."""
        if self._compiled is None:
            text, spans = "", []
            for role, content in messages:
                if role in TRAINED_ROLES:
                    spans.append((len(text), len(text) + len(content)))
                text += content + "\n"
            return text, spans
        extra = {"tools": json.loads(tools)} if tools else {}
        turns = [self._turn(role, content) for role, content in messages]

        def rendered(upto: list[dict[str, Any]]) -> str:
            import jinja2

            try:
                return str(self._compiled.render(messages=upto, add_generation_prompt=False, **self.specials, **extra))
            except jinja2.TemplateError as exc:  # the template's raise_exception: a sample it refuses
                raise ValueError(f"the chat template refuses it: {exc}") from None

        text = rendered(turns)
        found: list[tuple[str, int, int]] = []
        start = 0
        for k, (role, content) in enumerate(messages):
            if "tool_calls" in turns[k]:  # a call as the template writes it (rendering diffs, no text to find)
                call = self._call_span(rendered, turns, k, text)
                if call is not None:
                    found.append((role, *call))
                    start = call[1]
                    continue
                turns[k] = {"role": "assistant", "content": content}  # a template without tool calls: the JSON text
                text = rendered(turns)
            at = text.find(content, start) if content else -1
            if at < 0:
                continue
            found.append((role, at, at + len(content)))
            start = at + len(content)
        if self._generation:
            return self._generated(turns, extra)
        spans = []
        for k, (role, a, b) in enumerate(found):
            if role in TRAINED_ROLES:
                stop = found[k + 1][1] if k + 1 < len(found) else len(text)
                spans.append((a, self._turn_end(text, b, stop)))
        return text, spans

    def _generated(self, turns: list[dict[str, Any]], extra: dict[str, Any]) -> tuple[str, list[tuple[int, int]]]:
        """The rendering and its `{% generation %}` blocks' spans, as `apply_chat_template(...,
        return_assistant_tokens_mask=True)` renders and finds them: where the template says what trains."""
        import jinja2
        from transformers.utils.chat_template_utils import _render_with_assistant_indices

        try:
            text, spans = _render_with_assistant_indices(self._compiled, turns, extra.get("tools"), None, False,
                                                         **self.specials)  # fmt: skip
        except jinja2.TemplateError as exc:
            raise ValueError(f"the chat template refuses it: {exc}") from None
        return str(text), [(int(a), int(b)) for a, b in spans]

    @staticmethod
    def _turn(role: str, content: str) -> dict[str, Any]:
        """A turn as chat templates take it: a function_call turn as an assistant turn's `tool_calls`, an
        observation as role `tool` (HF's and OpenAI's convention)."""
        if role == "function_call":
            calls = tool_calls(content)
            if calls is not None:
                return {"role": "assistant", "content": "", "tool_calls": calls}
            return {"role": "assistant", "content": content}
        return {"role": role, "content": content}

    @staticmethod
    def _call_span(rendered: Any, turns: list[dict[str, Any]], k: int, text: str) -> tuple[int, int] | None:
        """Where turn k's tool calls stand in `text`: what the template writes for them in place of an assistant
        turn of one private-use character (the turn's header and end are what both share); None where the template
        writes no call (its name absent) or a turn's rendering is no prefix of the whole."""
        before = rendered(turns[:k])
        probe = rendered([*turns[:k], {"role": "assistant", "content": _PROBE}])
        upto = rendered(turns[: k + 1])
        names = [c["function"]["name"] for c in turns[k]["tool_calls"]]
        if not (upto.startswith(before) and text.startswith(upto)) or not all(n in upto[len(before) :] for n in names):
            return None
        head = _shared(probe, upto)
        tail = _shared(probe[head:][::-1], upto[head:][::-1])
        return head, len(upto) - tail

    def render(self, conv: Conversation, videos: VideoTexts = None) -> Rendering:
        """The conversation's text (the chat template's rendering, or without one the contents one line each),
        the spans that train (`Rendering`) and where its placeholders stood, cut out of the text. `videos`: per
        `<video>` (text order), the text before each of its items' rows (`video_texts`): the placeholder stands
        for one mark per item, each after its text and inside the family's wrap; None: one item each."""
        stand_in = self._stand_in
        before, after = self._wraps[VIDEO]
        sound_before, sound_after = self._wraps[AUDIO]
        seen = iter(range(len(conv.videos)))

        def expansion(k: int | None) -> str:
            """The k-th video's text: per item its prefix and wrap, a sounding video's first item holding its
            sound's mark inside the audio wrap too (`GridRule`)."""
            prefixes = videos[k] if videos is not None and k is not None and k < len(videos) else [""]
            sounding = k is not None and k < len(conv.video_sounds) and bool(conv.video_sounds[k])
            if not sounding and videos is None:
                return stand_in[VIDEO]
            first = (sound_before + _MARKS[SOUNDING_VIDEO] + sound_after) if sounding else _MARKS[VIDEO]
            return "".join(p + before + (first if i == 0 else _MARKS[VIDEO]) + after for i, p in enumerate(prefixes))

        def video(content: str) -> str:
            first, *rest = content.split(VIDEO)
            return first + "".join(expansion(next(seen, None)) + piece for piece in rest)

        messages = [(role, video(content.replace(IMAGE, stand_in[IMAGE]).replace(AUDIO, stand_in[AUDIO])))
                    for role, content in conv.messages]  # fmt: skip
        raw, spans = self._raw(messages, conv.tools)
        if not (conv.images or conv.audios or conv.videos):
            return Rendering(raw, spans, [])
        at = [i for i, ch in enumerate(raw) if ch in _PLACEHOLDER_OF]
        marks = [(i - k, _PLACEHOLDER_OF[raw[i]]) for k, i in enumerate(at)]
        text = raw.translate({ord(m): None for m in _PLACEHOLDER_OF})

        def clean(i: int) -> int:
            return i - bisect.bisect_left(at, i)

        return Rendering(text, [(clean(a), clean(b)) for a, b in spans], marks)

    def _encode(self, renderings: list[Rendering]) -> list[list[Any]]:
        """Each rendering's segments' encodings."""
        cuts = [r.segments() for r in renderings]
        flat = self.tokenizer.encode_batch([s for c in cuts for s in c], add_special_tokens=False) if cuts else []
        out, k = [], 0
        for c in cuts:
            out.append(flat[k : k + len(c)])
            k += len(c)
        return out

    def count(self, convs: list[Conversation], videos: list[VideoTexts] | None = None) -> list[int]:
        """Text tokens of each conversation (`videos`: each one's `render` argument)."""
        per = videos if videos is not None else [None] * len(convs)
        renderings = [self.render(c, v) for c, v in zip(convs, per, strict=True)]
        return [sum(len(e.ids) for e in encs) for encs in self._encode(renderings)]

    def tokens(self, conv: Conversation, videos: VideoTexts = None) -> TextTokens:
        """`conv`'s ids, labels and placeholders (a `<video>` of several items: one mark each, `render`). A token is
        trained when it overlaps a trained span (`render`: the template's `{% generation %}` blocks where it has
        them, else the assistant contents through their end-of-turn token), as transformers'
        `return_assistant_tokens_mask` marks tokens: a byte-level BPE token that merges the template's space with
        an answer's first word (`Ġyes` after `ASSISTANT:`) trains."""
        rendering = self.render(conv, videos)
        ids: list[int] = []
        labels: list[int] = []
        marks: list[tuple[int, str]] = []
        starts = [0, *(at for at, _ in rendering.marks)]
        for k, (enc, start) in enumerate(zip(self._encode([rendering])[0], starts, strict=True)):
            if k > 0:
                marks.append((len(ids), rendering.marks[k - 1][1]))
            for tid, (a, b) in zip(enc.ids, enc.offsets, strict=True):
                a, b = a + start, b + start
                trained = any(a < e and s < b for s, e in rendering.spans)
                labels.append(tid if trained else IGNORE)
            ids += enc.ids
        return TextTokens(ids, labels, marks)


def _shared(a: str, b: str) -> int:
    """The length of the prefix `a` and `b` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _token_text(value: object) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken's {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def find_tokenizer(model: ModelSpec, tokenizer: str | None) -> ChatFormat:
    """The model's text format: from `tokenizer` (a file or a directory) or the LLM's HF directory, its
    tokenizer.json, and the chat template and special tokens of its tokenizer_config.json (or chat_template.jinja, or
    a processor's chat_template.json)."""
    where = tokenizer or (model.llm.hf.path if model.llm.hf is not None else None)
    if where is None:
        raise SpecError("--tokenizer", "", "orch's reference model counts text with a tokenizer: pass --tokenizer PATH")
    p = Path(where)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise SpecError(str(file), "", "no tokenizer.json (save one with the model's tokenizer, or pass --tokenizer)")
    config: dict[str, Any] = {}
    config_file = file.parent / "tokenizer_config.json"
    if config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text())
        except json.JSONDecodeError:
            raise SpecError(str(config_file), "", "not valid JSON") from None
        config = loaded if isinstance(loaded, dict) else {}
    template = config.get("chat_template")
    if template is None and (file.parent / "chat_template.jinja").is_file():
        template = (file.parent / "chat_template.jinja").read_text()
    if template is None and (file.parent / "chat_template.json").is_file():  # a processor's (Qwen2-VL's on the hub)
        try:
            template = json.loads((file.parent / "chat_template.json").read_text()).get("chat_template")
        except (json.JSONDecodeError, AttributeError):
            raise SpecError(str(file.parent / "chat_template.json"), "chat_template", "not a JSON object") from None
    return ChatFormat(
        str(file),
        template if isinstance(template, str) else None,
        _token_text(config.get("bos_token")),
        _token_text(config.get("eos_token")),
        placeholder_wraps(model),
    )


@dataclass
class SourceIndex:
    """One data file's index: per sample its lengths and where it is; the bad samples."""

    path: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    untrained: list[str] = field(default_factory=list)  # file:line of samples without an assistant turn
    silent: list[str] = field(default_factory=list)  # `file:line: videos[k]: ...`: a sound dropped, no audio track


def index_source(
    path: str,
    rules: TokenRules,
    counter: TextCounter,
    source: int = 0,
    chunk: int = 512,
    media_root: str | None = None,
    read: Source | None = None,
) -> SourceIndex:
    """One data file's rows (`media_root`: where its media paths are relative to, else the file's folder; `read`:
    its layout and media folder, where a dataset description gives them)."""
    out = SourceIndex(path)
    pending: list[tuple[Conversation, dict[str, list[int]], dict[str, list[tuple[Item, ...]]]]] = []
    memo: dict[tuple[str, str, str], tuple[Item, ...] | str] = {}  # each media file's items, read once per build
    heard: dict[str, tuple[int, int] | str] = {}  # each clip's header, read once per build
    silent: dict[str, tuple[list[int], list[str]]] = {}  # file:line -> videos without an audio track, warnings

    def flush() -> None:
        try:
            videos = [video_texts(rules, c, i) for c, _, i in pending]
            texts: list[int | None] = list(counter.count([c for c, _, _ in pending], videos))
        except ValueError:  # a sample the chat template refuses: each counted alone, that one left out
            texts = [_count_one(counter, c, video_texts(rules, c, i), out.bad) for c, _, i in pending]
        for (conv, media, items), text in zip(pending, texts, strict=True):
            if text is None:
                continue
            enc = {name: sum(n) for name, n in media.items()}
            llm = text + sum(projected_len(n, r.downsample) for r in rules.encoders for n in [enc.get(r.name, 0)])
            row: dict[str, Any] = {"lengths": {**enc, rules.llm: llm}, "where": conv.where, "source": source,
                                   "sample": conv.number}  # fmt: skip
            if any(len(n) > 1 for n in media.values()):  # several images or clips: each one's tokens
                row["media"] = {name: n for name, n in media.items() if n}
            if any(items.values()):  # a grid rule's encoder: each item's grid, placeholder order
                row["items"] = {name: [list(i) for its in v for i in its] for name, v in items.items() if v}
            if any(len(its) != 1 for v in items.values() for its in v):  # a video of several items
                row["placeholder_items"] = {name: [len(its) for its in v] for name, v in items.items() if v}
            if conv.where in silent:  # videos trained without their sound (no audio track): every rank drops it
                row["silent"] = silent[conv.where][0]
                out.silent += silent[conv.where][1]
            out.rows.append(row)
        pending.clear()
        silent.clear()

    for item in read_conversations(path, read, media_root):
        if isinstance(item, BadSample):
            out.bad.append(str(item))
            continue
        heard_of = resolve_sounds(item, rules, heard)
        if isinstance(heard_of, BadSample):
            out.bad.append(str(heard_of))
            continue
        if heard_of[1]:
            kept = heard_of[0].video_sounds
            silent[item.where] = ([k for k, f in enumerate(item.video_sounds) if f and not kept[k]], heard_of[1])
        item = heard_of[0]
        items = encoder_items(item, rules, memo)
        if isinstance(items, BadSample):
            out.bad.append(str(items))
            continue
        enc = encoder_lengths(item, rules, heard)
        if isinstance(enc, BadSample):
            out.bad.append(str(enc))
            continue
        if not item.trained_turns:  # well formed, but nothing to learn: left out, listed apart
            out.untrained.append(item.where)
            continue
        for name, per in items.items():
            enc[name] = [t * h * w for its in per for t, h, w, _ in its]
        pending.append((item, enc, items))
        if len(pending) >= chunk:
            flush()
    if pending:
        flush()
    return out


def _count_one(counter: TextCounter, conv: Conversation, videos: VideoTexts, bad: list[str]) -> int | None:
    """One conversation's text tokens, or None with what is wrong added to `bad`."""
    try:
        return counter.count([conv], [videos])[0]
    except ValueError as exc:
        bad.append(str(BadSample(conv.where, str(exc))))
        return None


def encoder_items(
    conv: Conversation, rules: TokenRules, memo: dict[tuple[str, str, str], tuple[Item, ...] | str] | None = None
) -> dict[str, list[tuple[Item, ...]]] | BadSample:
    """Each grid rule's encoder's items for `conv`, per placeholder (its images and videos in text order) the
    items it becomes (`GridRule`: an image one, a video one or more); a BadSample for a file that cannot be
    read, a size its processor refuses, or a video the model cannot take. `memo` keeps each file's items (or
    what is wrong with it) across the samples of one index build: a file referenced many times has its header
    read once."""
    memo = {} if memo is None else memo
    if conv.videos:
        takers = [r for r in rules.encoders if r.grids is not None and not r.grids.no_video]
        if not takers:
            why = next((r.grids.no_video for r in rules.encoders if r.grids is not None), "")
            why = why or ("its vision encoder takes images only" if any(r.modality == "vision" for r in rules.encoders)
                          else "it has no vision encoder")  # fmt: skip
            return BadSample(conv.where, f"videos: the model takes no video ({why})")
    out: dict[str, list[tuple[Item, ...]]] = {}
    for r in rules.encoders:
        if r.grids is None:
            continue
        items: list[tuple[Item, ...]] = []
        for tag, k, path in conv.visual():
            if (r.name, tag, path) not in memo:
                memo[(r.name, tag, path)] = _item(r.grids, tag, path)
            got = memo[(r.name, tag, path)]
            if isinstance(got, str):
                return BadSample(conv.where, f"{'images' if tag == IMAGE else 'videos'}[{k}]: {path}: {got}")
            items.append(got)
        out[r.name] = items
    return out


def _item(rule: GridRule, tag: str, path: str) -> tuple[Item, ...] | str:
    """An image's or video's items by the rule, or what is wrong with the file."""
    try:
        return (rule.image_item(path),) if tag == IMAGE else tuple(rule.video_items(path))
    except FileNotFoundError:
        return "file not found"
    except ValueError as exc:  # what its processor would refuse, said as the rule says it
        return str(exc)
    except Exception as exc:  # unreadable (OSError, Pillow's DecompressionBombError): never out of the index
        return _unreadable(exc)


def _unreadable(exc: BaseException) -> str:
    """What is wrong with a medium whose header cannot be read, in one line."""
    if type(exc).__name__ == "DecompressionBombError":  # Pillow's: over Image.MAX_IMAGE_PIXELS
        return f"too large to decode ({exc})"
    if isinstance(exc, FileNotFoundError):
        return "file not found"
    why = f": {exc.strerror}" if isinstance(exc, OSError) and exc.strerror else ""
    return f"cannot read ({type(exc).__name__}{why})"


def medium_problem(path: str, kind: str) -> str | None:
    """What is wrong with one image, video or audio file (`kind`), from its header (an image's size and
    Pillow's decompression limit, a clip's format, a video's container), or None."""
    if not os.path.exists(path):
        return "file not found"
    try:
        if kind == "image":
            from PIL import Image

            with Image.open(path):
                pass
        elif kind == "audio":
            got = clip_header(path)
            return got if isinstance(got, str) else None
        else:
            import av

            with av.open(path):  # the container's header
                pass
    except Exception as exc:  # OSError, ValueError, RuntimeError (soundfile), DecompressionBombError
        return _unreadable(exc)
    return None


def video_texts(rules: TokenRules, conv: Conversation, items: dict[str, list[tuple[Item, ...]]]) -> VideoTexts:
    """Per `<video>` of `conv` (text order), the text before each of its items' rows (`GridRule.video_prefix`:
    Qwen3-VL's timestamps) by the rule of the encoder taking videos, from its items per placeholder
    (`encoder_items`, or the index's `placeholder_groups`); None where the sample has no video or no encoder
    takes videos (each `<video>` then one mark). The index counts the text with these, and every rank makes
    the same text from the index's items."""
    if not conv.videos:
        return None
    for r in rules.encoders:
        if r.grids is None or r.grids.no_video or not items.get(r.name):
            continue
        placed = zip(conv.visual(), items[r.name], strict=True)
        return [
            [r.grids.video_prefix(it, j) for j, it in enumerate(its)] for (tag, _, _), its in placed if tag == VIDEO
        ]
    return None


def placeholder_groups(items: list[Item], counts: list[int] | None) -> list[tuple[Item, ...]]:
    """An index row's items of one encoder per placeholder: `counts` items each (its `placeholder_items`), one
    each where the row has none."""
    counts = counts if counts is not None else [1] * len(items)
    out, k = [], 0
    for n in counts:
        out.append(tuple(items[k : k + n]))
        k += n
    return out


def encoder_lengths(
    conv: Conversation, rules: TokenRules, memo: dict[str, tuple[int, int] | str] | None = None
) -> dict[str, list[int]] | BadSample:
    """Each encoder's tokens for `conv`, per image or clip (an audio encoder's clips: `Conversation.clips`, a
    sounding video's sound among them), from the files' headers; a BadSample for a missing or unreadable file (a
    grid rule's encoder: `encoder_items`) or a clip too short for one token of its encoder. `memo` keeps each
    clip's header (or what is wrong with it) across the samples of one index build."""
    for files, modality, key in ((conv.images, "vision", "images"), (conv.audios, "audio", "audios")):
        if files and not any(r.modality == modality for r in rules.encoders):
            return BadSample(conv.where, f"{key}: the model has no {modality} encoder to take them")
    sizes: list[tuple[int, int]] = []
    clips: list[tuple[int, int]] = []  # (samples, rate)
    if conv.images and any(r.modality == "vision" and r.grids is None for r in rules.encoders):
        from PIL import Image

        for i, f in enumerate(conv.images):  # the header: its size, and Pillow's decompression limit
            try:
                with Image.open(f) as im:
                    sizes.append(im.size)
            except Exception as exc:  # OSError, ValueError, DecompressionBombError: the sample skipped, named
                return BadSample(conv.where, f"images[{i}]: {f}: {_unreadable(exc)}")
    else:
        sizes = [(0, 0)] * len(conv.images)
    memo = {} if memo is None else memo
    named = conv.clips() if conv.audios or conv.video_sounds else ()
    for what, f in named:
        if f not in memo:
            memo[f] = clip_header(f)
        got = memo[f]
        if isinstance(got, str):
            return BadSample(conv.where, f"{what}: {f}: {got}")
        clips.append(got)
    out: dict[str, list[int]] = {}
    for r in rules.encoders:
        if r.grids is not None:
            continue  # encoder_items
        if r.modality == "vision":
            out[r.name] = [image_tokens(r, w, h, rules.max_image_tokens) for w, h in sizes]
            continue
        out[r.name] = []
        for (what, f), (n, rate) in zip(named, clips, strict=True):
            try:  # a family's rule may refuse a clip itself (too short for one of its tokens: a ValueError saying so)
                tokens = audio_tokens(r, n, rate)
            except ValueError as exc:
                return BadSample(conv.where, f"{what}: {f}: {exc}")
            if n * MEL_RATE < MEL_HOP * rate or tokens < 1:  # not one log-mel frame, or no token of its encoder
                return BadSample(conv.where, f"{what}: {f}: too short for one chunk of its encoder: {n / rate:.3f} s "
                                             f"({n} samples at {rate} Hz) make no audio token")  # fmt: skip
            out[r.name].append(tokens)
    return out


def clip_header(path: str) -> tuple[int, int] | str:
    """(samples, rate) of a clip from its header (an audio file's, or a container's audio track: runtime/sound.py),
    or what is wrong with it."""
    from orch.runtime.sound import clip_frames

    try:
        return clip_frames(path)
    except ValueError as exc:  # no audio track, a codec that will not decode, no duration: said by clip_frames
        return str(exc)
    except Exception as exc:  # OSError, soundfile's errors: never out of the index
        return _unreadable(exc)


def resolve_sounds(
    conv: Conversation, rules: TokenRules, memo: dict[str, tuple[int, int] | str] | None = None
) -> tuple[Conversation, list[str]] | BadSample:
    """`conv` with the sound of each video whose file has no audio track dropped (its video alone), and one warning
    each (`file:line: videos[k]: PATH: no audio track: its video alone`); a BadSample where a sound is used and the
    model has no audio encoder to take it (runtime/data/audio_in_video.py)."""
    from orch.runtime.data.audio_in_video import KEY
    from orch.runtime.sound import NO_AUDIO_TRACK

    sounding = [k for k, f in enumerate(conv.video_sounds) if f]
    if not sounding:
        return conv, []
    if not any(r.modality == "audio" for r in rules.encoders):
        return BadSample(conv.where, f"videos[{sounding[0]}]: {KEY}: the model has no audio encoder to take its "
                                     "sound (leave the setting off for this model)")  # fmt: skip
    memo = {} if memo is None else memo
    silent, warnings = [], []
    for k in sounding:
        f = conv.video_sounds[k]
        if f not in memo:
            memo[f] = clip_header(f)
        if memo[f] == NO_AUDIO_TRACK and f == conv.videos[k]:
            silent.append(k)
            warnings.append(f"{conv.where}: videos[{k}]: {f}: no audio track: its video alone ({KEY})")
    return conv.without_sound(silent), warnings


@dataclass(frozen=True)
class DataIndex:
    """What `build_index` returns: the manifest the planner reads, the mix, and per source its counts."""

    manifest: str
    samples: int
    sources: tuple[dict[str, Any], ...]  # path, weight, samples, share, bad (file:line: what), untrained
    cached: bool
    strategy: str = "interleave_over"
    replacement: bool = False

    @property
    def bad(self) -> list[str]:
        return [b for s in self.sources for b in s["bad"]]

    @property
    def untrained(self) -> list[str]:
        return [u for s in self.sources for u in s.get("untrained", [])]

    @property
    def silent(self) -> list[str]:
        """Videos trained without their sound under `use_audio_in_video` (no audio track), one warning each."""
        return [u for s in self.sources for u in s.get("silent", [])]

    def mix(self) -> Any:
        """The run's draws over these sources (runtime/data/mix.py `Mix`)."""
        from orch.runtime.data.mix import Mix

        sizes = tuple(int(s["samples"]) for s in self.sources)
        return Mix(sizes, tuple(float(s["weight"]) for s in self.sources), self.strategy, self.replacement)


def file_key(path: str) -> str:
    """A file as its index is keyed by: where it is, its size and its mtime. The summary keeps each source's, so
    a plan on an index whose data file changed since is refused at launch (runtime/data/freshness.py)."""
    st = Path(path).stat()
    return f"{Path(path).resolve()}:{st.st_size}:{st.st_mtime_ns}"


def user_cache_dir() -> Path:
    """Where indexes go when the data's folder is not writable: $XDG_CACHE_HOME/orch/index (~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "orch" / "index"


def make_index_dir(folder: Path) -> bool:
    """Create `folder` (and its parents) and prove a file can be written in it: False on a read-only mount or a
    folder this user may not write (permission bits do not stop root, so it tries)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST):
            return False
        raise
    return True


def index_places(data: str, index_dir: str | None) -> list[Path]:
    """Where the index of `data` may be, in the order looked in: `index_dir` alone where given; else beside the
    data (`.orch-index/`), then the user's cache."""
    if index_dir is not None:
        return [Path(index_dir).expanduser().resolve()]
    return [Path(data).resolve().parent / INDEX_DIR, user_cache_dir()]


def build_index(
    data: str,
    model: ModelSpec,
    tokenizer: str | None = None,
    max_image_tokens: int = DEFAULT_MAX_IMAGE_TOKENS,
    index_dir: str | None = None,
    media_root: str | None = None,
    use_audio_in_video: bool = False,
) -> DataIndex:
    """Index `data` (a data file or a mix file) for `model`, or reuse the cached index of the same inputs.
    `media_root`: the folder media paths are relative to (else each data file's folder); `index_dir`: where
    the index is kept (else beside the data where writable, else the user's cache: `index_places`);
    `use_audio_in_video`: the setting of sources that name none (`--use-audio-in-video`; a record's own key wins
    over its source's, a source's over this: runtime/data/audio_in_video.py)."""
    from dataclasses import replace

    from orch.runtime.data.mix import read_mix_spec

    sources = [s if s.use_audio_in_video is not None else replace(s, use_audio_in_video=use_audio_in_video)
               for s in read_sources(data)]  # fmt: skip
    mix = read_mix_spec(data)
    if media_root is not None and not Path(media_root).is_dir():
        raise SpecError("--media-root", "", f"{media_root}: not a directory")
    root = str(Path(media_root).resolve()) if media_root is not None else None
    rules = TokenRules.of(model, max_image_tokens)
    chat = find_tokenizer(model, tokenizer)
    digest = hashlib.sha256()
    for part in (
        str(INDEX_VERSION),
        rules.key(),
        file_key(chat.tokenizer_file),
        chat.key(),
        f"{mix.strategy}:{mix.replacement}:{root}",
        *(f"{file_key(s.path)}:{s.key()}" for s in sources),
    ):
        digest.update(part.encode())
    from orch.runtime.data.dataset_info import index_anchor

    anchor = index_anchor(data)  # a dataset description's names: beside the description, named after it
    name = f"{Path(anchor).stem}-{digest.hexdigest()[:16]}"
    places = index_places(anchor, index_dir)
    for folder in places:
        manifest, summary = folder / f"{name}.jsonl", folder / f"{name}.json"
        if manifest.is_file() and summary.is_file():
            meta = json.loads(summary.read_text())
            return DataIndex(str(manifest), meta["samples"], tuple(meta["sources"]), True, mix.strategy,
                             mix.replacement)  # fmt: skip
    folder = next((f for f in places if make_index_dir(f)), None)
    if folder is None:
        where = "--index-dir" if index_dir is not None else " or ".join(str(f) for f in places)
        raise SpecError(str(places[0]) if index_dir is not None else data, "",
                        f"cannot write the index ({where}): pass --index-dir DIR where you can write")  # fmt: skip
    counter = TextCounter(*chat)
    indexed = [index_source(s.path, rules, counter, k, media_root=root, read=s) for k, s in enumerate(sources)]
    rows = [r for i in indexed for r in i.rows]  # every valid row once, source after source
    if not rows:
        wrong = [*(b for i in indexed for b in i.bad[:3]), *(f"{u}: no assistant turn" for i in indexed
                                                             for u in i.untrained[:3])]  # fmt: skip
        raise SpecError(data, "", "no usable sample: " + ("; ".join(wrong) or "empty"))
    from orch.runtime.data.mix import Mix

    shares = Mix(tuple(len(i.rows) for i in indexed), tuple(s.weight for s in sources), mix.strategy,
                 mix.replacement).shares()  # fmt: skip
    meta_sources = tuple(
        dict(
            path=i.path,
            key=file_key(s.path),
            weight=s.weight,
            samples=len(i.rows),
            share=share,
            bad=i.bad,
            untrained=i.untrained,
            silent=i.silent,
            **s.as_json(),
        )
        for i, s, share in zip(indexed, sources, shares, strict=True)
    )
    manifest, summary = folder / f"{name}.jsonl", folder / f"{name}.json"
    write_text_atomic(manifest, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
    meta = {"samples": len(rows), "sources": meta_sources, "max_image_tokens": max_image_tokens,
            "strategy": mix.strategy, "replacement": mix.replacement, "media_root": root}  # fmt: skip
    write_text_atomic(summary, json.dumps(meta, indent=1))
    return DataIndex(str(manifest), len(rows), meta_sources, False, mix.strategy, mix.replacement)
