"""What a module kind gives the runtime: the one contract every model family, the reference model and a
user's `--model-factory` modules implement (structurally: these are Protocols, nothing to inherit).

An **encoder** is called on packed variable-length inputs of many samples and returns their tokens in the
LLM's width, packed. The **causal LM** runs in three pieces so a pipeline stage runs only its share:
`embed_inputs` (first stage: encoder rows and text embedded where each sample's `SequenceLayout` puts
them), `run_blocks` (every stage, its layers), `text_logits` (last stage: the scored positions' logits).

Every optional capability is a Protocol of its own below, checked with `isinstance` (nothing is probed by
name): how the runtime parallelises a module (runtime/parallel/parallelize.py) is `TensorParallel` (`tp_plan()`:
tensor parallelism as PyTorch's `parallelize_module` takes it, keys relative to the module), `AdjustsAfterTP`
(`after_tp(tp)`: what a family must adjust once sharded), `NamesBlocks` (`block_units()`: the transformer blocks,
recompute and FSDP units), `Staged` (`keep_stage(stage, stages)`: the LLM's pipeline stage) and, for modules built
on meta, `materialize(device, seed, name)`. What a module takes beyond packed rows: an encoder that is
`TakesItems` is called with each sample's media items (`items=`): grids of a native-resolution tower
(`MergesPatches`, which also says its merge) or clips of an audio tower of windows (each clip's input rows, so
each clip runs on its own; a family's clip may carry rows past its tokens' frames, as Qwen2-Audio's carry the
frames its stem reads past them and the clip's real frame count: `GlobalBatch.input_rows`); an LLM that is
`TakesLayouts` has `run_blocks` called with the micro-batch's layouts (`layouts=`: positions other than 0..n-1).
An encoder that cannot run on zero rows (a tower of whole images, of fixed clips, of patch grids) is
`HasPlaceholder` (`placeholder(width, dtype, device)`: its smallest real input), which a rank with nothing to
encode runs where every rank must call the module's blocks (runtime/train/compute.py `encode`).
A module that is none of these gets the default of `parallelize.py` (TP over orch's reference `Block`s wherever
they occur, blocks found under `layers` / `blocks` containers), no items, no layouts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle

    from orch.runtime.parallel.context import CPShard
    from orch.runtime.sample import MediaItem, SequenceLayout


@runtime_checkable
class Encoder(Protocol):
    """feats_TF: [sum of input rows, input_dim] of the samples, `seqlens` encoder tokens each (input rows over
    frames per token, where its items do not say otherwise); returns
    [sum of projected tokens, output_dim]. Under CP (`cp`) the samples are sharded over the group and the
    result is every projected row, replicated."""

    output_dim: int
    is_audio: bool

    def __call__(self, feats_TF: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor: ...


@runtime_checkable
class CausalLM(Protocol):
    def embed_inputs(
        self,
        prefixes: list[torch.Tensor],
        texts: list[torch.Tensor],
        cp: CPShard | None = None,
        layouts: list[SequenceLayout] | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """Per sample its encoder rows and embedded text as its layout places them, packed; the lengths."""
        ...

    def run_blocks(self, x_TD: torch.Tensor, seqlens: list[int], cp: CPShard | None = None) -> torch.Tensor:
        """This stage's layers over packed rows (`seqlens`: rows per sample, this CP rank's under CP)."""
        ...

    def text_logits(
        self, x_TD: torch.Tensor, seqlens: list[int], layouts: list[SequenceLayout], cp: CPShard | None = None
    ) -> torch.Tensor:
        """Logits of the scored positions, packed."""
        ...


@runtime_checkable
class Staged(Protocol):
    """An LLM that can keep one pipeline stage's share (after initialisation: names are kept)."""

    def keep_stage(self, stage: int, stages: int) -> None: ...


@runtime_checkable
class TensorParallel(Protocol):
    """A module that names its own TP plan (Megatron's: q/k/v and MLP inputs colwise, outputs rowwise)."""

    def tp_plan(self) -> dict[str, ParallelStyle]: ...


@runtime_checkable
class AdjustsAfterTP(Protocol):
    """A module that must adjust what its config says but TP changes once sharded (a head count in a reshape)."""

    def after_tp(self, tp: int) -> None: ...


@runtime_checkable
class NamesBlocks(Protocol):
    """A module that names its transformer blocks (recompute and FSDP units) itself."""

    def block_units(self) -> list[nn.Module]: ...


@runtime_checkable
class TakesItems(Protocol):
    """An encoder called with each sample's media items (`MediaItem`s: grids, or an audio tower's clips)."""

    takes_items: Literal[True]

    def __call__(
        self,
        feats_TF: torch.Tensor,
        seqlens: list[int],
        cp: CPShard | None = None,
        *,
        items: list[tuple[MediaItem, ...]],
    ) -> torch.Tensor: ...


@runtime_checkable
class MergesPatches(TakesItems, Protocol):
    """A native-resolution tower: its items are patch grids, `merge` x `merge` patches one LLM token."""

    merge: int


@runtime_checkable
class HasPlaceholder(Protocol):
    """An encoder that cannot run on zero rows: its smallest real input (one image of its fixed size, one
    shortest clip, one merge window's grid) as the call takes it, `width` values a row: (rows, seqlens, items;
    the items as `TakesItems` takes them, ignored by an encoder that is not). A rank with nothing to encode
    where every DP rank must call every block (a resharding FSDP2 module: its gathers, its gradients'
    reduce-scatters) runs it and drops its rows, so it contributes exact zeros to outputs and gradients."""

    def placeholder(
        self, width: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, list[int], list[tuple[MediaItem, ...]]]: ...


class ExpertExchange(Protocol):
    """Runs a MoE block's rows on their experts wherever those live (runtime/parallel/expert.py: the EP
    all_to_all to the experts' owners and back): rows sorted by expert, `counts_E` rows per expert; returns the
    experts' outputs in the same order."""

    def __call__(self, moe: ExpertBlock, x_ND: torch.Tensor, counts_E: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class ExpertBlock(Protocol):
    """A Mixture-of-Experts MLP whose experts can be split over expert-parallel ranks: orch's reference `MoE` and
    transformers' sparse MoE blocks (runtime/models/hf/moe.py). It routes its tokens itself and sorts their
    (token, choice) rows by expert; `exchange` (None: every expert local) carries them to the experts' owners
    and back. `keep_experts` keeps only an EP rank's contiguous block of `local` experts (before the module is
    materialised or sharded; `mesh`: the EP group as a 1-D DeviceMesh, for experts held as one stacked tensor),
    and `run_experts` runs rows grouped by expert (counts[i] rows for global expert experts[i]) on local experts.
    Its expert parameters are named `...experts...` (`runtime/parallel/expert.py` `is_expert_param`)."""

    num_experts: int
    top_k: int  # experts a token is routed to
    exchange: ExpertExchange | None

    def keep_experts(self, local: list[int], mesh: Any) -> None: ...

    def run_experts(self, x_ND: torch.Tensor, counts: list[int], experts: list[int]) -> torch.Tensor: ...


@runtime_checkable
class RoutesTokens(Protocol):
    """A MoE block that keeps its last forward's router logits ([rows, experts], in the dtype the router gave
    them) for the router's auxiliary loss (runtime/train/aux_loss.py), and clears them when read."""

    def take_router_logits(self) -> torch.Tensor | None: ...


@runtime_checkable
class TakesLayouts(Protocol):
    """An LLM whose positions are not 0..n-1 (Qwen-VL's M-RoPE reads `SequenceLayout.positions`): `run_blocks`
    is called with the micro-batch's layouts."""

    takes_layouts: Literal[True]

    def run_blocks(
        self,
        x_TD: torch.Tensor,
        seqlens: list[int],
        cp: CPShard | None = None,
        layouts: list[SequenceLayout] | None = None,
    ) -> torch.Tensor: ...


def run_llm_blocks(
    llm: CausalLM, x_TD: torch.Tensor, seqlens: list[int], cp: CPShard | None, layouts: list[SequenceLayout]
) -> torch.Tensor:
    """`llm.run_blocks`, given the micro-batch's layouts where the LLM takes them (`TakesLayouts`)."""
    if isinstance(llm, TakesLayouts):
        return llm.run_blocks(x_TD, seqlens, cp, layouts=layouts)
    return llm.run_blocks(x_TD, seqlens, cp)


def encoder_call(
    encoder: Encoder,
    feats_TF: torch.Tensor,
    seqlens: list[int],
    cp: CPShard | None,
    items: list[tuple[MediaItem, ...]],
) -> torch.Tensor:
    """The encoder on packed rows, given each sample's media items where it takes them (`TakesItems`: a
    native-resolution tower, Qwen-VL's; an audio tower of windows, Qwen2-Audio's)."""
    if isinstance(encoder, TakesItems):
        return encoder(feats_TF, seqlens, cp, items=items)
    return encoder(feats_TF, seqlens, cp) if cp is not None else encoder(feats_TF, seqlens)


LLM_METHODS = ("embed_inputs", "run_blocks", "text_logits")


def missing_llm_methods(module: object) -> list[str]:
    """The CausalLM methods `module` lacks (empty when it implements the contract): what a user's factory module
    is told it misses."""
    return [m for m in LLM_METHODS if not callable(getattr(module, m, None))]


BLOCK_CONTAINERS = ("layers", "blocks")  # the attribute names that hold a module's transformer blocks


def block_units(module: object) -> list[nn.Module]:
    """The module's transformer blocks, the units of recompute and FSDP: its own `block_units()` where it names
    them (`NamesBlocks`), else the children of every ModuleList/ModuleDict named `layers` or `blocks`, in order."""
    from torch import nn

    if isinstance(module, NamesBlocks):
        return list(module.block_units())
    assert isinstance(module, nn.Module)
    out: list[nn.Module] = []
    for name, sub in module.named_modules():
        if isinstance(sub, (nn.ModuleList, nn.ModuleDict)) and name.rsplit(".", 1)[-1] in BLOCK_CONTAINERS:
            out.extend(sub.children())
    return out
