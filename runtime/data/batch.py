"""What a step trains on: a global batch's contract, its samples, and where each sample starts.

`GlobalBatch` is what the orchestrator, the input router, the schedules and the trainer read of step k's
batch: every sample's lengths per module (known to all ranks without communication), the loss normaliser,
each sample's `SequenceLayout`, and its tensors built on the rank that asks (`sample`). Two classes
implement it: `SyntheticBatch` (runtime/data/synthetic.py: drawn from the seed) and `ConversationBatch`
(runtime/data/source.py: a user's data file, media decoded where the dispatcher puts them).

Encoders are ordered by name (`encoder_order`); sample i starts on DP index i % dp of every module
(`initial_dp_index`: round-robin, so every DP rank gets a share whatever the ratio).

Torch-free at import (the profile's case list reads `encoder_order` before any torch is loaded).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from orch.runtime.sample import MediaItem, grid_items

if TYPE_CHECKING:
    import torch

    from orch.planner.specs import ModelSpec
    from orch.runtime.sample import SequenceLayout


def encoder_order(model: ModelSpec) -> list[str]:
    """Encoders by name: the order of their tokens in an LLM sequence and of their random draws.

    Not the spec's dict order: a YAML round trip may sort keys (yaml.safe_dump does), and the
    batch and the model must not change with it.
    """
    return sorted(model.encoder_names)


def initial_dp_index(sample_id: int, dp: int) -> int:
    return sample_id % dp


def takes_grids(model: ModelSpec, name: str) -> bool:
    """Whether encoder `name` is a native-resolution tower (`ModuleSpec.item_attention`: images of any size,
    attending within each): it takes each sample's media grids (`MediaItem`s) with its rows."""
    return model.modules[name].item_attention


def takes_clips(model: ModelSpec, name: str) -> bool:
    """Whether encoder `name` is a windowed audio tower (`ModuleSpec.clip_tokens`: each clip attends within
    itself): it takes each sample's clips (`MediaItem`s of their input rows) with its rows."""
    from orch.planner.specs import Modality

    return model.modality(name) == Modality.AUDIO and model.modules[name].clip_tokens is not None


def item_map(
    batch: GlobalBatch, sample_id: int, encoders: tuple[str, ...] | list[str]
) -> dict[str, tuple[MediaItem, ...]]:
    """The sample's media grids or clips of those `encoders` that take them (`takes_grids`, `takes_clips`)."""
    model = batch.model  # type: ignore[attr-defined]
    return {e: batch.items(e, sample_id) for e in encoders if takes_grids(model, e) or takes_clips(model, e)}


@dataclass(frozen=True)
class EncoderItem:
    """A unit of a sample's encoder work its tower never attends across: an image, a contiguous run of a video's
    temporal patch groups, or the sample whole (a tower whose items orch does not know: audio, text towers).
    `rows`: its input rows (contiguous in the sample's, in order), `tokens`: its encoder tokens, `projected`: the
    LLM rows it becomes, `media`: the grids or clips the tower takes with it."""

    rows: int
    tokens: int
    projected: int
    media: tuple[MediaItem, ...] = ()


def _video_runs(item: MediaItem) -> list[MediaItem]:
    """A video's grid cut along time into contiguous runs (planner/balance/items.py `temporal_runs`; an image, or
    one step: itself)."""
    from orch.planner.balance.items import temporal_runs

    t, h, w = item.grid
    return [item] if t <= 1 else [MediaItem((n, h, w), item.seconds) for n in temporal_runs(t)]


def encoder_items(batch: GlobalBatch, encoder: str, sample_id: int) -> tuple[EncoderItem, ...]:
    """The sample's items for `encoder`, in the order of its rows (none without tokens): a native-resolution
    tower's images and runs of its videos' temporal patch groups (`takes_grids`: attention inside one frame
    group), a Hugging Face fixed-size tower's images (`image_tokens`: LLaVA's, attending inside one image; orch's
    own modules attend over the whole sample), else the sample whole. The items' projected rows sum
    to the sample's (else the sample is one item)."""
    from orch.planner.specs import projected_len

    tokens = batch.enc_tokens[sample_id][encoder]
    if tokens == 0:
        return ()
    model = batch.model
    spec, fpt = model.modules[encoder], model.modality(encoder).frames_per_token
    media = batch.items(encoder, sample_id) if takes_grids(model, encoder) or takes_clips(model, encoder) else ()
    whole = (EncoderItem(batch.input_rows(encoder, sample_id), tokens, batch.projected(encoder, sample_id), media),)
    if takes_grids(model, encoder):
        grids = [run for it in batch.items(encoder, sample_id) for run in _video_runs(it)]
        items = tuple(EncoderItem(g.patches * fpt, g.patches, projected_len(g.patches, spec.downsample), (g,))
                      for g in grids)  # fmt: skip
    elif spec.image_tokens and spec.hf is not None and tokens % spec.image_tokens == 0:  # an HF tower: per image
        n = spec.image_tokens
        one = EncoderItem(n * fpt, n, projected_len(n, spec.downsample))
        items = (one,) * (tokens // n)
    else:
        return whole
    if sum(it.projected for it in items) != whole[0].projected or sum(it.rows for it in items) != whole[0].rows:
        return whole
    return items


@dataclass(frozen=True)
class Sample:
    id: int
    feats: dict[str, torch.Tensor]  # encoder name -> input features [frames, input_dim] (frames may be 0)
    text: torch.Tensor  # [text_len] token ids
    labels: torch.Tensor  # [text_len] target ids
    items: dict[str, tuple[MediaItem, ...]] = field(default_factory=dict)  # encoder -> its images' grids


@dataclass(frozen=True)
class BatchLengths:
    """What both batches share: every sample's lengths (known to all ranks), the rows each encoder moves into
    the LLM, and each sample's layout built once per batch by the subclass's `_build_layout`."""

    model: ModelSpec
    seed: int
    step: int
    enc_tokens: tuple[dict[str, int], ...]  # per sample: encoder name -> encoder tokens
    text_tokens: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.text_tokens)

    def projected(self, encoder: str, sample_id: int) -> int:
        """LLM-width tokens this encoder contributes to a sample (rows moved at its boundary)."""
        from orch.planner.specs import projected_len

        return projected_len(self.enc_tokens[sample_id][encoder], self.model.modules[encoder].downsample)

    @cached_property
    def _layouts(self) -> dict[int, SequenceLayout]:
        return {}

    def layout(self, sample_id: int) -> SequenceLayout:
        if sample_id not in self._layouts:
            layout = self._build_layout(sample_id)
            if self._positions is not None:  # the LLM's family positions its rows (Qwen-VL's M-RoPE)
                from dataclasses import replace

                order = [e for e in encoder_order(self.model) if takes_grids(self.model, e)]
                items = tuple(it for e in order for it in self.items(e, sample_id))
                layout = replace(layout, positions=self._positions(layout, items))
            self._layouts[sample_id] = layout
        return self._layouts[sample_id]

    @cached_property
    def _positions(self) -> Callable[[SequenceLayout, tuple[MediaItem, ...]], torch.Tensor] | None:
        """The LLM family's `layout_positions(model)` rule, where its positions are not 0..n-1 (M-RoPE)."""
        from orch.runtime.models.registry import family_of_spec

        family = family_of_spec(self.model.llm)
        return family.layout_positions(self.model) if family is not None else None

    def _build_layout(self, sample_id: int) -> SequenceLayout:
        raise NotImplementedError

    def items(self, encoder: str, sample_id: int) -> tuple[MediaItem, ...]:
        """The sample's images and videos for `encoder` (a native-resolution tower): drawn from its tokens
        (one image, `grid_items`); a data file's batch reads them, and a windowed audio tower's clips, from its
        index. None drawn for an audio tower: its rows are windows of frames, 2 a token, every one real."""
        if takes_clips(self.model, encoder):
            return ()
        spec = self.model.modules[encoder]
        return grid_items(self.enc_tokens[sample_id][encoder], spec.downsample)

    def input_rows(self, encoder: str, sample_id: int) -> int:
        """The sample's input rows for `encoder`: its tokens' frames (`frames_per_token` a token)."""
        return self.enc_tokens[sample_id][encoder] * self.model.modality(encoder).frames_per_token


@runtime_checkable
class GlobalBatch(Protocol):
    """Step `step`'s samples: lengths on every rank, tensors built where asked."""

    @property
    def step(self) -> int: ...

    @property
    def enc_tokens(self) -> tuple[dict[str, int], ...]:
        """Per sample: encoder name -> its encoder tokens."""
        ...

    @property
    def text_tokens(self) -> tuple[int, ...]:
        """Per sample: its text tokens in the LLM sequence."""
        ...

    @property
    def size(self) -> int: ...

    @property
    def label_tokens(self) -> int:
        """The loss normaliser: label tokens of the whole global batch, whatever the layout."""
        ...

    def projected(self, encoder: str, sample_id: int) -> int:
        """LLM-width tokens this encoder contributes to a sample (rows moved at its boundary)."""
        ...

    def layout(self, sample_id: int) -> SequenceLayout:
        """Where the sample's encoder rows and text tokens go in its LLM sequence, and which logits are scored."""
        ...

    @property
    def model(self) -> ModelSpec: ...

    def items(self, encoder: str, sample_id: int) -> tuple[MediaItem, ...]:
        """The sample's images and videos for `encoder`, their grids (a native-resolution tower's input), or
        its clips (a windowed audio tower's)."""
        ...

    def input_rows(self, encoder: str, sample_id: int) -> int:
        """The sample's input rows for `encoder` (`input_dim` wide), known to every rank: its tokens' frames,
        and for a windowed audio tower whose family's clips carry context rows, those (runtime/data/source.py)."""
        ...

    def sample(
        self,
        sample_id: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        encoders: tuple[str, ...] | None = None,
    ) -> Sample:
        """The sample's tensors on `device`, the inputs of `encoders` only (None: every encoder's)."""
        ...


__all__ = ["EncoderItem", "GlobalBatch", "MediaItem", "Sample", "encoder_items", "encoder_order", "initial_dp_index"]
