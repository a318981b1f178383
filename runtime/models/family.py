"""What a model family gives orch: one class per family folder (runtime/models/<family>/family.py), registered
by model_type in runtime/models/registry.py; docs/model_families.md.

Torch-free at import (the planner's reading and the index's counting go through it): a method that needs torch or
transformers imports them inside. The planner's side (`read`, `read_source`) is the `ConfigReader` of
planner/model_dir.py, which the registry is handed to; the runtime's side is the rest. `Family` holds what most
families share; a family overrides what it does differently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orch.planner.errors import SpecError
from orch.planner.hf_config import HFConfig
from orch.planner.model_dir import Role
from orch.planner.specs import Modality, ModelSpec, ModuleSpec

if TYPE_CHECKING:
    import torch
    from torch import nn

    from orch.runtime.models.hf.module import HFModule
    from orch.runtime.sample import ClipRule, GridRule, MediaItem, MediaProcessor, SequenceLayout

Positions = Callable[["SequenceLayout", "tuple[MediaItem, ...]"], "torch.Tensor"]


class Family:
    """A model family: one `model_type` of config.json, the transformers class holding every part orch takes
    from such a directory, and its `role` (a whole model, a language model, or a composed spec's tower)."""

    def __init__(self, model_type: str, transformers_class: str, role: Role) -> None:
        self.model_type, self.transformers_class, self.role = model_type, transformers_class, role

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model_type!r})"

    # --- the planner's side (planner/model_dir.py `ConfigReader`): config.json -> specs, without torch

    def read(self, top: HFConfig, path: str) -> dict[str, ModuleSpec]:
        """A whole directory's modules, each naming its `hf` part (a MODEL or LLM family)."""
        raise SpecError(top.source, "model_type", f"'{self.model_type}' is a tower: name it in a composed spec")

    def read_source(
        self, top: HFConfig, directory: str, ref: dict[str, Any], rest: dict[str, Any], where: str, source: str
    ) -> ModuleSpec:
        """A composed spec's module taken from this directory (a TOWER or LLM family); `rest`: the entry's other
        fields, from which the family takes out those it reads itself."""
        raise SpecError(source, f"{where}.hf", f"a {self.model_type} model is not a composed spec's source")

    # --- the runtime's side

    @property
    def attends_with_orch(self) -> bool:
        """The language model attends with orch's varlen attention; a bare tower keeps its own (whole images,
        padded clips: no packed sequences cross it)."""
        return self.role != Role.TOWER

    def wrap(self, full: nn.Module, spec: ModuleSpec, llm_hidden: int) -> HFModule:
        """The part `spec` takes of `full` (the directory's `transformers_class`, built on meta by runtime/models/hf/
        build.py), as a module implementing the contract (runtime/models/contract.py). `orch export` writes a
        checkpoint back through the same model and the wrapped modules' `hf_keys`."""
        raise NotImplementedError(f"{self!r} wraps no module")

    def media_processor(self, spec: ModuleSpec, modality: Modality) -> MediaProcessor:
        """An encoder's input rows from its media files, as the family's own processor makes them."""
        raise NotImplementedError(f"{self!r} has no encoder")

    def token_rule(self, spec: ModuleSpec, modality: Modality) -> GridRule | ClipRule | None:
        """How the index counts an encoder's tokens from file headers and the text around a placeholder's rows:
        a `GridRule` (native resolution), a `ClipRule` (audio), or None for the common rule (fixed tokens per
        image, tokens per clip by duration, one placeholder's rows where it stood)."""
        return None

    def layout_positions(self, model: ModelSpec) -> Positions | None:
        """Each sample's rotary positions from its layout and media items (M-RoPE); None: 1-D, 0..n-1."""
        return None
