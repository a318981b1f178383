"""Synthetic multimodal data: the global batch of step k is a function of (seed, k) alone.

Lengths come from `planner.data.sample_lengths` (the same distribution the planner costs),
features from a generator seeded by (seed, step, sample id), so any rank can build any
sample without communication and every plan sees the same batch.

LLM sequence of a sample: the projected tokens of each encoder (`encoder_order`: by name), then text
tokens (`SyntheticBatch.layout`: prefix first), so that the total is the sample's LLM length (capped at
seq_len); text has at least one token. The loss is on text tokens only; labels are synthetic token ids.
`SyntheticBatch` implements runtime/data/batch.py's `GlobalBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from orch.planner.data import sample_lengths
from orch.planner.specs import DataSpec, ModelSpec, projected_len
from orch.runtime.data.batch import BatchLengths, Sample, encoder_order, item_map
from orch.runtime.sample import SequenceLayout
from orch.runtime.seeds import stable_seed


@dataclass(frozen=True)
class SyntheticBatch(BatchLengths):
    """Lengths of every sample of one step (known to all ranks); features built on demand."""

    @classmethod
    def build(cls, model: ModelSpec, data: DataSpec, seed: int, step: int) -> SyntheticBatch:
        lengths = sample_lengths(data, data.global_batch, seed=stable_seed("batch", seed, step))
        encs = encoder_order(model)
        enc_tokens, text_tokens = [], []
        for row in lengths:
            enc = {e: model.modules[e].round_length(int(row.get(e, 0))) for e in encs}
            projected = sum(projected_len(n, model.modules[e].downsample) for e, n in enc.items())
            llm_len = min(int(row.get(model.llm_name, 0)), data.seq_len)
            enc_tokens.append(enc)
            text_tokens.append(max(1, llm_len - projected))
        return cls(model, seed, step, tuple(enc_tokens), tuple(text_tokens))

    @property
    def label_tokens(self) -> int:
        """The loss normaliser: label tokens of the whole global batch, whatever the layout."""
        return sum(self.text_tokens)

    def _build_layout(self, sample_id: int) -> SequenceLayout:
        """Synthetic samples put the prefix first and score every text position."""
        prefix = sum(self.projected(e, sample_id) for e in encoder_order(self.model))
        return SequenceLayout.prefix_first(prefix, self.text_tokens[sample_id])

    @cached_property
    def _frames_per_token(self) -> dict[str, int]:
        return {e: self.model.modality(e).frames_per_token for e in encoder_order(self.model)}

    def sample(
        self,
        sample_id: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        encoders: tuple[str, ...] | None = None,
    ) -> Sample:
        """Sample `sample_id`'s tensors on `device`: drawn on the CPU from its seed (the same numbers on
        every device and layout), then moved. `encoders`: the ones whose inputs the caller needs (a data
        file's source decodes only those; synthetic draws are cheap and drawn in full)."""
        gen = torch.Generator().manual_seed(stable_seed("sample", self.seed, self.step, sample_id))
        feats = {}
        for e in encoder_order(self.model):
            spec = self.model.modules[e]
            frames = self.enc_tokens[sample_id][e] * self._frames_per_token[e]
            feats[e] = torch.randn(frames, spec.input_dim or 1, generator=gen, dtype=torch.float64).to(device, dtype)
        vocab = self.model.llm.vocab or 1
        n = self.text_tokens[sample_id]
        text = torch.randint(0, vocab, (n,), generator=gen)
        labels = torch.randint(0, vocab, (n,), generator=gen)
        return Sample(sample_id, feats, text.to(device), labels.to(device), item_map(self, sample_id, list(feats)))


__all__ = ["SyntheticBatch"]
