"""What every decoder-only LLM of orch shares, whoever wrote its layers (orch's reference `LLM`, transformers'
decoders in runtime/models/decoder/): three pieces so a pipeline stage runs only its share, `embed_inputs`
(first stage), `run_blocks` (every stage, its layers; the subclass's), `text_logits` (last stage), and
`keep_stage`. A subclass names its parts (`PARTS`: embedding, layer dict, final norm, head), so parameter
names stay its own ("blocks.3..." for orch's, transformers' "layers.3..."), in the full model and in a stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from orch.runtime.models.contract import run_llm_blocks
from orch.runtime.sample import SequenceLayout, layouts_or_prefix_first, score_rows

if TYPE_CHECKING:
    from orch.runtime.parallel.context import CPShard


class StagedDecoder(nn.Module):
    PARTS: ClassVar[tuple[str, str, str, str]]  # attribute names: embedding, layers (a ModuleDict), norm, head

    def keep_stage(self, stage: int, stages: int) -> None:
        """Drop what pipeline stage `stage` of `stages` does not run (after init: names are kept)."""
        embed, layers, norm, head = self.PARTS
        container = getattr(self, layers)
        keep = stage_layers(len(container), stages, stage)
        for key in [k for k in container if int(k) not in keep]:
            del container[key]
        if stage != 0:
            setattr(self, embed, None)
        if stage != stages - 1:
            setattr(self, norm, None)
            setattr(self, head, None)

    def embed_inputs(
        self,
        prefixes: list[torch.Tensor],
        texts: list[torch.Tensor],
        cp: CPShard | None = None,
        layouts: list[SequenceLayout] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """Per sample its encoder rows (prefix) and embedded text tokens where its layout puts them (default:
        the prefix first), packed; and the sequence lengths. With `cp`: only this CP rank's positions and their
        per-sample counts (CPShard.llm_input)."""
        return embed_packed(self.embedding(), prefixes, texts, cp, layouts)

    def embedding(self) -> nn.Module:
        """What embeds text ids on the first stage (a subclass may widen its rows: Qwen3-VL's deepstack)."""
        embed = getattr(self, self.PARTS[0])
        if embed is None:
            raise RuntimeError("embed_inputs runs on the first pipeline stage")
        return embed  # type: ignore[no-any-return]

    def run_blocks(self, x_TD: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        raise NotImplementedError

    def text_logits(
        self, x_TD: torch.Tensor, seqlens: list[int], layouts: list[SequenceLayout], cp: CPShard | None = None
    ) -> torch.Tensor:
        """Logits of the scored positions (each sample's layout says which; under CP, this rank's), packed."""
        norm, head = getattr(self, self.PARTS[2]), getattr(self, self.PARTS[3])
        if norm is None or head is None:
            raise RuntimeError("text_logits runs on the last pipeline stage")
        rows = cp.score_rows(layouts) if cp is not None else score_rows(seqlens, layouts, x_TD.device)
        return head(norm(x_TD[rows]))  # type: ignore[no-any-return]

    def forward(
        self,
        prefixes: list[torch.Tensor],
        texts: list[torch.Tensor],
        cp: CPShard | None = None,
        layouts: list[SequenceLayout] | None = None,
    ) -> torch.Tensor:
        """Per sample: encoder tokens and text tokens (as `layouts` place them; default the prefix first).
        Returns the logits of the scored positions, packed."""
        layouts = layouts_or_prefix_first(layouts, prefixes, texts)
        x_TD, seqlens = self.embed_inputs(prefixes, texts, cp, layouts)
        y_TD = run_llm_blocks(self, x_TD, seqlens, cp, layouts)
        return self.text_logits(y_TD, seqlens, layouts, cp)


def embed_packed(
    embed: nn.Module,
    prefixes: list[torch.Tensor],
    texts: list[torch.Tensor],
    cp: CPShard | None = None,
    layouts: list[SequenceLayout] | None = None,
) -> tuple[torch.Tensor, list[int]]:
    """Per sample its prefix rows and its embedded text where its layout puts them, packed, and the samples'
    lengths (under CP: this rank's positions and counts, CPShard.llm_input). Every LLM's `embed_inputs`."""
    layouts = layouts_or_prefix_first(layouts, prefixes, texts)
    if cp is not None and prefixes:
        return cp.llm_input(prefixes, texts, embed, layouts)
    # One embedding call per micro-batch, whatever its samples (none: an empty micro-batch that EP or resharding
    # ranks still run, zero rows that keep a graph): a resharding FSDP2 unit gathers per call.
    empty = torch.zeros(0, dtype=torch.int64, device=next(embed.parameters()).device)
    embedded = embed(torch.cat(texts) if texts else empty)
    parts, seqlens = [], []
    for prefix, emb, layout in zip(prefixes, embedded.split([t.shape[0] for t in texts]), layouts, strict=True):
        rows = torch.cat([prefix, emb])
        parts.append(rows if layout.source is None else rows[layout.source.to(rows.device)])
        seqlens.append(rows.shape[0])
    return (torch.cat(parts) if parts else embedded), seqlens


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """The layer indices of one pipeline stage: contiguous, as even as possible, earlier stages +1."""
    if not 0 <= stage < stages or stages > layers:
        raise ValueError(f"stage {stage} of {stages} for {layers} layers")
    base, extra = divmod(layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))
