"""Where a step's global batch comes from: synthetic (runtime/data/synthetic.py) or a user's conversation file.

`BatchSource(model, data, seed).build(step)` returns the batch of a step, a function of (seed, step) alone
either way, so every rank holds the same lengths without communication and a resumed run sees the same
batches. With a data file (`DataSpec.source`, its index as `DataSpec.manifest`):

* sampling: epoch e = step·B // N visits the N indexed samples in a permutation seeded by (seed, e); step k
  takes positions kB .. kB + B - 1 of that sequence (wrapping into the next epoch);
* lengths: each encoder's tokens from the index; the text tokenized on every rank (no media decoded), so the
  loss normaliser (the global batch's trained tokens) is known everywhere before any sample is decoded;
* `sample(i)`: the sample decoded (its images and clips: runtime/data/processing.py) on the rank that asks,
  so a rank loads what the dispatcher gave it. Each image's or clip's rows go where its placeholder stood
  (`ConversationBatch.layout`, runtime/data/expansion.py); labels are HF's aligned labels (-100 where nothing
  is trained), each scored at the position before its token. A sample that no longer parses (its file
  changed since it was indexed) trains on nothing (`skipped`); one whose image or clip is gone or no longer
  decodes is found on the rank that loads it (`failed`, counted per rank, listed in data_problems.jsonl), and
  every rank then masks its labels (one all-reduce a step; its encoder rows are zeros of the indexed shape),
  so no step stops on bad data.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from orch.planner.specs import DataSpec, ModelSpec, projected_len
from orch.runtime.data.batch import BatchLengths, GlobalBatch, Sample, encoder_order, item_map, takes_clips
from orch.runtime.data.decode_cache import DecodeCache
from orch.runtime.data.index import IGNORE, TextTokens
from orch.runtime.data.mix import Mix
from orch.runtime.data.problems import DataProblems
from orch.runtime.data.synthetic import SyntheticBatch
from orch.runtime.sample import SOUNDING_VIDEO, MediaItem, SequenceLayout


class ConversationData:
    """A data file's index and samples, opened once per process (module docstring)."""

    def __init__(self, model: ModelSpec, data: DataSpec, problems: DataProblems | None = None) -> None:
        from orch.runtime.data.conversations import SampleFile
        from orch.runtime.data.index import TextCounter, TokenRules, find_tokenizer

        assert data.manifest is not None and data.source is not None  # DataSpec's validator
        self.model, self.data = model, data
        manifest = Path(data.manifest)
        meta = json.loads(manifest.with_suffix(".json").read_text())
        self.rules = TokenRules.of(model, meta.get("max_image_tokens", 1024))
        self.counter = TextCounter(*find_tokenizer(model, data.tokenizer))
        media_root = meta.get("media_root")
        self.files = [SampleFile.of(s, media_root) for s in meta["sources"]]
        self.problems = problems or DataProblems(None)
        from orch.runtime.data.media import media_processors

        self.processors = media_processors(model)  # each encoder's: its family's, or orch's
        raw = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
        self.rows: list[tuple[int, int]] = [(r["source"], r["sample"]) for r in raw]
        self.lengths: list[dict[str, int]] = [r["lengths"] for r in raw]  # the index's own rows, read once
        self._media: list[dict[str, list[int]] | None] = [r.get("media") for r in raw]
        self._items: list[dict[str, list[list[float]]] | None] = [r.get("items") for r in raw]
        self._groups: list[dict[str, list[int]] | None] = [r.get("placeholder_items") for r in raw]
        self._silent: list[list[int]] = [r.get("silent") or [] for r in raw]  # videos whose sound the index dropped
        self._texts: dict[int, TextTokens | None] = {}
        counts = [0] * len(meta["sources"])
        for source, _ in self.rows:
            counts[source] += 1
        self.mix = Mix(tuple(counts), tuple(float(s.get("weight", 1.0)) for s in meta["sources"]),
                       meta.get("strategy", "interleave_over"), bool(meta.get("replacement", False)))  # fmt: skip

    def __len__(self) -> int:
        return len(self.rows)

    def rows_of_step(self, seed: int, step: int) -> list[int]:
        """The index rows step `step` draws: a data file's epochs, or a mix's draws (runtime/data/mix.py)."""
        return self.mix.rows(seed, step, self.data.global_batch)

    def conversation(self, row: int) -> Any:
        """The row's sample as the index read it: a video without an audio track trained without its sound."""
        from orch.runtime.data.conversations import Conversation

        source, number = self.rows[row]
        got = self.files[source].get(number)
        return got.without_sound(self._silent[row]) if isinstance(got, Conversation) else got

    def text(self, row: int) -> TextTokens | None:
        """The row's tokens, labels and placeholders (None: the sample no longer parses, or no longer has the
        images and videos it was indexed with). A video's text around its items (Qwen3-VL's timestamps) is made
        from the index's items, as the index counted it: no rank opens a video for its text."""
        if row not in self._texts:
            from orch.runtime.data.conversations import BadSample
            from orch.runtime.data.index import placeholder_groups, video_texts

            conv = self.conversation(row)
            got = None
            if not isinstance(conv, BadSample):
                per, groups = self._items[row] or {}, self._groups[row] or {}
                items = {e: placeholder_groups([(int(t), int(h), int(w), float(s)) for t, h, w, s in v], groups.get(e))
                         for e, v in per.items()}  # fmt: skip
                try:
                    got = self.counter.tokens(conv, video_texts(self.rules, conv, items))
                except ValueError:  # its placeholders no longer match the indexed items (the file changed)
                    got = None
            self._texts[row] = got
        return self._texts[row]

    def media(self, row: int) -> dict[str, list[int]]:
        """Each encoder's tokens per image or clip of the row (the index's)."""
        per = self._media[row] or {}
        lengths = self.lengths[row]
        return {e: per.get(e) or ([int(lengths[e])] if lengths.get(e) else []) for e in encoder_order(self.model)}

    def clip_rows(self, row: int, encoder: str, tokens: int) -> list[int]:
        """Each clip's input rows of the row for a windowed audio tower (`takes_clips`) of `tokens` encoder tokens
        in all: its tokens' frames, and its family's context rows (runtime/models/qwen2_audio/media.py) where the
        clip rule has them; from the index's tokens per clip, so every rank knows them without a file read."""
        rule = next(r for r in self.rules.encoders if r.name == encoder)
        per = (self._media[row] or {}).get(encoder) or ([tokens] if tokens else [])
        context = getattr(rule.clips, "context_rows", 0)
        return [n * rule.frames_per_token + context for n in per]

    def items(self, row: int) -> dict[str, list[MediaItem]]:
        """Each encoder's images and videos of the row as a native-resolution tower takes them (the index's
        `items`: patch grid and seconds per temporal step, in placeholder order; a video with its own audio
        carrying its `Sound`: runtime/data/expansion.py `with_sounds`); [] for an encoder without (a fixed-size
        tower, audio, a sample without media)."""
        per = self._items[row] or {}
        out = {
            e: [MediaItem((int(t), int(h), int(w)), float(s)) for t, h, w, s in per.get(e, [])]
            for e in encoder_order(self.model)
        }
        text = self.text(row)
        if text is not None and any(tag == SOUNDING_VIDEO for _, tag in text.marks):
            from orch.runtime.data.expansion import with_sounds

            out = with_sounds(self.model, text.marks, self.media(row), out)
        return out

    def decode(self, row: int, encoders: tuple[str, ...], step: int = -1) -> dict[str, torch.Tensor] | None:
        """The row's inputs for `encoders` (its images' and clips' rows), None when the sample or a file of it
        cannot be read now (the file is named in the run's data_problems.jsonl)."""
        from orch.runtime.data.conversations import BadSample
        from orch.runtime.data.processing import encoder_inputs

        conv = self.conversation(row)
        if self.text(row) is None or isinstance(conv, BadSample):
            return None
        try:
            return encoder_inputs(conv, self.model, self.rules, encoders, self.processors)[0]
        except Exception as exc:  # OSError, ValueError, Pillow's DecompressionBombError: never the end of a run
            files = dict.fromkeys((*conv.images, *conv.videos, *(f for _, f in conv.clips())))  # a sound's too
            medium = getattr(exc, "filename", None) or ", ".join(files)
            self.problems.add(conv.where, str(medium), f"{type(exc).__name__}: {exc}", step, "masked")
            return None

    def batch(self, seed: int, step: int) -> ConversationBatch:
        rows = self.rows_of_step(seed, step)
        encs = encoder_order(self.model)
        enc_tokens, text_tokens, trained, skipped, truncated = [], [], [], [], 0
        for i, row in enumerate(rows):
            lengths = self.lengths[row]
            enc = {e: self.model.modules[e].round_length(int(lengths.get(e, 0))) for e in encs}
            prefix = sum(projected_len(n, self.model.modules[e].downsample) for e, n in enc.items())
            text = self.text(row)
            room = max(1, self.data.seq_len - prefix)
            # A medium gone or broken since indexing is found where the sample is decoded, and every rank then
            # masks the sample (ConversationBatch.without): no rank stats or re-reads the whole batch's media,
            # which at thousands of ranks would be millions of metadata calls a step on a shared file system.
            if text is None:  # one untrained token, no encoder rows, on every rank
                enc = dict.fromkeys(encs, 0)
                n, t = 1, 0
                skipped.append(i)
            else:
                n = max(1, min(len(text.ids), room))
                truncated += len(text.ids) > room
                # a label is scored at the row before its token: the sequence's first row has none
                leads = bool(text.labels) and text.labels[0] != IGNORE and not any(o == 0 for o, _ in text.marks)
                t = sum(1 for y in text.labels[:n] if y != IGNORE) - leads
            enc_tokens.append(enc)
            text_tokens.append(n)
            trained.append(t)
        pairs = zip(rows, enc_tokens, strict=True)
        inputs = tuple({e: self.input_rows(row, e, enc[e]) for e in enc} for row, enc in pairs)
        return ConversationBatch(
            self.model, seed, step, tuple(enc_tokens), tuple(text_tokens), source=self, rows=tuple(rows),
            trained=tuple(trained), skipped=tuple(skipped), truncated=truncated,
            decoded=DecodeCache(self.model, inputs, empty=tuple(skipped)),
        )  # fmt: skip

    def input_rows(self, row: int, encoder: str, tokens: int) -> int:
        """The row's input rows for `encoder` of `tokens` encoder tokens (`GlobalBatch.input_rows`)."""
        if takes_clips(self.model, encoder):
            return sum(self.clip_rows(row, encoder, tokens))
        return tokens * self.model.modality(encoder).frames_per_token


@dataclass(frozen=True)
class ConversationBatch(BatchLengths):
    """A step's samples from a data file: lengths known everywhere, media decoded where asked (`sample`).

    Implements `GlobalBatch` (runtime/data/batch.py). Its decoded media live in `decoded`, the step's
    `DecodeCache` on this rank, handed in when the batch is built: the prefetch thread fills it ahead of the
    step (runtime/data/prefetch.py), `sample` reads through it and decodes what is still missing."""

    source: ConversationData
    rows: tuple[int, ...]
    trained: tuple[int, ...]  # per sample, its text positions with a target
    skipped: tuple[int, ...]  # samples (ids in the batch) that no longer parse
    truncated: int  # samples cut to seq_len
    decoded: DecodeCache = field(compare=False, repr=False)
    masked: tuple[int, ...] = ()  # samples whose media failed to decode on some rank: labels all ignored

    @property
    def label_tokens(self) -> int:
        return max(1, sum(self.trained))

    def _build_layout(self, sample_id: int) -> SequenceLayout:
        """Each image's or clip's rows where its placeholder stood in the text (runtime/data/expansion.py)."""
        from orch.runtime.data.expansion import conversation_layout

        row = self.rows[sample_id]
        text = self.source.text(row)
        if text is None or sample_id in self.skipped:  # trained on nothing: one text row, no encoder rows
            return SequenceLayout.prefix_first(0, self.text_tokens[sample_id])
        return conversation_layout(self.model, text.marks, self.text_tokens[sample_id], self.source.media(row),
                                   self.source.items(row))  # fmt: skip

    def items(self, encoder: str, sample_id: int) -> tuple[MediaItem, ...]:
        """The sample's images and videos for `encoder` as the index read them from their headers, or its clips
        (a windowed audio tower's: their input rows, `ConversationData.clip_rows`)."""
        if sample_id in self.skipped:
            return ()
        if takes_clips(self.model, encoder):
            rows = self.source.clip_rows(self.rows[sample_id], encoder, self.enc_tokens[sample_id][encoder])
            return tuple(MediaItem((1, 1, n)) for n in rows)
        got = self.source.items(self.rows[sample_id]).get(encoder)
        return tuple(got) if got else super().items(encoder, sample_id)

    def input_rows(self, encoder: str, sample_id: int) -> int:
        """The sample's input rows for `encoder`: a windowed audio tower's its clips' (`items`)."""
        n = self.enc_tokens[sample_id][encoder]
        return self.source.input_rows(self.rows[sample_id], encoder, n) if sample_id not in self.skipped else 0

    def decode(self, wanted: dict[str, list[int]]) -> None:
        """Decode now what `wanted` (encoder -> sample ids) names that the cache does not hold yet."""
        for name, ids in wanted.items():
            for i in ids:
                self._fill(i, (name,))

    def _fill(self, sample_id: int, encoders: tuple[str, ...]) -> None:
        """Decode into the cache the sample's inputs for `encoders` that it does not hold yet."""
        missing = self.decoded.missing(sample_id, encoders)
        if missing:
            self.decoded.put(sample_id, missing, self.source.decode(self.rows[sample_id], missing, self.step))

    def without(self, failed: set[int]) -> ConversationBatch:
        """This batch with the `failed` samples (a medium that passed the header check but did not decode, on
        whichever rank loads it) training nothing: every label ignored and their tokens out of the loss
        normaliser. Lengths stay as they are, so the step's tables and collectives stand; their encoder rows
        are the zeros of the indexed shape, which no label reaches."""
        if not failed:
            return self
        trained = tuple(0 if i in failed else t for i, t in enumerate(self.trained))
        return dataclasses.replace(self, trained=trained, masked=tuple(sorted(failed)))

    def data_counts(self) -> dict[str, int]:
        """This step's data outcomes on this rank: samples, skipped (no longer parse), truncated, failed
        (media unreadable where this rank decoded them), decoded (the (sample, encoder) inputs it built)."""
        return {"samples": self.size, "skipped": len(self.skipped), "truncated": self.truncated,
                **self.decoded.counts()}  # fmt: skip

    def sample(
        self,
        sample_id: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        encoders: tuple[str, ...] | None = None,
    ) -> Sample:
        src, row = self.source, self.rows[sample_id]
        n = self.text_tokens[sample_id]
        text = src.text(row)
        wanted = tuple(encoder_order(self.model)) if encoders is None else encoders
        self._fill(sample_id, wanted)
        if text is None or sample_id in self.skipped:
            ids, targets = [0] * n, [IGNORE] * n
        else:
            ids, targets = text.ids[:n], text.labels[:n] if sample_id not in self.masked else [IGNORE] * n
        return Sample(
            sample_id,
            {e: self.decoded.get(sample_id, e).to(device, dtype) for e in wanted},
            torch.tensor(ids, dtype=torch.int64, device=device),
            torch.tensor(targets, dtype=torch.int64, device=device),
            item_map(self, sample_id, wanted),
        )


class BatchSource:
    """The batches of a run: `build(step)`; synthetic unless the data spec names a conversation source."""

    def __init__(self, model: ModelSpec, data: DataSpec, seed: int, problems: DataProblems | None = None) -> None:
        self.model, self.data, self.seed = model, data, seed
        self.files = ConversationData(model, data, problems) if data.source is not None else None

    def build(self, step: int) -> GlobalBatch:
        if self.files is not None:
            return self.files.batch(self.seed, step)
        return SyntheticBatch.build(self.model, self.data, self.seed, step)
