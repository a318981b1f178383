"""What every wrapped Hugging Face module shares: its parameters' names in the transformers model, its
weights' source, its TP plan, and `materialize` (allocate and fill this rank's share once TP has sharded it on meta)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from orch.runtime.models.hf.meta import materialize
from orch.runtime.models.hf.weights import Checkpoint, init_parameters, load_parameters

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


class HFModule(nn.Module):
    """Subclasses set their children from a transformers model built on meta and call `bind` after."""

    hf_keys: dict[str, str]  # local parameter name -> its name in the transformers model (and the checkpoint)
    checkpoint: Checkpoint | None
    init_std: float

    def bind(self, full: nn.Module, checkpoint: Checkpoint | None, init_std: float) -> None:
        """Record each parameter's name in `full` (by identity: a tied weight takes its first name)."""
        names: dict[int, str] = {}
        for key, p in full.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), key)
        self.hf_keys = {local: names[id(p)] for local, p in self.named_parameters() if id(p) in names}
        self.checkpoint, self.init_std = checkpoint, init_std

    @property
    def own_names(self) -> set[str]:
        """Parameters orch adds to the HF model (a composed spec's projector): drawn from the seed, exported apart."""
        return {local for local, _ in self.named_parameters() if local not in self.hf_keys}

    def tp_plan(self) -> dict[str, ParallelStyle]:
        raise NotImplementedError

    def layer_stack(self) -> nn.Module:
        """The container of the module's transformer layers (a ModuleList, or a ModuleDict by layer index)."""
        raise NotImplementedError

    def keep_first_layers(self, keep: int) -> None:
        """Drop every layer after the first `keep` (orch profile times one real layer of the model)."""
        layers = self.layer_stack()
        if isinstance(layers, nn.ModuleDict):
            for key in list(layers)[keep:]:
                del layers[key]
        else:
            del layers[keep:]  # type: ignore[operator]

    def after_tp(self, tp: int) -> None:
        """Adjust what a family reads from its config but TP changes (a head count used in a reshape)."""

    def materialize(self, device: torch.device, seed: int, name: str) -> None:
        """Allocate this rank's share (sharded by TP already, on meta until here) on `device` and fill it: read
        from the safetensors, or drawn from the seed (and orch's own parts, a composed spec's projector)."""
        materialize(self, device)
        if self.checkpoint is not None:
            load_parameters(self, self.hf_keys, self.checkpoint)
            init_parameters(self, name, seed, self.init_std, only=self.own_names)
        else:
            init_parameters(self, name, seed, self.init_std)


def layer_plan(
    at: str, attn_out: tuple[str, ...], mlp_in: tuple[str, ...], mlp_out: tuple[str, ...]
) -> dict[str, ParallelStyle]:
    """Megatron's TP plan of one HF transformer layer under `at`: q/k/v and the MLP's input projections
    colwise, the attention's output and the MLP's last projection rowwise (names relative to the layer)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    colwise = (*(f"self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")), *mlp_in)
    plan: dict[str, ParallelStyle] = {f"{at}.{name}": ColwiseParallel() for name in colwise}
    return plan | {f"{at}.{name}": RowwiseParallel() for name in (*attn_out, *mlp_out)}
