"""The math of one step, shared by the single-process reference and every parallel executor.

Only *which* samples a call sees differs between layouts; because the loss is normalised by
the global batch's label tokens (not per rank), summing the per-rank gradients gives the
reference gradient exactly (OrchMLLM; docs/design.md, One primitive).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from orch.runtime.data.batch import Sample
from orch.runtime.models.contract import HasPlaceholder, MergesPatches, TakesItems, encoder_call
from orch.runtime.parallel.context import CPGroup
from orch.runtime.sample import SequenceLayout, grid_items, layouts_or_prefix_first, scored_labels


def encode(
    encoder: nn.Module,
    name: str,
    samples: list[Sample],
    dtype: torch.dtype,
    frames_per_token: int,
    cp: CPGroup | None = None,
    empty_width: int | None = None,
) -> torch.Tensor:
    """Packed projected tokens of `samples` (ascending id order), [sum projected, llm_hidden].

    `frames_per_token`: input rows per encoder token (the module's `ModelSpec.modality(name)`).

    With `cp` the samples are sharded over the CP group in units of the projector's downsample;
    the result is still every projected row (replicated over the group).

    `empty_width`: with no tokens, still run the encoder (a resharding FSDP2 module's DP ranks must all call
    every block: runtime/parallel/fsdp.py): on zero rows of this input width, or, for an encoder that cannot run
    on zero rows (`HasPlaceholder`), on its placeholder input, the rows dropped (the graph stays connected, so
    the backward's reductions happen too; its gradients are exact zeros); None: return the empty result without
    a call.
    """
    feats = [s.feats[name] for s in samples]
    seqlens = [f.shape[0] // frames_per_token for f in feats]
    if sum(seqlens) == 0:
        if empty_width is None:
            # No tokens of this modality here (text-only samples, or no samples): an empty, shape-correct result.
            width = encoder.output_dim  # the contract's (runtime/models/contract.py)
            return torch.zeros(0, width, dtype=dtype, device=_device_of(encoder))
        device = _device_of(encoder)
        if isinstance(encoder, HasPlaceholder):
            rows, lens, placeholder_items = encoder.placeholder(empty_width, dtype, device)
            return encoder_call(encoder, rows, lens, None, placeholder_items)[:0]
        # zero rows through every block: the module's gathers and reductions, no compute
        samples, seqlens, feats = [], [], [torch.zeros(0, empty_width, dtype=dtype, device=device)]
    items = []
    if encoder.is_audio:  # a windowed audio tower: each sample's clips, where it has them
        items = [s.items.get(name, ()) for s in samples]
    elif isinstance(encoder, TakesItems):  # a native-resolution tower: each sample's grids
        d = encoder_downsample(encoder)
        items = [s.items.get(name) or grid_items(n, d) for s, n in zip(samples, seqlens, strict=True)]
    shard = cp.shard(seqlens, unit=encoder.projector.downsample) if cp is not None else None  # type: ignore[union-attr]
    return encoder_call(encoder, torch.cat(feats), seqlens, shard, items)


def encoder_downsample(encoder: nn.Module) -> int:
    """Encoder tokens per LLM token of a native-resolution tower (merge²), for grids drawn from a length."""
    return encoder.merge**2 if isinstance(encoder, MergesPatches) else 1


def join_prefix(rows: list[torch.Tensor], width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A sample's encoder rows, encoder after encoder, as the prefix of its LLM sequence (empty for a text-only
    model: no encoders)."""
    return torch.cat(rows) if rows else torch.zeros(0, width, dtype=dtype, device=device)


def text_loss(
    llm: nn.Module,
    prefixes: list[torch.Tensor],
    samples: list[Sample],
    label_tokens: int,
    cp: CPGroup | None = None,
    layouts: list[SequenceLayout] | None = None,
) -> torch.Tensor:
    """Sum of the samples' scored cross-entropies divided by the GLOBAL label-token count. `layouts`: where
    each sample's rows go and which logits are scored (default: the prefix first, every text position).

    With `cp`: this CP rank's share only (its scored positions); the CP ranks' losses sum to the whole.
    """
    texts = [s.text for s in samples]
    layouts = layouts_or_prefix_first(layouts, prefixes, texts)
    labels = [s.labels for s in samples]
    if cp is not None:
        shard = cp.shard([lay.length for lay in layouts])
        logits = llm(prefixes, texts, shard, layouts)
        mine = shard.scored_labels(labels, layouts)
    else:
        logits = llm(prefixes, texts, None, layouts)
        mine = scored_labels(labels, layouts)
    empty = torch.zeros(0, dtype=torch.int64, device=logits.device)
    return label_loss(logits, torch.cat(mine) if mine else empty, label_tokens)


def _device_of(module: nn.Module) -> torch.device:
    """Where a module computes: its parameters' device (the CPU for a module without parameters)."""
    p = next(module.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def label_loss(logits: torch.Tensor, labels: torch.Tensor, label_tokens: int) -> torch.Tensor:
    """Summed cross-entropy of packed text logits over the global batch's label-token count."""
    return F.cross_entropy(logits, labels, reduction="sum") / label_tokens
