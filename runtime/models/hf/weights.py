"""A model directory's safetensors, read by the slice each rank holds; or weights made from the seed.

`Checkpoint.of(directory, full)` maps every parameter name of the transformers model `full` (built on
meta from the directory's config) to the file and tensor holding it, renaming the names on disk with
transformers' own conversion mapping (the names `save_pretrained` writes and older checkpoints use
differ from the module tree's). A parameter's local part is read with `safe_open(...).get_slice`: a
TP rank reads its rows or columns, a pipeline stage only its layers, never the whole model.

Without safetensors (a model from config), every parameter is drawn from (seed, module, name) as a
full tensor and sliced the same way, so initialisation is a function of the seed alone, whatever the
plan: normal(0, initializer_range) for matrices and embeddings, ones for norm weights, zeros for biases.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from orch.planner.errors import SpecError
from orch.runtime.parallel.tensor import local_part
from orch.runtime.seeds import stable_seed

INDEX = "model.safetensors.index.json"


def safetensors_files(directory: Path) -> list[Path]:
    """The directory's weight files: those its index names, else every *.safetensors (none: from config)."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SpecError(str(index), "weight_map", f"unreadable index: {exc}") from None
        return sorted({directory / name for name in weight_map.values()})
    return sorted(directory.glob("*.safetensors"))


def header(path: Path) -> dict[str, Any]:
    """A safetensors file's header (tensor name -> dtype, shape, offsets), read without torch."""
    try:
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            meta = json.loads(f.read(size))
    except (OSError, ValueError) as exc:
        raise SpecError(str(path), "", f"not a safetensors file: {exc}") from None
    meta.pop("__metadata__", None)
    return dict(meta)


@dataclass(frozen=True)
class Located:
    file: Path
    key: str  # the tensor's name in that file
    shape: tuple[int, ...]  # as the parameter holds it
    swapped: tuple[int, int] | None = None  # stored with these two dims swapped (Qwen3-VL-MoE's experts on the hub)


def transposes(converter: Any) -> tuple[int, int] | None:
    """The dims a converter swaps when it only transposes where the shapes say so (transformers' `Transpose` with
    check_dims: Qwen3-VL-MoE's stacked experts, stored [experts, in, out] on the hub); None for any other."""
    from transformers.core_model_loading import Transpose

    ops = getattr(converter, "operations", [])
    if len(ops) == 1 and isinstance(ops[0], Transpose) and ops[0].check_dims:
        return (ops[0].dim0, ops[0].dim1)
    return None


def swap(shape: tuple[int, ...], dims: tuple[int, int]) -> tuple[int, ...]:
    out = list(shape)
    out[dims[0]], out[dims[1]] = out[dims[1]], out[dims[0]]
    return tuple(out)


@dataclass(frozen=True)
class Checkpoint:
    """Where each parameter of the transformers model lives on disk."""

    directory: Path
    tensors: dict[str, Located]  # model parameter name -> its tensor on disk

    @classmethod
    def of(cls, directory: str | Path, full: nn.Module) -> Checkpoint | None:
        """None when the directory holds no safetensors; SpecError for names or shapes that do not match."""
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        root = Path(directory)
        files = safetensors_files(root)
        if not files:
            return None
        conversions = get_model_conversion_mapping(full)
        renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
        converters = [c for c in conversions if isinstance(c, WeightConverter)]
        shapes = {k: tuple(v.shape) for k, v in full.state_dict().items()}
        tensors: dict[str, Located] = {}
        for file in files:
            for disk_key, info in header(file).items():
                name, converted = rename_source_key(
                    disk_key, renamings, converters, getattr(full, "base_model_prefix", None), shapes
                )
                dims = None
                if converted is not None:
                    dims = next((transposes(c) for c in converters if converted in c.source_patterns), None)
                    if dims is None:
                        raise SpecError(
                            str(file), disk_key, "a fused or converted tensor: orch reads tensors as stored"
                        )
                if name not in shapes:
                    continue  # a tensor the model does not use (transformers drops these too)
                shape = tuple(int(d) for d in info.get("shape", ()))
                if dims is not None and shape != shapes[name] and swap(shape, dims) == shapes[name]:
                    tensors[name] = Located(file, disk_key, shapes[name], dims)
                    continue
                if shape != shapes[name]:
                    raise SpecError(
                        str(file), disk_key, f"shape {list(shape)} does not match the config's {list(shapes[name])}"
                    )
                tensors[name] = Located(file, disk_key, shape)
        return cls(root, tensors)

    def missing(self, names: list[str]) -> list[str]:
        return [n for n in names if n not in self.tensors]


def local_region(p: torch.Tensor) -> tuple[slice, ...]:
    """The part of the full tensor this rank holds: all of it, or a DTensor's local shard."""
    mesh = getattr(p, "device_mesh", None)
    if mesh is None:
        return tuple(slice(0, n) for n in p.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, mesh, p.placements)  # type: ignore[attr-defined]
    return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def read_region(stored: Any, stored_shape: tuple[int, ...], shape: tuple[int, ...], region: tuple[slice, ...]) -> Any:
    """`region` of a parameter of `shape` from its tensor on disk (`stored`: a safetensors slice), of
    `stored_shape`: the same shape, or the parameter viewing the stored rows by group ([groups, rows, ...] of
    [groups x rows, ...]: a fused qkv held by q, k and v, runtime/models/hf/fused_qkv.py), read group by group."""
    if shape == stored_shape:
        return stored[region]
    groups, rows, rest = shape[0], shape[1], shape[2:]
    if stored_shape != (groups * rows, *rest):
        raise ValueError(f"a parameter of shape {list(shape)} is not a grouping of {list(stored_shape)}")
    picked, within = region[0], region[1]
    parts = [
        stored[(slice(g * rows + within.start, g * rows + within.stop), *region[2:])]
        for g in range(picked.start, picked.stop)
    ]
    return torch.stack(parts)


@torch.no_grad()
def load_parameters(module: nn.Module, keys: dict[str, str], ckpt: Checkpoint) -> None:
    """Fill `module`'s parameters (materialised) with their local slices from the checkpoint."""
    from safetensors import safe_open

    by_file: dict[Path, list[tuple[str, torch.Tensor]]] = {}
    params = {local: p for local, p in module.named_parameters() if local in keys}
    for local, p in params.items():
        located = ckpt.tensors.get(keys[local])
        if located is None:
            raise SpecError(str(ckpt.directory), keys[local], "no such tensor in the model's safetensors")
        by_file.setdefault(located.file, []).append((local, p))
    for file, items in by_file.items():
        with safe_open(str(file), framework="pt") as f:
            for local, p in items:
                located = ckpt.tensors[keys[local]]
                region = local_region(p)
                if located.swapped is not None:  # read the swapped region, then swap it back
                    a, b = located.swapped
                    stored = f.get_slice(located.key)[swap(region, located.swapped)]  # type: ignore[arg-type]
                    part = stored.transpose(a, b)
                else:
                    part = read_region(f.get_slice(located.key), located.shape, tuple(p.shape), region)
                target = local_part(p)
                target.copy_(part.to(dtype=target.dtype))


@torch.no_grad()
def init_parameters(module: nn.Module, name: str, seed: int, std: float, only: set[str] | None = None) -> None:
    """Fill `module`'s parameters (materialised; `only` these names) with their local slices of full tensors
    drawn from the seed."""
    norms = {id(m) for m in module.modules() if isinstance(m, nn.LayerNorm) or "Norm" in type(m).__name__}
    owner = {id(p): m for m in module.modules() for p in m.parameters(recurse=False)}
    for pname, p in module.named_parameters():
        if only is not None and pname not in only:
            continue
        gen = torch.Generator().manual_seed(stable_seed(seed, name, pname))
        leaf = pname.rsplit(".", 1)[-1]
        if leaf == "bias":
            full = torch.zeros(p.shape, dtype=torch.float64)
        elif id(owner.get(id(p))) in norms and leaf == "weight":
            full = torch.ones(p.shape, dtype=torch.float64)
        else:
            full = torch.randn(p.shape, generator=gen, dtype=torch.float64) * std
        target = local_part(p)
        target.copy_(full[local_region(p)].to(target.dtype))
